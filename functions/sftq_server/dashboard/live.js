// Live updates: GET /jobs/stream read with fetch (EventSource cannot send the Authorization
// header), parsed as Server-Sent Events, resumed with Last-Event-ID after a drop or the
// server's `reconnect`. Where the server does not stream (the WSGI jobs-api answers 501
// stream_unavailable) the page polls instead.

const POLL_MS = 5000;
// The server sends a heartbeat every 15 s by default: silence past this is a dead connection.
const SILENCE_MS = 45000;
const MAX_BACKOFF_MS = 30000;

export class Live {
  /**
   * @param {import("./api.js").Api} api
   * @param {{onFrame: (frame: {event: string, id: string|null, data: any}) => void,
   *          onPoll: () => void, onMode: (mode: string, text: string) => void}} handlers
   */
  constructor(api, handlers) {
    this.api = api;
    this.handlers = handlers;
    this.lastId = null;
    this.stopped = true;
    this.failures = 0;
    this.controller = null;
    this.pollTimer = null;
    this.retryTimer = null;
    this.watchdog = null;
    this.mode = "off";
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  stop() {
    this.stopped = true;
    if (this.controller) this.controller.abort();
    clearInterval(this.pollTimer);
    clearTimeout(this.retryTimer);
    clearTimeout(this.watchdog);
    this.pollTimer = this.retryTimer = this.watchdog = null;
    this.setMode("off", "");
  }

  setMode(mode, text) {
    this.mode = mode;
    this.handlers.onMode(mode, text);
  }

  startPolling(reason) {
    if (this.pollTimer === null) {
      this.pollTimer = setInterval(() => {
        if (!document.hidden) this.handlers.onPoll();
      }, POLL_MS);
    }
    this.setMode("polling", reason);
  }

  retryLater() {
    if (this.stopped) return;
    const delay = Math.min(MAX_BACKOFF_MS, 1000 * 2 ** Math.min(this.failures, 5));
    this.failures += 1;
    this.setMode("reconnecting", "Reconnecting…");
    // Nothing arrives while disconnected: refresh what is on screen meanwhile.
    this.handlers.onPoll();
    this.retryTimer = setTimeout(() => this.connect(), delay);
  }

  armWatchdog() {
    clearTimeout(this.watchdog);
    this.watchdog = setTimeout(() => {
      if (this.controller) this.controller.abort();
    }, SILENCE_MS);
  }

  async connect() {
    if (this.stopped) return;
    if (this.mode !== "polling") this.setMode("connecting", "Connecting…");
    const controller = new AbortController();
    this.controller = controller;
    const headers = this.api.headers({Accept: "text/event-stream"});
    if (this.lastId) headers["Last-Event-ID"] = this.lastId;
    let resp;
    try {
      resp = await fetch(this.api.url("jobs/stream"), {
        headers, signal: controller.signal, cache: "no-store", credentials: "omit",
        referrerPolicy: "no-referrer",
      });
    } catch {
      if (!this.stopped) this.retryLater();
      return;
    }
    const type = resp.headers.get("content-type") || "";
    if (resp.status === 401) {
      controller.abort();
      this.api.onUnauthorized();
      return;
    }
    if (resp.status === 400 && this.lastId) {
      // Our resume point is gone (pruned): start afresh, and refresh what is on screen.
      controller.abort();
      this.lastId = null;
      this.handlers.onPoll();
      this.connect();
      return;
    }
    if (!(resp.ok && type.startsWith("text/event-stream"))) {
      controller.abort();
      if (resp.ok || [404, 405, 501].includes(resp.status)) {
        this.startPolling("Polling every 5 s (this server does not stream)");
      } else {
        this.retryLater();
      }
      return;
    }
    this.failures = 0;
    clearInterval(this.pollTimer);
    this.pollTimer = null;
    this.setMode("live", "Live");
    await this.read(resp, controller);
    clearTimeout(this.watchdog);
    if (this.stopped) return;
    if (this.reconnectNow) {
      this.reconnectNow = false;
      this.connect();
    } else {
      this.retryLater();
    }
  }

  async read(resp, controller) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    let event = {name: "", data: [], id: undefined};
    this.armWatchdog();
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        this.armWatchdog();
        buffer += decoder.decode(value, {stream: true});
        let nl;
        while ((nl = buffer.indexOf("\n")) >= 0) {
          let line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + 1);
          if (line.endsWith("\r")) line = line.slice(0, -1);
          if (line === "") {
            this.dispatch(event, controller);
            event = {name: "", data: [], id: undefined};
          } else if (!line.startsWith(":")) {
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            let val = colon < 0 ? "" : line.slice(colon + 1);
            if (val.startsWith(" ")) val = val.slice(1);
            if (field === "event") event.name = val;
            else if (field === "data") event.data.push(val);
            else if (field === "id" && !val.includes("\0")) event.id = val;
          }
        }
      }
    } catch {
      // aborted (sign-out, watchdog) or the connection dropped: connect() decides
    }
  }

  dispatch(event, controller) {
    if (event.id !== undefined) this.lastId = event.id || null;
    const name = event.name || "message";
    if (name === "reconnect") {
      // The server's stream has reached its maximum age: resume at once.
      this.reconnectNow = true;
      controller.abort();
      return;
    }
    if (event.data.length === 0) return;
    let data;
    try {
      data = JSON.parse(event.data.join("\n"));
    } catch {
      return; // a frame this page does not understand
    }
    this.handlers.onFrame({event: name, id: event.id || null, data});
  }
}
