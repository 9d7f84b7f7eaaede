// Thin forwarders from Supabase Edge Functions to finetune-queue's Python functions.
//
// Supabase serves $SUPABASE_URL/functions/v1/<name>/... only from Edge Functions (Deno); the
// queue's functions run on Cloud Run. Each of supabase/functions/{jobs-api,analytics,
// scheduler-tick}/index.ts calls serve(<its name>), and this module does the rest: it forwards
// the method, the path below the function's name, the query, the headers that matter and the
// body to the upstream URL named by a function secret, and streams the answer back as it
// arrives (server-sent events included). An upstream that cannot be reached is answered 502
// with the JSON error envelope; X-Request-Id is passed through, or made here.
//
// Secrets (supabase secrets set ...): SFTQ_UPSTREAM_JOBS_API, SFTQ_UPSTREAM_ANALYTICS and
// SFTQ_UPSTREAM_SCHEDULER_TICK, each the base URL of that function, e.g.
// https://sftq-jobs-api-123456789.europe-west1.run.app/functions/v1/jobs-api (Cloud Run
// services) or https://europe-west1-PROJECT.cloudfunctions.net/jobs-api (Cloud Run functions).
// SFTQ_MAX_BODY_BYTES caps request bodies (default 1 MiB, as the functions do).

export const UPSTREAM_SECRETS = {
  "jobs-api": "SFTQ_UPSTREAM_JOBS_API",
  "analytics": "SFTQ_UPSTREAM_ANALYTICS",
  "scheduler-tick": "SFTQ_UPSTREAM_SCHEDULER_TICK",
} as const;

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
      answer = await fetch(upstream.replace(/\/+$/, "") + rest + url.search, {
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
