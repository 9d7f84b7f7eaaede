// The public API, as this page calls it. The key lives in sessionStorage only (this tab, gone
// when it closes) and leaves the page only as the Authorization header: never in a URL, a
// cookie (credentials: "omit") or a log line.

const KEY_NAME = "sftq.apiKey";
export const KEY_RE = /^sftq_[A-Za-z0-9_-]{8,200}$/;

export function loadKey() {
  try {
    const key = sessionStorage.getItem(KEY_NAME);
    return key && KEY_RE.test(key) ? key : null;
  } catch {
    return null;
  }
}

export function saveKey(key) {
  sessionStorage.setItem(KEY_NAME, key);
}

export function forgetKey() {
  try {
    sessionStorage.removeItem(KEY_NAME);
  } catch {
    // storage disabled: nothing was kept
  }
}

/** An answer other than 2xx, with the API's error envelope when there is one. */
export class ApiError extends Error {
  constructor(status, body) {
    const message = body && typeof body.error === "string" ? body.error
      : status === 0 ? "The server could not be reached." : `HTTP ${status}`;
    super(message);
    this.status = status;
    this.code = body && typeof body.code === "string" ? body.code : null;
    this.details = body ? body.details : undefined;
  }
}

export class Api {
  /**
   * @param {URL} base the jobs-api root, ending in "/" (the page lives at <base>dashboard)
   * @param {string} key
   * @param {() => void} onUnauthorized called when the key is refused (revoked, unknown)
   */
  constructor(base, key, onUnauthorized) {
    this.base = base;
    this.key = key;
    this.onUnauthorized = onUnauthorized;
  }

  url(path, query) {
    const url = new URL(path.replace(/^\//, ""), this.base);
    for (const [name, value] of Object.entries(query || {})) {
      if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, value);
    }
    return url;
  }

  headers(extra) {
    return {Authorization: `Bearer ${this.key}`, ...extra};
  }

  async request(method, path, {query, body, headers, signal} = {}) {
    const init = {
      method,
      headers: this.headers({Accept: "application/json", ...headers}),
      signal,
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    let resp;
    try {
      resp = await fetch(this.url(path, query), init);
    } catch (err) {
      if (err && err.name === "AbortError") throw err;
      throw new ApiError(0, null);
    }
    const text = await resp.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (resp.status === 401) {
      this.onUnauthorized();
      throw new ApiError(401, data);
    }
    if (!resp.ok) throw new ApiError(resp.status, data);
    return {data, status: resp.status, headers: resp.headers};
  }

  async get(path, query, opts) {
    return (await this.request("GET", path, {query, ...opts})).data;
  }
}
