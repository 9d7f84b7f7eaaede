// Thin forwarders from Supabase Edge Functions to finetune-queue's Python functions.
//
// Supabase serves $SUPABASE_URL/functions/v1/<name>/... only from Edge Functions (Deno); the
// queue's functions run on Cloud Run. Each of supabase/functions/{jobs-api,analytics,
// scheduler-tick,webhook-deliver}/index.ts calls serve(<its name>), and this module does the
// rest: it forwards the method, the path below the function's name, the query, the headers
// that matter and the body to the upstream URL named by a function secret, and streams the
// answer back as it arrives (server-sent events included). An upstream that cannot be reached is answered 502
// with the JSON error envelope; X-Request-Id is passed through, or made here.
//
// Secrets (supabase secrets set ...): SFTQ_UPSTREAM_JOBS_API, SFTQ_UPSTREAM_ANALYTICS,
// SFTQ_UPSTREAM_SCHEDULER_TICK and SFTQ_UPSTREAM_WEBHOOK_DELIVER, each the base URL of that
// function, e.g. https://sftq-jobs-api-123456789.europe-west1.run.app/functions/v1/jobs-api
// (Cloud Run services) or https://europe-west1-PROJECT.cloudfunctions.net/jobs-api (Cloud Run
// functions). jobs-api's two stream routes (GET /jobs/stream, GET /jobs/{id}/stream) go to
// SFTQ_UPSTREAM_JOBS_STREAM, the jobs-stream function (ASGI, long requests), and to jobs-api's
// upstream when that is unset. SFTQ_MAX_BODY_BYTES caps request bodies (default 1 MiB, as the
// functions do).
//
// A stream through here lasts at most as long as the platform lets an Edge Function worker
// live (its wall-clock limit: 150 s on Supabase's free plan, 400 s on paid ones); the
// upstream then sees the client go, and the client resumes with Last-Event-ID, missing
// nothing (docs/api.md, Live updates).

export const UPSTREAM_SECRETS = {
  "jobs-api": "SFTQ_UPSTREAM_JOBS_API",
  "analytics": "SFTQ_UPSTREAM_ANALYTICS",
  "scheduler-tick": "SFTQ_UPSTREAM_SCHEDULER_TICK",
  "webhook-deliver": "SFTQ_UPSTREAM_WEBHOOK_DELIVER",
} as const;

/** jobs-api's stream routes go here when it is set (see streamPath). */
export const STREAM_UPSTREAM_SECRET = "SFTQ_UPSTREAM_JOBS_STREAM";

export type FunctionName = keyof typeof UPSTREAM_SECRETS;

// Request headers the functions read; nothing else of the caller's reaches them.
const FORWARDED = ["authorization", "content-type", "idempotency-key", "last-event-id", "accept"];
// Not passed back: they describe this hop's connection, not the answer (fetch has already
// undone any content encoding, and Deno frames the body itself).
const HOP_BY_HOP = new Set([
  "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
  "transfer-encoding", "upgrade", "content-encoding", "content-length",
]);
const DEFAULT_MAX_BODY_BYTES = 1_048_576;

export interface ProxyOptions {
  upstream?: string;
  /** jobs-api only: where the stream routes go (default: the secret, else `upstream`). */
  streamUpstream?: string;
  maxBodyBytes?: number;
}

function envelope(status: number, code: string, message: string, requestId: string,
                  extra: Record<string, string> = {}): Response {
  const headers = new Headers(extra);
  headers.set("content-type", "application/json");
  headers.set("x-request-id", requestId);
  return new Response(JSON.stringify({ error: message, code }), { status, headers });
}

/** The path below the function's name: Supabase hands a function /<name>/...; a router that
 *  keeps /functions/v1 in front (like the local gateway) works too. null: not this function. */
export function pathBelow(name: string, pathname: string): string | null {
  const path = pathname.startsWith("/functions/v1/") ? pathname.slice("/functions/v1".length)
                                                      : pathname;
  const prefix = `/${name}`;
  if (path !== prefix && !path.startsWith(`${prefix}/`)) return null;
  return path.slice(prefix.length);
}

/** Is this one of jobs-api's two stream routes, GET /jobs/stream or GET /jobs/{id}/stream?
 *  The same rule as the Python side (sftq_server.stream.paths.parse_stream_path), so that the
 *  stream function receives exactly the requests it serves. */
export function streamPath(method: string, rest: string): boolean {
  if (method !== "GET" && method !== "HEAD") return false;
  const parts = rest.replace(/^\/+|\/+$/g, "").split("/");
  return (parts.length === 2 && parts[0] === "jobs" && parts[1] === "stream") ||
    (parts.length === 3 && parts[0] === "jobs" && parts[1] !== "" && parts[2] === "stream");
}

/** The body, read whole up to the limit: the functions answer 413 past it anyway, and a
 *  buffered body reaches them with its Content-Length, which every WSGI server accepts. */
async function readBody(req: Request, limit: number): Promise<Uint8Array | null | "too large"> {
  if (req.body === null) return null;
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > limit) return "too large";
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = req.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      await reader.cancel();
      return "too large";
    }
    chunks.push(value);
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    body.set(chunk, at);
    at += chunk.byteLength;
  }
  return body;
}

export function makeHandler(name: FunctionName, options: ProxyOptions = {}):
    (req: Request) => Promise<Response> {
  const secret = UPSTREAM_SECRETS[name];
  return async (req: Request): Promise<Response> => {
    const requestId = req.headers.get("x-request-id") || crypto.randomUUID();
    const upstream = options.upstream ?? Deno.env.get(secret);
    if (!upstream) {
      return envelope(503, "not_configured",
                      `${secret} is not set: the ${name} proxy has nowhere to forward to`,
                      requestId);
    }
    const url = new URL(req.url);
    const rest = pathBelow(name, url.pathname);
    if (rest === null) return envelope(404, "not_found", "no such function", requestId);
    let target = upstream;
    if (name === "jobs-api" && streamPath(req.method, rest)) {
      target = options.streamUpstream ?? (Deno.env.get(STREAM_UPSTREAM_SECRET) || upstream);
    }
    const limit = options.maxBodyBytes ??
      Number(Deno.env.get("SFTQ_MAX_BODY_BYTES") || DEFAULT_MAX_BODY_BYTES);

    const headers = new Headers();
    for (const header of FORWARDED) {
      const value = req.headers.get(header);
      if (value !== null) headers.set(header, value);
    }
    headers.set("x-request-id", requestId);
    let body: Uint8Array | null = null;
    if (req.method !== "GET" && req.method !== "HEAD") {
      const read = await readBody(req, limit);
      if (read === "too large") {
        return envelope(413, "payload_too_large", `request body is larger than ${limit} bytes`,
                        requestId);
      }
      body = read;
    }

    let answer: Response;
    try {
      answer = await fetch(target.replace(/\/+$/, "") + rest + url.search, {
        // (a cast, not a generic: older TypeScript, as in some Edge runtimes, has no
        // Uint8Array<ArrayBuffer>, and newer TypeScript will not take Uint8Array as is)
        method: req.method, headers, body: body as BodyInit | null, redirect: "manual",
        signal: req.signal,
      });
    } catch (_err) {
      return envelope(502, "bad_gateway",
                      `the ${name} function could not be reached; retry shortly`, requestId,
                      { "retry-after": "5" });
    }
    const out = new Headers();
    answer.headers.forEach((value, key) => {
      if (!HOP_BY_HOP.has(key)) out.append(key, value);
    });
    out.set("x-request-id", answer.headers.get("x-request-id") || requestId);
    // The body is the upstream's stream: each chunk goes out as it comes in (SSE frames too).
    return new Response(answer.body, { status: answer.status, statusText: answer.statusText,
                                       headers: out });
  };
}

/** The entry point of supabase/functions/<name>/index.ts. SFTQ_PROXY_PORT (tests, local
 *  runs) listens on 127.0.0.1:<port>; on Supabase the runtime picks. */
export function serve(name: FunctionName): void {
  const handler = makeHandler(name);
  const port = Deno.env.get("SFTQ_PROXY_PORT");
  if (port) {
    Deno.serve({
      hostname: "127.0.0.1", port: Number(port),
      onListen: ({ port }) => console.log(`${name} proxy listening on http://127.0.0.1:${port}`),
    }, handler);
  } else {
    Deno.serve(handler);
  }
}
