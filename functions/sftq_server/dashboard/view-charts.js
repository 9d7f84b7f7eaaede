// Charts: your waits and run times over time and how each kind ends
// (GET /jobs/analytics/history), and GPUs in use over 24 hours and 7 days
// (GET /capacity/history). Each series is bounded by its route: at most 91 buckets or 168
// points, whatever the length of your history.

import {barChart, lineChart} from "./charts.js";
import {debounce, fmtClock, fmtDay, fmtDuration, h, swap, zoneName} from "./dom.js";

const RANGES = [[2, "2 days"], [30, "30 days"], [90, "90 days"]];

function number(v) {
  return String(Math.round(v * 10) / 10);
}

export function mount(ctx) {
  const {api, main, notice} = ctx;
  let unmounted = false;
  let days = 30;
  let history = null;
  let gpuDay = null;
  let gpuWeek = null;
  let mine = h("div", {id: "charts-mine"}, h("p", {class: "muted"}, "Loading…"));
  let kinds = h("div", {id: "charts-kinds"});
  let gpus = h("div", {id: "charts-gpus"}, h("p", {class: "muted"}, "Loading…"));
  const rangeButtons = RANGES.map(([d, label]) => h("button", {type: "button",
    "aria-pressed": String(d === days), dataset: {days: d}, onclick: () => {
      days = d;
      for (const b of rangeButtons) {
        b.setAttribute("aria-pressed", String(Number(b.dataset.days) === d));
      }
      loadMine();
    }}, label));
  const mineCard = h("section", {class: "card", "aria-labelledby": "mine-h"},
    h("div", {class: "view-head"}, h("h2", {id: "mine-h"}, "Your waits and run times"),
      h("div", {class: "segmented", role: "group", "aria-label": "Time range"}, rangeButtons)),
    h("p", {class: "muted"}, "Medians over the jobs you submitted in each hour (2 days) or ",
      "day: how long they waited in the queue, and how long they ran."),
    mine, kinds);
  const gpuCard = h("section", {class: "card", "aria-labelledby": "gpu-h"},
    h("h2", {id: "gpu-h"}, "GPUs in use"),
    h("p", {class: "muted"}, "As the scheduler saw them at its ticks: the provider's usage of ",
      "the quota, the GPUs of the queue's running jobs, and the quota's limit."),
    gpus);
  main.append(h("h1", {tabindex: "-1"}, "Charts"), mineCard, gpuCard);

  // The width a chart may take: its card's content box.
  const widthOf = (card) => card.clientWidth - 34;

  function drawMine() {
    if (!history) return;
    const hist = history;
    const hourly = hist.bucket_seconds < 86400;
    const pts = (key) => hist.buckets.map((b) => ({x: new Date(b.start), y: b[key]}));
    const width = widthOf(mineCard);
    mine = swap(mine, h("div", {id: "charts-mine"},
      lineChart({
        title: `Median queue wait and run time, last ${hist.days} days` +
          (hourly ? ` (times in ${zoneName()})` : ""),
        series: [{name: "queue wait (median)", points: pts("wait_p50_seconds")},
          {name: "run time (median)", points: pts("run_p50_seconds")}],
        yKind: "duration",
        yFormat: fmtDuration,
        xFormat: hourly ? fmtClock : fmtDay,
        empty: "You submitted no job that started in this window.",
      }, width),
      hist.truncated ? h("p", {class: "muted"}, `Only your newest ${hist.jobs} jobs are counted.`)
        : null));
    kinds = swap(kinds, h("div", {id: "charts-kinds"}, barChart({
      title: `Success rate by kind, jobs submitted in the last ${hist.days} days`,
      bars: hist.by_kind.map((k) => ({
        label: k.kind, value: k.success_rate,
        note: `${k.succeeded} of ${k.succeeded + k.failed + k.cancelled} succeeded`,
      })),
    }, width)));
  }

  function drawGpus() {
    if (!gpuDay || !gpuWeek) return;
    const wide = widthOf(gpuCard) > 900;
    const width = wide ? (widthOf(gpuCard) - 16) / 2 : widthOf(gpuCard);
    const chart = (hist, title, xFormat) => {
      const pts = (key) => hist.points.map((p) => ({x: new Date(p.at),
        y: p[key] === null ? null : Number(p[key])}));
      return lineChart({
        title,
        series: [{name: "provider usage", points: pts("quota_usage")},
          {name: "queue's running jobs", points: pts("queue_gpus")},
          {name: "quota limit", points: pts("quota_limit"), dashed: true}],
        yKind: "count",
        yFormat: number,
        xFormat,
        empty: "The scheduler read no quota in this window.",
      }, width);
    };
    gpus = swap(gpus, h("div", {id: "charts-gpus", class: wide ? "grid-2" : null},
      chart(gpuDay, `GPUs in use, last 24 hours (times in ${zoneName()})`, fmtClock),
      chart(gpuWeek, "GPUs in use, last 7 days", fmtDay)));
  }

  async function loadMine() {
    try {
      const hist = await api.get("jobs/analytics/history", {days});
      if (unmounted) return;
      history = hist;
      drawMine();
    } catch (err) {
      if (!unmounted && err.status !== 401) notice(`Could not load your history: ${err.message}`);
    }
  }

  async function loadGpus() {
    try {
      const [day, week] = await Promise.all([
        api.get("capacity/history", {window: "24h"}), api.get("capacity/history", {window: "7d"})]);
      if (unmounted) return;
      gpuDay = day;
      gpuWeek = week;
      drawGpus();
    } catch (err) {
      if (!unmounted && err.status !== 401) notice(`Could not load GPU usage: ${err.message}`);
    }
  }

  const onResize = debounce(() => {
    drawMine();
    drawGpus();
  }, 150);
  window.addEventListener("resize", onResize);
  loadMine();
  loadGpus();
  return {
    refresh() {
      loadMine();
      loadGpus();
    },
    pollMs: 60000,
    onFrame() {},
    unmount() {
      unmounted = true;
      onResize.cancel();
      window.removeEventListener("resize", onResize);
    },
  };
}
