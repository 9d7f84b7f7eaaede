// My jobs: one page at a time (GET /jobs?limit=25, keyset cursors), newest first, filtered by
// state and kind; queued jobs with their reason, position and estimate, running ones with the
// provider's sub-state and progress. The page is drawn from GET /jobs alone first (a user with
// 10,000 jobs sees it at once); the details arrive after.

import {
  basisEl, debounce, fmtDuration, fmtRelative, h, jobHref, progressBar, providerLabel, secondsBetween,
  selectField, shortId, stateBadge, swap, timeEl,
} from "./dom.js";

const PAGE = 25;
const STATES = ["QUEUED", "PROGRESS", "SUCCESS", "FAIL", "CANCELLED"];
const KINDS = ["SFT", "DPO", "RFT"];
let firstPaintMarked = false;

/** `value` upper-cased if it is one of `names`, else "" (no filter). */
function oneOf(names, value) {
  const upper = (value || "").toUpperCase();
  return names.includes(upper) ? upper : "";
}

export function mount(ctx) {
  const {api, main, route, navigate, notice} = ctx;
  // Any case, as the API takes it: #/jobs?state=queued is the QUEUED filter (issue 18.6).
  const state = oneOf(STATES, route.query.get("state"));
  const kind = oneOf(KINDS, route.query.get("kind"));
  // Cursors of the pages seen so far: cursors[i] opens page i (page 0 has none).
  const cursors = [null];
  let page = 0;
  let nextCursor = null;
  let jobs = [];
  const queued = new Map(); // id -> your_queued_jobs item (reason, position, estimate)
  const running = new Map(); // id -> {provider_state, progress, estimated_finish_at}
  let unmounted = false;
  let generation = 0;

  const setFilter = () => {
    const q = new URLSearchParams();
    const s = document.getElementById("f-state").value;
    const k = document.getElementById("f-kind").value;
    if (s) q.set("state", s);
    if (k) q.set("kind", k);
    const text = q.toString();
    navigate(text ? `#/jobs?${text}` : "#/jobs");
  };

  const summary = h("p", {class: "summary muted", id: "jobs-summary"});
  const status = h("p", {class: "muted", role: "status", id: "jobs-status"}, "Loading your jobs…");
  let table = h("div", {class: "table-wrap"});
  const pager = h("nav", {class: "pager", "aria-label": "Pages"});

  main.append(
    h("div", {class: "view-head"},
      h("h1", {tabindex: "-1"}, "My jobs"),
      h("a", {href: "#/submit", class: "button primary"}, "Submit a job")),
    summary,
    h("form", {class: "filters", role: "search", "aria-label": "Filter jobs",
      onsubmit: (e) => e.preventDefault()},
    selectField("f-state", "State", [["", "All states"], ...STATES.map((x) => [x, x])], state,
      setFilter),
    selectField("f-kind", "Kind", [["", "All kinds"], ...KINDS.map((x) => [x, x])], kind,
      setFilter)),
    status, table, pager);

  function details(job) {
    if (job.state === "QUEUED") {
      const q = queued.get(job.id);
      if (!q) return h("span", {class: "muted"}, "…");
      const reason = q.waiting_reason || {};
      return h("div", {class: "details"},
        h("span", {class: "reason", dataset: {code: reason.code || ""}}, reason.message || ""),
        h("span", {class: "meta"},
          `${q.queue_position} job${q.queue_position === 1 ? "" : "s"} of others ahead · `,
          q.estimated_start_at
            ? h("span", {}, "estimated start ", timeEl(q.estimated_start_at),
              ` (${fmtRelative(q.estimated_start_at)}, an estimate)`)
            : h("span", {}, "no estimate")),
        basisEl(q.estimate));
    }
    if (job.state === "PROGRESS") {
      const r = running.get(job.id);
      const sub = r && r.provider_state ? providerLabel(r.provider_state) : "submitting";
      const pct = r && r.progress ? r.progress.percent : null;
      return h("div", {class: "details"},
        h("span", {class: "substate"}, sub),
        progressBar(pct, `Progress of ${job.display_name || shortId(job.id)}`),
        r && r.estimated_finish_at
          ? h("span", {class: "meta"}, "estimated finish ", timeEl(r.estimated_finish_at),
            " (an estimate)")
          : null,
        r ? basisEl(r.estimate) : null);
    }
    if (job.state === "FAIL" && job.error) {
      return h("span", {class: "error-text", title: job.error},
        job.error.length > 140 ? `${job.error.slice(0, 140)}…` : job.error);
    }
    return null;
  }

  function row(job) {
    const href = jobHref(job.id);
    const waited = job.started_at ? secondsBetween(job.created_at, job.started_at)
      : job.state === "QUEUED" ? secondsBetween(job.created_at, null) : null;
    const ran = job.started_at
      ? secondsBetween(job.started_at, job.completed_at || null) : null;
    return h("tr", {dataset: {jobId: job.id, state: job.state}},
      h("td", {"data-label": "State"}, stateBadge(job.state)),
      h("td", {"data-label": "Kind"}, job.kind),
      h("td", {"data-label": "Name", class: "name"}, h("span", {},
        href ? h("a", {href, dataset: {key: `job-${job.id}`}},
          job.display_name === null ? h("span", {class: "muted"}, "(no name)") : job.display_name)
          : job.display_name,
        h("span", {class: "id muted"}, ` ${shortId(job.id)}`))),
      h("td", {"data-label": "GPUs", class: "num"}, String(job.gpu_count)),
      h("td", {"data-label": "Created"}, timeEl(job.created_at)),
      h("td", {"data-label": "Waited", class: "num"}, waited === null ? "–" : fmtDuration(waited)),
      h("td", {"data-label": "Ran", class: "num"}, ran === null ? "–" : fmtDuration(ran)),
      h("td", {"data-label": "Now", class: "now"}, details(job)));
  }

  function drawTable() {
    if (jobs.length === 0) {
      table = swap(table, h("div", {class: "table-wrap"}));
      return;
    }
    const body = h("tbody", {}, jobs.map(row));
    const fresh = h("div", {class: "table-wrap"},
      h("table", {class: "jobs responsive", id: "jobs-table"},
        h("caption", {class: "visually-hidden"}, "Your jobs, newest first"),
        h("thead", {}, h("tr", {},
          ["State", "Kind", "Name", "GPUs", "Created", "Waited", "Ran", "Now"].map(
            (c) => h("th", {scope: "col"}, c)))),
        body));
    table = swap(table, fresh);
  }

  function redrawRow(id) {
    const old = table.querySelector(`tr[data-job-id="${CSS.escape(id)}"]`);
    const job = jobs.find((j) => j.id === id);
    if (old && job) swap(old, row(job));
  }

  function drawPager() {
    pager.replaceChildren(
      h("button", {type: "button", disabled: page === 0, onclick: () => go(page - 1)}, "← Newer"),
      h("span", {class: "muted"}, `Page ${page + 1}`),
      h("button", {type: "button", disabled: !nextCursor, onclick: () => go(page + 1)},
        "Older →"));
  }

  async function loadDetails(gen) {
    const tasks = [];
    if (jobs.some((j) => j.state === "QUEUED")) {
      tasks.push(api.get("jobs/analytics/queue").then((ctxData) => {
        if (gen !== generation) return;
        queued.clear();
        for (const q of ctxData.your_queued_jobs || []) queued.set(q.id, q);
      }));
    }
    for (const job of jobs.filter((j) => j.state === "PROGRESS").slice(0, 10)) {
      tasks.push(api.get(`jobs/${job.id}/analytics`).then((a) => {
        if (gen !== generation) return;
        running.set(job.id, {provider_state: a.provider_state, progress: a.progress,
          estimated_finish_at: a.estimated_finish_at, estimate: a.estimate});
      }));
    }
    tasks.push(api.get("jobs/analytics/summary").then((sum) => {
      if (gen !== generation) return;
      const by = sum.by_state || {};
      summary.textContent = `${sum.total} jobs in all: ${by.QUEUED} queued, ${by.PROGRESS} ` +
        `running, ${by.SUCCESS} succeeded, ${by.FAIL} failed, ${by.CANCELLED} cancelled.`;
    }));
    const results = await Promise.allSettled(tasks);
    if (unmounted || gen !== generation) return;
    const failed = results.find((r) => r.status === "rejected");
    if (failed && failed.reason && failed.reason.status !== 401) {
      notice(`Some details could not be loaded: ${failed.reason.message}`);
    }
    drawTable();
  }

  async function load() {
    const gen = ++generation;
    try {
      const resp = await api.request("GET", "jobs", {
        query: {limit: PAGE, state, kind, cursor: cursors[page]},
      });
      if (unmounted || gen !== generation) return;
      jobs = Array.isArray(resp.data) ? resp.data : [];
      nextCursor = resp.headers.get("X-Next-Cursor");
      status.textContent = jobs.length ? "" : (state || kind)
        ? "No job matches these filters." : "You have no jobs yet.";
      drawTable();
      drawPager();
      if (!firstPaintMarked) {
        firstPaintMarked = true;
        // After the frame that shows the table: when a person sees their jobs.
        requestAnimationFrame(() => setTimeout(() => {
          performance.mark("sftq:first-jobs");
          document.documentElement.dataset.firstJobs = "1";
        }, 0));
      }
      await loadDetails(gen);
    } catch (err) {
      if (unmounted || err.status === 401) return;
      status.textContent = "";
      notice(`Could not load your jobs: ${err.message}`);
    }
  }

  function go(target) {
    if (target < 0 || (target > page && !nextCursor)) return;
    if (target > page) cursors[target] = nextCursor;
    page = target;
    load();
  }

  const refresh = debounce(load, 250);

  load();
  return {
    refresh: load,
    onFrame(frame) {
      const d = frame.data || {};
      const id = frame.event === "status" ? d.id : d.job_id;
      const job = jobs.find((j) => j.id === id);
      if (frame.event === "status") {
        if (job && job.state === d.state) {
          Object.assign(job, d);
          redrawRow(id);
        } else {
          // A new job, or a state change that may move it across filters or pages.
          refresh();
        }
      } else if (frame.event === "progress" && job) {
        // A frame carries no basis: keep the one the analytics gave.
        const before = running.get(id) || {};
        running.set(id, {provider_state: d.provider_state, progress: d.progress,
          estimated_finish_at: d.estimated_finish_at, estimate: before.estimate});
        redrawRow(id);
      } else if (frame.event === "queue" && job) {
        const q = queued.get(id) || {id};
        queued.set(id, {...q, queue_position: d.queue_position, waiting_reason: d.waiting_reason,
          estimated_start_at: d.estimated_start_at});
        redrawRow(id);
      }
    },
    unmount() {
      unmounted = true;
      refresh.cancel();
    },
  };
}
