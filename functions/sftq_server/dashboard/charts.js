// Small SVG charts drawn here rather than with a library: the dashboard needs a time line and a
// bar chart, about 200 lines, where a charting library would be most of the page's weight.
// Colours come from style.css (light and dark); every chart carries its numbers as a table too.
// A chart is drawn at the pixel width of its container (text stays 12 px at any width) and
// redrawn by its view when the window is resized.

import {h, s} from "./dom.js";

const H = 220;
const M = {left: 56, right: 14, top: 12, bottom: 30};
const DURATION_UNITS = [[86400, "d"], [3600, "h"], [60, "min"], [1, "s"]];

function niceStep(raw) {
  const exp = 10 ** Math.floor(Math.log10(raw));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (step * exp >= raw) return step * exp;
  }
  return 10 * exp;
}

/** Axis maximum and tick labels: plain numbers, or durations in one unit (s, min, h, d). */
function axis(maxValue, kind) {
  if (kind === "duration") {
    const [unit, label] = DURATION_UNITS.find(([u]) => maxValue >= 2 * u) || [1, "s"];
    const step = niceStep(Math.max(maxValue / unit, 1) / 4);
    return {max: step * 4 * unit, label: (v) => (v === 0 ? "0" : `${+(v / unit).toFixed(2)} ${label}`)};
  }
  const step = niceStep(Math.max(maxValue, 1) / 4);
  return {max: step * 4, label: (v) => String(+v.toFixed(2))};
}

let chartCount = 0;

/**
 * A line chart over time, `width` pixels wide.
 * @param {{title: string, series: {name: string, points: {x: Date, y: number|null}[],
 *          dashed?: boolean}[], yKind: "duration"|"count", yFormat: (v: number) => string,
 *          xFormat: (d: Date) => string, empty?: string}} spec
 * @param {number} width
 */
export function lineChart(spec, width) {
  const id = `chart-${++chartCount}`;
  const W = Math.max(280, Math.round(width));
  const all = spec.series.flatMap((se) => se.points);
  const values = all.map((p) => p.y).filter((y) => typeof y === "number");
  const xs = all.map((p) => p.x.getTime());
  const x0 = Math.min(...xs);
  const x1 = Math.max(...xs);
  const ax = axis(Math.max(0, ...values), spec.yKind);
  const yMax = ax.max;
  const px = (t) => M.left + (x1 > x0 ? (t - x0) / (x1 - x0) : 0.5) * (W - M.left - M.right);
  const py = (v) => H - M.bottom - (v / yMax) * (H - M.top - M.bottom);

  const grid = [];
  for (let i = 0; i <= 4; i += 1) {
    const v = (yMax * i) / 4;
    grid.push(s("line", {class: "grid", x1: M.left, x2: W - M.right, y1: py(v), y2: py(v)}),
      s("text", {class: "tick", x: M.left - 6, y: py(v) + 4, "text-anchor": "end"},
        ax.label(v)));
  }
  const xTicks = W < 480 ? 2 : 4;
  if (xs.length) {
    for (let i = 0; i <= xTicks; i += 1) {
      const t = x0 + ((x1 - x0) * i) / xTicks;
      grid.push(s("text", {class: "tick", x: px(t), y: H - 8,
        "text-anchor": i === 0 ? "start" : i === xTicks ? "end" : "middle"},
      spec.xFormat(new Date(t))));
    }
  }
  const lines = spec.series.map((se, n) => {
    const segments = [];
    let current = [];
    for (const p of se.points) {
      if (typeof p.y === "number") current.push(p);
      else if (current.length) {
        segments.push(current);
        current = [];
      }
    }
    if (current.length) segments.push(current);
    return s("g", {class: `series series-${n}${se.dashed ? " dashed" : ""}`},
      segments.map((seg) => seg.length === 1
        ? s("circle", {cx: px(seg[0].x.getTime()), cy: py(seg[0].y), r: 3})
        : s("path", {d: seg.map((p, i) => `${i ? "L" : "M"}${px(p.x.getTime()).toFixed(1)},${py(p.y).toFixed(1)}`).join("")})));
  });

  const svg = s("svg", {viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img",
    "aria-labelledby": `${id}-t`, class: "chart-svg"},
  s("title", {id: `${id}-t`}, spec.title),
  s("line", {class: "axis", x1: M.left, x2: W - M.right, y1: py(0), y2: py(0)}),
  grid, lines);
  const legend = h("ul", {class: "legend"}, spec.series.map((se, n) => h("li", {},
    h("span", {class: `swatch series-${n}${se.dashed ? " dashed" : ""}`, "aria-hidden": "true"}),
    se.name)));
  const table = h("details", {class: "chart-data"}, h("summary", {}, "Show the numbers"),
    h("div", {class: "table-wrap"}, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {scope: "col"}, "Time"),
        spec.series.map((se) => h("th", {scope: "col"}, se.name)))),
      h("tbody", {}, (spec.series[0] ? spec.series[0].points : []).map((p, i) => h("tr", {},
        h("th", {scope: "row"}, spec.xFormat(p.x)),
        spec.series.map((se) => {
          const y = se.points[i] ? se.points[i].y : null;
          return h("td", {class: "num"}, typeof y === "number" ? spec.yFormat(y) : "–");
        })))))));
  if (values.length === 0) {
    return h("figure", {class: "chart", id}, h("figcaption", {}, spec.title),
      h("p", {class: "muted empty"}, spec.empty || "No data in this window."));
  }
  return h("figure", {class: "chart", id}, h("figcaption", {}, spec.title), svg, legend, table);
}

/**
 * Horizontal bars for shares from 0 to 1.
 * @param {{title: string, bars: {label: string, value: number|null, note: string}[]}} spec
 */
export function barChart(spec, width) {
  const id = `chart-${++chartCount}`;
  const W = Math.max(280, Math.min(720, Math.round(width)));
  const rowH = 34;
  const height = spec.bars.length * rowH + 8;
  const left = 48;
  const right = W < 480 ? 150 : 190;
  const inner = W - left - right;
  const svg = s("svg", {viewBox: `0 0 ${W} ${height}`, width: W, height, role: "img",
    "aria-labelledby": `${id}-t`, class: "chart-svg bars"},
  s("title", {id: `${id}-t`}, spec.title),
  spec.bars.map((b, i) => {
    const y = 4 + i * rowH;
    const w = typeof b.value === "number" ? Math.max(0, Math.min(1, b.value)) * inner : 0;
    return s("g", {},
      s("text", {class: "tick", x: left - 8, y: y + rowH / 2 + 2, "text-anchor": "end"}, b.label),
      s("rect", {class: "bar-track", x: left, y: y + 6, width: inner, height: rowH - 14, rx: 4}),
      s("rect", {class: "bar-fill", x: left, y: y + 6, width: w, height: rowH - 14, rx: 4}),
      s("text", {class: "tick", x: left + inner + 8, y: y + rowH / 2 + 2},
        typeof b.value === "number" ? `${Math.round(b.value * 100)}% ${b.note}` : b.note));
  }));
  return h("figure", {class: "chart", id}, h("figcaption", {}, spec.title), svg);
}
