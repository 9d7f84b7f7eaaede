// The dashboard: sign-in, a hash router over the views, live updates. No framework, no build:
// each view is a module whose mount() draws into <main> and answers refresh() and onFrame().

import {Api, ApiError, KEY_RE, forgetKey, loadKey, saveKey} from "./api.js";
import {clear, h} from "./dom.js";
import {Live} from "./live.js";
import * as capacityView from "./view-capacity.js";
import * as chartsView from "./view-charts.js";
import * as jobView from "./view-job.js";
import * as jobsView from "./view-jobs.js";
import * as queueView from "./view-queue.js";
import * as submitView from "./view-submit.js";

// The page is <jobs-api>/dashboard: the API is the folder it sits in.
const API_BASE = new URL("./", document.baseURI);
const VIEWS = {
  jobs: jobsView, job: jobView, queue: queueView, capacity: capacityView, charts: chartsView,
  submit: submitView,
};
const TITLES = {
  jobs: "My jobs", job: "Job", queue: "Queue", capacity: "Capacity", charts: "Charts",
  submit: "Submit",
};

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const session = document.getElementById("session");
const liveEl = document.getElementById("live");

let api = null;
let live = null;
let current = null; // {name, view, pollTimer}

/** The route in location.hash: "#/jobs?state=QUEUED" -> {name: "jobs", arg: null, query}. */
function parseRoute() {
  const raw = location.hash.startsWith("#/") ? location.hash.slice(2) : "jobs";
  const [path, search] = raw.split("?", 2);
  let [name, arg] = path.split("/", 2);
  // "#/jobs/<id>" reads like a REST path (GET /jobs/{id}); it means the job page, "#/job/<id>".
  if (name === "jobs" && arg) name = "job";
  return {
    name: Object.hasOwn(VIEWS, name) ? name : "jobs",
    arg: arg ? decodeURIComponent(arg) : null,
    query: new URLSearchParams(search || ""),
  };
}

function unmountView() {
  if (!current) return;
  clearInterval(current.pollTimer);
  if (current.view && current.view.unmount) current.view.unmount();
  current = null;
}

function showView() {
  unmountView();
  const route = parseRoute();
  for (const link of nav.querySelectorAll("a[data-view]")) {
    if (link.dataset.view === route.name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `${TITLES[route.name]} · finetune-queue`;
  clear(main);
  const ctx = {api, main, route, navigate, notice};
  const view = VIEWS[route.name].mount(ctx);
  current = {name: route.name, view, pollTimer: null};
  // Other users' work sends no frames to this key: views that show it refresh on a timer of
  // their own, live or not. The others are refreshed by frames, or by the poll without them.
  if (view.pollMs) {
    current.pollTimer = setInterval(() => {
      if (!document.hidden) view.refresh();
    }, view.pollMs);
  }
}

function navigate(hash) {
  if (location.hash === hash) showView();
  else location.hash = hash;
}

/** A message at the top of the view: role=alert for errors, role=status otherwise. */
function notice(text, kind = "error") {
  const old = main.querySelector(".notice");
  if (old) old.remove();
  if (!text) return;
  const el = h("p", {class: `notice notice-${kind}`, role: kind === "error" ? "alert" : "status"},
    text);
  main.prepend(el);
}

function setLive(mode, text) {
  liveEl.textContent = text;
  liveEl.dataset.mode = mode;
}

function signOut(message) {
  forgetKey();
  if (live) live.stop();
  live = null;
  api = null;
  unmountView();
  nav.hidden = true;
  session.hidden = true;
  renderSignIn(message);
}

function startSession(key) {
  api = new Api(API_BASE, key, () => {
    if (api) signOut("Your API key was refused (revoked, or no longer valid): sign in again.");
  });
  nav.hidden = false;
  session.hidden = false;
  live = new Live(api, {
    onFrame: (frame) => {
      // How many frames arrived (a test, or a curious person in the inspector, can read it).
      const root = document.documentElement;
      root.dataset.frames = String(Number(root.dataset.frames || 0) + 1);
      if (current && current.view.onFrame) current.view.onFrame(frame);
    },
    onPoll: () => {
      if (current && !current.view.pollMs) current.view.refresh();
    },
    onMode: setLive,
  });
  showView();
  live.start();
}

function renderSignIn(message) {
  clear(main);
  document.title = "Sign in · finetune-queue";
  const input = h("input", {
    id: "key", type: "password", autocomplete: "off", spellcheck: "false",
    autocapitalize: "off", "aria-describedby": "key-help signin-msg", required: true,
  });
  const msg = h("p", {id: "signin-msg", class: "field-error", role: "alert"}, message || "");
  const button = h("button", {type: "submit", class: "primary"}, "Sign in");
  const form = h("form", {class: "signin card", novalidate: true},
    h("h1", {}, "Sign in"),
    h("p", {id: "key-help"},
      "Paste your API key (it starts with sftq_). It stays in this browser tab only and is sent ",
      "to the API in the Authorization header, nowhere else. Closing the tab or signing out ",
      "forgets it."),
    h("div", {class: "field"}, h("label", {for: "key"}, "API key"), input),
    msg, button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!KEY_RE.test(key)) {
      msg.textContent = "That does not look like an API key: keys start with sftq_.";
      input.setAttribute("aria-invalid", "true");
      input.focus();
      return;
    }
    button.disabled = true;
    msg.textContent = "";
    // Check the key with a cheap call before keeping it.
    const probe = new Api(API_BASE, key, () => {});
    try {
      await probe.get("jobs/analytics/summary");
    } catch (err) {
      button.disabled = false;
      input.setAttribute("aria-invalid", "true");
      msg.textContent = err instanceof ApiError && err.status === 401
        ? "That key was refused: it is unknown or has been revoked."
        : `Could not sign in: ${err.message}`;
      input.focus();
      return;
    }
    input.value = "";
    saveKey(key);
    startSession(key);
    main.focus();
  });
  main.append(form);
  input.focus();
}

document.getElementById("signout").addEventListener("click", () => {
  signOut("Signed out: the key is forgotten.");
});
document.querySelector(".skip").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});
window.addEventListener("hashchange", () => {
  if (api) showView();
});

const stored = loadKey();
if (stored) startSession(stored);
else renderSignIn("");
