// One job: its record, what it is doing now (analytics: reason and estimate, or sub-state and
// progress), its event timeline, its payload as the API shows it (secrets redacted by the
// database), and cancel / retry behind a confirmation.

import {ApiError} from "./api.js";
import {
  basisEl, debounce, fmtDuration, fmtMoney, fmtRelative, h, isUuid, jobHref, progressBar,
  providerLabel, randomKey, shortId, stateBadge, swap, timeEl,
} from "./dom.js";

const EVENTS_PAGE = 100;

/** A modal confirmation; resolves true when confirmed. Escape or "Keep" resolves false. */
export function confirmDialog(title, text, confirmLabel) {
  return new Promise((resolve) => {
    const keep = h("button", {type: "button", class: "secondary"}, "Keep it");
    const yes = h("button", {type: "button", class: "danger"}, confirmLabel);
    const dialog = h("dialog", {"aria-labelledby": "confirm-title", "aria-describedby": "confirm-text",
      class: "confirm"},
    h("h2", {id: "confirm-title"}, title),
    h("p", {id: "confirm-text"}, text),
    h("div", {class: "actions"}, keep, yes));
    let answered = false;
    const done = (answer) => {
      if (answered) return;
      answered = true;
      dialog.close();
      dialog.remove();
      resolve(answer);
    };
    keep.addEventListener("click", () => done(false));
    yes.addEventListener("click", () => done(true));
    dialog.addEventListener("cancel", () => done(false));
    document.body.append(dialog);
    dialog.showModal();
    keep.focus();
  });
}

function field(label, value) {
  return [h("dt", {}, label), h("dd", {}, value === null || value === undefined || value === ""
    ? h("span", {class: "muted"}, "–") : value)];
}

export function mount(ctx) {
  const {api, main, route, navigate, notice} = ctx;
  const id = route.arg;
  let unmounted = false;
  let job = null;
  let events = [];
  let eventsMore = false;

  if (!isUuid(id)) {
    main.append(h("h1", {tabindex: "-1"}, "No such job"),
      h("p", {}, "That link does not name a job. ", h("a", {href: "#/jobs"}, "Back to my jobs")));
    return {refresh() {}};
  }

  const heading = h("h1", {tabindex: "-1", id: "job-title"}, `Job ${shortId(id)}`);
  const actions = h("div", {class: "actions", id: "job-actions"});
  const result = h("p", {role: "status", id: "job-result", class: "muted"});
  let record = h("section", {"aria-labelledby": "rec-h", class: "card"});
  let now = h("section", {"aria-labelledby": "now-h", class: "card"});
  const timeline = h("ol", {class: "timeline", id: "job-events"});
  const moreButton = h("button", {type: "button", hidden: true, onclick: () => loadEvents(true)},
    "Load more events");
  const payload = h("pre", {class: "payload", id: "job-payload", tabindex: "0"}, "Loading…");

  main.append(
    h("p", {class: "crumbs"}, h("a", {href: "#/jobs"}, "← My jobs")),
    h("div", {class: "view-head"}, heading, actions),
    result,
    h("div", {class: "grid-2"}, record, now),
    h("section", {"aria-labelledby": "ev-h", class: "card"},
      h("h2", {id: "ev-h"}, "Timeline"), timeline, moreButton),
    h("section", {"aria-labelledby": "pl-h", class: "card"},
      h("h2", {id: "pl-h"}, "Payload"),
      h("p", {class: "muted"}, "The body sent to Fireworks, as stored. Values of keys that name ",
        "a secret (API keys, access tokens, passwords, secrets, credentials) are replaced by ",
        "[REDACTED] before they leave the database; token counts such as maxOutputTokens are shown."),
      payload));

  function drawRecord() {
    heading.textContent = job.display_name === null ? `Job ${shortId(job.id)}` : job.display_name;
    const retryOf = job.retry_of && jobHref(job.retry_of);
    record = swap(record, h("section", {"aria-labelledby": "rec-h", class: "card", id: "job-record"},
      h("h2", {id: "rec-h"}, "Record"),
      h("dl", {class: "fields"},
        field("State", stateBadge(job.state)),
        field("Id", h("code", {}, job.id)),
        field("Kind", job.kind),
        field("Name", job.display_name),
        field("GPUs", String(job.gpu_count)),
        field("Created", timeEl(job.created_at)),
        field("Started", timeEl(job.started_at)),
        field("Completed", timeEl(job.completed_at)),
        field("Error", job.error ? h("span", {class: "error-text"}, job.error) : null),
        "failure_class" in job ? field("Failure class", job.failure_class) : null,
        retryOf ? field("Retry of", h("a", {href: retryOf}, shortId(job.retry_of))) : null,
        // Issue 53: the jobs it runs after, its own bound on run time.
        job.after && job.after.length ? field("Runs after", h("span", {id: "job-after"},
          ...job.after.flatMap((id, i) => [i ? ", " : "",
            h("a", {href: jobHref(id)}, shortId(id))]))) : null,
        job.max_run_seconds ? field("Max run", `${job.max_run_seconds} s`) : null,
        field("Fireworks job", job.fireworks_job_name ? h("code", {}, job.fireworks_job_name)
          : null))));
    actions.replaceChildren(...[
      ["QUEUED", "PROGRESS"].includes(job.state)
        ? h("button", {type: "button", class: "danger", id: "cancel-job", onclick: cancel},
          "Cancel job") : null,
      ["FAIL", "CANCELLED"].includes(job.state)
        ? h("button", {type: "button", id: "retry-job", onclick: retry}, "Retry job") : null,
    ].filter(Boolean));
  }

  function drawNow(a) {
    const parts = [h("h2", {id: "now-h"}, "Now")];
    if (a.waiting_reason) {
      parts.push(h("p", {class: "reason", dataset: {code: a.waiting_reason.code}},
        a.waiting_reason.message));
    }
    const list = [];
    if (job.state === "QUEUED") {
      list.push(field("Other users' jobs ahead", a.queue_position === null ? null
        : String(a.queue_position)));
      list.push(field("Estimated start (an estimate)", a.estimated_start_at
        ? h("span", {class: "details"},
          h("span", {}, timeEl(a.estimated_start_at), ` (${fmtRelative(a.estimated_start_at)})`),
          basisEl(a.estimate))
        : h("span", {class: "details"}, "none", basisEl(a.estimate))));
    }
    if (job.state === "PROGRESS" && job.stalled) {
      // Issue 53: no progress at Fireworks for SFTQ_STALL_SECONDS; not cancelled by itself.
      parts.push(h("p", {class: "reason", id: "job-stalled", dataset: {code: "stalled"}},
        "Stalled: its progress at Fireworks has not moved since ", timeEl(job.stalled_since),
        ". It is not cancelled automatically; cancel it if it has crashed."));
    }
    if (job.state === "PROGRESS") {
      list.push(field("Provider state", providerLabel(a.provider_state) || "submitting"));
      list.push(field("Progress", progressBar(a.progress ? a.progress.percent : null,
        "Progress")));
      if (a.progress && a.progress.epoch !== null) list.push(field("Epoch", String(a.progress.epoch)));
      list.push(field("Estimated finish (an estimate)", a.estimated_finish_at
        ? h("span", {class: "details"},
          h("span", {}, timeEl(a.estimated_finish_at), ` (${fmtRelative(a.estimated_finish_at)})`),
          basisEl(a.estimate))
        : null));
    }
    // The whole sentence once more, for who wants the detail behind the few words above.
    if (a.estimate && a.estimate.basis) list.push(field("Estimate basis", a.estimate.basis));
    list.push(field("Queue wait", a.queue_wait_seconds === null ? null
      : fmtDuration(a.queue_wait_seconds)));
    list.push(field("Run time", a.run_duration_seconds === null ? null
      : fmtDuration(a.run_duration_seconds)));
    list.push(field("GPU hours", a.gpu_hours === null ? null : String(a.gpu_hours)));
    if (a.estimated_cost) {
      list.push(field("Estimated cost", h("span", {id: "job-cost"}, fmtMoney(a.estimated_cost),
        h("span", {class: "muted"}, " (Fireworks' estimate)"))));
    }
    parts.push(h("dl", {class: "fields"}, list));
    now = swap(now, h("section", {"aria-labelledby": "now-h", class: "card", id: "job-now"}, parts));
  }

  function drawEvents() {
    timeline.replaceChildren(...events.map((e) => h("li", {dataset: {type: e.type, state: e.state}},
      timeEl(e.created_at),
      h("span", {class: "badge event"}, e.type),
      h("span", {class: "message"}, e.message))));
    moreButton.hidden = !eventsMore;
  }

  async function loadEvents(more) {
    try {
      const after = more && events.length ? events[events.length - 1].id : undefined;
      const page = await api.get(`jobs/${id}/events`, {limit: EVENTS_PAGE, after});
      if (unmounted) return;
      events = more ? events.concat(page.data) : page.data;
      eventsMore = page.has_more;
      drawEvents();
    } catch (err) {
      if (!unmounted && err.status !== 401) {
        timeline.replaceChildren(h("li", {class: "muted"}, `No timeline: ${err.message}`));
      }
    }
  }

  async function load() {
    try {
      const [j, a] = await Promise.all([api.get(`jobs/${id}`), api.get(`jobs/${id}/analytics`)]);
      if (unmounted) return;
      job = j;
      drawRecord();
      drawNow(a);
      document.documentElement.dataset.jobState = job.state;
    } catch (err) {
      if (unmounted || err.status === 401) return;
      if (err.status === 404) {
        heading.textContent = "No such job";
        notice("This job does not exist, or it is not yours.");
      } else {
        notice(`Could not load the job: ${err.message}`);
      }
      return;
    }
    // The timeline grows; keep what was loaded, reading on from the newest event seen.
    if (events.length && !eventsMore) await loadEvents(true);
    else if (!events.length) await loadEvents(false);
  }

  async function loadPayload() {
    try {
      const body = await api.get(`jobs/${id}/payload`);
      if (!unmounted) payload.textContent = JSON.stringify(body.fireworks_payload, null, 2);
    } catch (err) {
      if (!unmounted && err.status !== 401) payload.textContent = `Not available: ${err.message}`;
    }
  }

  async function cancel() {
    const ok = await confirmDialog("Cancel this job?",
      job.state === "PROGRESS"
        ? "It is running: Fireworks is asked to stop it, and the GPUs are freed. This cannot be undone."
        : "It leaves the queue and will not run. This cannot be undone.",
      "Cancel job");
    if (!ok || unmounted) return;
    try {
      const resp = await api.request("DELETE", `jobs/${id}`);
      result.textContent = resp.status === 202
        ? (resp.data.message || "Cancel recorded: the scheduler finishes it at its next tick.")
        : "Cancelled.";
    } catch (err) {
      if (err.status !== 401) result.textContent = `Not cancelled: ${err.message}`;
    }
    load();
  }

  async function retry() {
    const ok = await confirmDialog("Retry this job?",
      "A new job with the same kind, payload, name and GPU count joins the back of the queue.",
      "Retry job");
    if (!ok || unmounted) return;
    try {
      const resp = await api.request("POST", `jobs/${id}/retry`,
        {headers: {"Idempotency-Key": randomKey()}});
      const href = jobHref(resp.data.id);
      if (href) navigate(href);
    } catch (err) {
      if (err.status === 401) return;
      result.textContent = err instanceof ApiError && err.code === "not_found" && job
        ? `Not retried: ${err.message} (this server may not offer retries yet).`
        : `Not retried: ${err.message}`;
    }
  }

  const refresh = debounce(load, 200);
  load().then(() => document.getElementById("job-title")?.focus());
  loadPayload();
  return {
    refresh: load,
    onFrame(frame) {
      const d = frame.data || {};
      if ((frame.event === "status" ? d.id : d.job_id) === id) refresh();
    },
    unmount() {
      unmounted = true;
      refresh.cancel();
    },
  };
}
