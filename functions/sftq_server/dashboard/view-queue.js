// The queue: the first jobs in line, in FIFO order (GET /queue). Your jobs are highlighted and
// linked; other users' jobs show no name, id or payload, only kind, GPUs, reason and estimate.

import {basisEl, debounce, fmtRelative, h, jobHref, swap, timeEl} from "./dom.js";

const LIMIT = 25;

export function mount(ctx) {
  const {api, main, notice} = ctx;
  let unmounted = false;
  const summary = h("p", {class: "summary", id: "queue-summary", role: "status"}, "Loading…");
  let table = h("div", {class: "table-wrap"});

  main.append(
    h("h1", {tabindex: "-1"}, "Queue"),
    h("p", {class: "muted"},
      "Jobs waiting for admission, first in line first. The scheduler admits in this order ",
      "(strict FIFO), at most your cap of running jobs each, when the GPU quota has room. ",
      "Other users' jobs are shown without names or ids."),
    summary, table);

  function draw(body) {
    const items = body.items || [];
    const mineShown = items.filter((i) => i.mine).length;
    const parts = [`${body.depth} job${body.depth === 1 ? "" : "s"} queued`];
    if (body.has_more) parts.push(`the first ${items.length} shown`);
    parts.push(`${body.your_queued_jobs} of them yours`);
    if (body.your_queued_jobs > mineShown) {
      parts.push(`${body.your_queued_jobs - mineShown} of yours further back (see My jobs)`);
    }
    summary.textContent = `${parts.join(", ")}.`;
    const rows = items.map((item) => {
      const href = item.mine ? jobHref(item.id) : null;
      const reason = item.waiting_reason || {};
      return h("tr", {class: item.mine ? "mine" : null, dataset: {position: item.position,
        mine: item.mine ? "1" : "0"}},
      h("td", {"data-label": "#", class: "num"}, String(item.position)),
      h("td", {"data-label": "Whose"}, item.mine
        ? h("span", {}, h("strong", {class: "you"}, "You"), " ",
          href ? h("a", {href, dataset: {key: `q-${item.id}`}},
            item.display_name === null ? "(no name)" : item.display_name) : null)
        : h("span", {class: "muted"}, "Another user")),
      h("td", {"data-label": "Kind"}, item.kind),
      h("td", {"data-label": "GPUs", class: "num"}, String(item.gpu_count)),
      h("td", {"data-label": "Queued"}, timeEl(item.created_at)),
      h("td", {"data-label": "Why it waits", class: "reason", dataset: {code: reason.code}},
        reason.message || ""),
      h("td", {"data-label": "Estimated start"},
        h("div", {class: "details"},
          item.estimated_start_at
            ? h("span", {}, timeEl(item.estimated_start_at),
              ` (${fmtRelative(item.estimated_start_at)}, an estimate)`)
            : h("span", {}, "No estimate"),
          basisEl(item.estimate))));
    });
    table = swap(table, h("div", {class: "table-wrap"},
      items.length === 0 ? h("p", {}, "Nobody is waiting: the queue is empty.")
        : h("table", {class: "queue responsive", id: "queue-table"},
          h("caption", {class: "visually-hidden"}, "Queued jobs in the order they are admitted"),
          h("thead", {}, h("tr", {}, ["#", "Whose", "Kind", "GPUs", "Queued", "Why it waits",
            "Estimated start"].map((c) => h("th", {scope: "col"}, c)))),
          h("tbody", {}, rows))));
  }

  async function load() {
    try {
      const body = await api.get("queue", {limit: LIMIT});
      if (!unmounted) draw(body);
    } catch (err) {
      if (!unmounted && err.status !== 401) notice(`Could not load the queue: ${err.message}`);
    }
  }

  const refresh = debounce(load, 1000);
  load();
  return {
    refresh: load,
    pollMs: 10000,
    onFrame(frame) {
      if (frame.event === "status" || frame.event === "queue") refresh();
    },
    unmount() {
      unmounted = true;
      refresh.cancel();
    },
  };
}
