// DOM and formatting helpers. Every string from the API reaches the page through text nodes
// (append of a string, textContent) or attribute values, never through innerHTML: a display
// name like <img src=x onerror=alert(1)> is shown as those characters.

const SVG_NS = "http://www.w3.org/2000/svg";

function build(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      for (const [key, v] of Object.entries(value)) {
        if (v !== null && v !== undefined) el.dataset[key] = String(v);
      }
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** An HTML element: h("a", {href: "#/jobs"}, "My jobs"). Strings become text nodes. */
export function h(tag, attrs, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element, same calling convention as h(). */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/** Replace `old` by `fresh`, keeping keyboard focus on the element with the same data-key. */
export function swap(old, fresh) {
  const active = document.activeElement;
  const key = active && old.contains(active) ? active.dataset.key : undefined;
  old.replaceWith(fresh);
  if (key) {
    const again = fresh.querySelector(`[data-key="${CSS.escape(key)}"]`);
    if (again) again.focus();
  }
  return fresh;
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export function isUuid(value) {
  return typeof value === "string" && UUID_RE.test(value);
}

/** "#/job/<id>" for an id the API gave: only a UUID can make a link. */
export function jobHref(id) {
  return isUuid(id) ? `#/job/${id}` : null;
}

export function shortId(id) {
  return typeof id === "string" ? id.slice(0, 8) : "";
}

// Every date and time says its zone (the browser's own, named as Intl names it: "UTC",
// "GMT+1", "PST"), so a time read off the page means one instant, as the CLI's "21:53Z" does.
const dateTime = new Intl.DateTimeFormat(undefined, {
  year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit",
  second: "2-digit", timeZoneName: "short",
});
const thisYear = new Intl.DateTimeFormat(undefined, {
  month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
  timeZoneName: "short",
});
const timeOnly = new Intl.DateTimeFormat(undefined, {hour: "2-digit", minute: "2-digit"});
const dayOnly = new Intl.DateTimeFormat(undefined, {month: "short", day: "numeric"});

/** The short name of the browser's time zone ("UTC", "GMT+1"), for captions of clock axes. */
export function zoneName(date = new Date()) {
  const part = dateTime.formatToParts(date).find((p) => p.type === "timeZoneName");
  return part ? part.value : "local time";
}

export function parseTime(iso) {
  if (!iso) return null;
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? null : t;
}

/** A timestamp as local date and time with its zone, in a <time> element carrying the ISO
 * value (its title gives the full date and the UTC instant). */
export function timeEl(iso, fallback = "–") {
  const t = parseTime(iso);
  if (!t) return h("span", {class: "muted"}, fallback);
  const format = t.getFullYear() === new Date().getFullYear() ? thisYear : dateTime;
  return h("time", {datetime: iso, title: `${dateTime.format(t)} (${t.toISOString()})`},
    format.format(t));
}

/** A google.type.Money ({currencyCode, units, nanos}) for a person: "$0.17", "12.50 EUR";
 * a positive amount under a cent reads "< $0.01". "–" when it is not a Money. */
export function fmtMoney(money) {
  if (!money || typeof money !== "object") return "–";
  const units = Number(money.units ?? 0);
  const nanos = Number(money.nanos ?? 0);
  if (!Number.isFinite(units) || !Number.isFinite(nanos)) return "–";
  const amount = units + nanos / 1e9;
  const code = typeof money.currencyCode === "string" ? money.currencyCode.toUpperCase() : "";
  const text = (value) => (code === "USD" || code === "" ? `$${value}` : `${value} ${code}`);
  if (amount > 0 && amount < 0.005) return `< ${text("0.01")}`;
  return (amount < 0 ? "-" : "") + text(Math.abs(amount).toFixed(2));
}

/** A span with an estimate's basis in a few words, the full sentence as its title. */
export function basisEl(estimate) {
  const basis = estimate && estimate.basis;
  if (!basis) return null;
  return h("span", {class: "basis", title: basis}, basisShort(basis));
}

/** An estimate's basis in a few words, to stand beside the estimate (the full sentence is the
 * element's title and the job page's "Estimate basis"). */
export function basisShort(basis) {
  if (typeof basis !== "string" || !basis) return "";
  const rules = [
    [/^default run time of ([^:]+)/, (m) => `assumes a run of ${m[1]}: no similar job finished lately`],
    [/^median run time of (\d+) \S+ jobs? on/, (m) => `median of ${m[1]} similar run${m[1] === "1" ? "" : "s"}`],
    [/^median run time of the (\d+) similar/, (m) => `median of ${m[1]} longer similar run${m[1] === "1" ? "" : "s"}`],
    [/^from the provider's progress/, () => "from Fireworks' reported progress"],
    [/^the provider reports 100%/, () => "Fireworks reports 100%"],
    [/^already running longer/, () => "running longer than similar jobs"],
    [/^fixed run time of ([^;]+)/, (m) => `assumes ${m[1]}`],
    [/^simulated strict-FIFO admission with (\d+) jobs? ahead.*else a default of ([^;]+)$/,
      (m) => `simulated queue, ${m[1]} ahead; a run with no history counts ${m[2]}`],
    [/^simulated strict-FIFO admission with (\d+) jobs? ahead/, (m) => `simulated queue, ${m[1]} ahead`],
    [/^extrapolated: (\d+)/, (m) => `extrapolated, ${m[1]} ahead`],
    [/^no estimate: (.*)$/, (m) => m[1]],
  ];
  for (const [re, say] of rules) {
    const m = basis.match(re);
    if (m) return say(m);
  }
  return basis;
}

export function fmtClock(date) {
  return timeOnly.format(date);
}

export function fmtDay(date) {
  return dayOnly.format(date);
}

/** 45 s, 12 min, 3 h 05 min, 2 d 4 h. */
export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "–";
  const sec = Math.max(0, Math.round(seconds));
  if (sec < 90) return `${sec} s`;
  const min = Math.round(sec / 60);
  if (min < 90) return `${min} min`;
  const hours = Math.floor(sec / 3600);
  if (hours < 48) {
    const rest = Math.round((sec - hours * 3600) / 60);
    return `${hours} h ${String(rest).padStart(2, "0")} min`;
  }
  const days = Math.floor(sec / 86400);
  return `${days} d ${Math.round((sec - days * 86400) / 3600)} h`;
}

/** "in 12 min" / "3 min ago" from now. */
export function fmtRelative(iso, now = Date.now()) {
  const t = parseTime(iso);
  if (!t) return "";
  const delta = (t.getTime() - now) / 1000;
  if (Math.abs(delta) < 5) return "now";
  return delta > 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(-delta)} ago`;
}

export function secondsBetween(fromIso, toIso) {
  const a = parseTime(fromIso);
  const b = toIso ? parseTime(toIso) : new Date();
  if (!a || !b) return null;
  return (b.getTime() - a.getTime()) / 1000;
}

export const STATE_LABELS = {
  QUEUED: "Queued", PROGRESS: "Running", SUCCESS: "Succeeded", FAIL: "Failed",
  CANCELLED: "Cancelled",
};

export function stateBadge(state) {
  const known = Object.hasOwn(STATE_LABELS, state);
  return h("span", {class: `badge state-${known ? state : "unknown"}`, dataset: {state}},
    known ? STATE_LABELS[state] : String(state));
}

export function providerLabel(state) {
  return typeof state === "string" ? state.replace(/^JOB_STATE_/, "").replaceAll("_", " ") : "";
}

/** A progress bar with its number beside it (the bar alone would be colour only). */
export function progressBar(percent, label) {
  const value = typeof percent === "number" ? Math.max(0, Math.min(100, percent)) : null;
  const bar = h("progress", {max: "100", "aria-label": label});
  if (value !== null) bar.value = value;
  return h("span", {class: "progress"}, bar,
    h("span", {class: "progress-text"}, value === null ? "not reported yet" : `${Math.round(value)}%`));
}

/** A random Idempotency-Key (crypto.randomUUID needs a secure context; this does not). */
export function randomKey() {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** Calls fn at most once per `ms`, at the end of a burst. */
export function debounce(fn, ms) {
  let timer = null;
  const wrapped = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => { timer = null; fn(...args); }, ms);
  };
  wrapped.cancel = () => clearTimeout(timer);
  return wrapped;
}

/** A labelled <select> whose options are [value, text] pairs. */
export function selectField(id, label, options, value, onChange) {
  const select = h("select", {id, onchange: onChange},
    options.map(([v, text]) => h("option", {value: v, selected: v === value}, text)));
  return h("div", {class: "field"}, h("label", {for: id}, label), select);
}
