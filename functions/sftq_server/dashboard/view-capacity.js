// Capacity (GET /capacity): the GPU quota as the scheduler last read it, free GPUs, who runs
// and waits, and whether the scheduler is ticking.

import {fmtDuration, fmtRelative, h, s, swap, timeEl} from "./dom.js";

/** A horizontal gauge: usage of limit, with the numbers in its accessible name and beside it. */
function gauge(usage, limit) {
  const width = 600;
  const frac = limit > 0 ? Math.max(0, Math.min(1, usage / limit)) : 0;
  const label = `${usage} of ${limit} GPUs of the quota in use (${Math.round(frac * 100)}%)`;
  return h("figure", {class: "gauge"},
    s("svg", {viewBox: `0 0 ${width} 28`, role: "img", "aria-label": label,
      preserveAspectRatio: "none"},
    s("rect", {class: "gauge-track", x: 0, y: 0, width, height: 28, rx: 6}),
    s("rect", {class: `gauge-fill${frac >= 0.9 ? " full" : ""}`, x: 0, y: 0,
      width: Math.round(width * frac), height: 28, rx: 6})),
    h("figcaption", {}, label));
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

export function mount(ctx) {
  const {api, main, notice} = ctx;
  let unmounted = false;
  let body = h("div", {id: "capacity-body"}, h("p", {class: "muted", role: "status"}, "Loading…"));
  main.append(h("h1", {tabindex: "-1"}, "Capacity"), body);

  function draw(c) {
    const q = c.quota || {};
    const sched = c.scheduler || {};
    const stat = (label, value, note) => h("div", {class: "stat"},
      h("span", {class: "stat-value"}, value), h("span", {class: "stat-label"}, label),
      note ? h("span", {class: "stat-note muted"}, note) : null);
    const users = c.users || [];
    body = swap(body, h("div", {id: "capacity-body"},
      h("section", {class: "card", "aria-labelledby": "quota-h"},
        h("h2", {id: "quota-h"}, "GPU quota"),
        q.limit === null || q.limit === undefined
          ? h("p", {}, "The scheduler has not read the quota yet.")
          : gauge(Number(q.usage), q.limit),
        h("p", {class: "muted"}, `Quota ${q.id || "?"}`,
          q.read_at ? [", read ", timeEl(q.read_at), ` (${fmtRelative(q.read_at)})`] : "",
          ".")),
      h("div", {class: "stats"},
        stat("free GPUs", c.free_gpus === null ? "–" : String(c.free_gpus),
          "what admission may spend now"),
        stat("running", plural(c.running.jobs, "job"), `on ${plural(c.running.gpus, "GPU")}`),
        stat("queued", plural(c.queued.jobs, "job"), `wanting ${plural(c.queued.gpus, "GPU")}`)),
      h("section", {class: "card", "aria-labelledby": "sched-h"},
        h("h2", {id: "sched-h"}, "Scheduler"),
        h("p", {id: "scheduler-health"},
          h("span", {class: `badge ${sched.healthy ? "ok" : "bad"}`},
            sched.healthy ? "Healthy" : "Not running normally"),
          " Last tick ", sched.last_tick_at
            ? [timeEl(sched.last_tick_at), ` (${fmtRelative(sched.last_tick_at)})`] : "never",
          `; it should tick every ${fmtDuration(sched.interval_seconds)}.`)),
      h("section", {class: "card", "aria-labelledby": "users-h"},
        h("h2", {id: "users-h"}, "Who runs and waits"),
        users.length === 0 ? h("p", {}, "Nobody has work running or queued.")
          : h("div", {class: "table-wrap"}, h("table", {class: "responsive", id: "capacity-users"},
            h("caption", {class: "visually-hidden"}, "Users with running or queued work, most running GPUs first"),
            h("thead", {}, h("tr", {}, ["User", "Cap", "Running jobs", "Running GPUs",
              "Queued jobs", "Queued GPUs"].map((t) => h("th", {scope: "col"}, t)))),
            h("tbody", {}, users.map((u) => h("tr", {},
              h("td", {"data-label": "User"}, u.name),
              h("td", {"data-label": "Cap", class: "num"}, u.cap === null ? "–" : String(u.cap)),
              h("td", {"data-label": "Running jobs", class: "num"}, String(u.running_jobs)),
              h("td", {"data-label": "Running GPUs", class: "num"}, String(u.running_gpus)),
              h("td", {"data-label": "Queued jobs", class: "num"}, String(u.queued_jobs)),
              h("td", {"data-label": "Queued GPUs", class: "num"}, String(u.queued_gpus))))))))));
  }

  async function load() {
    try {
      const c = await api.get("capacity");
      if (!unmounted) draw(c);
    } catch (err) {
      if (!unmounted && err.status !== 401) notice(`Could not load capacity: ${err.message}`);
    }
  }

  load();
  return {
    refresh: load,
    pollMs: 10000,
    onFrame() {},
    unmount() {
      unmounted = true;
    },
  };
}
