// Stands in for Supabase's Edge gateway in tests: /functions/v1/<name>/... goes to the same
// handler supabase/functions/<name>/index.ts serves, configured from the same secrets.
import { makeHandler, UPSTREAM_SECRETS, type FunctionName } from "../../../supabase/functions/_shared/sftq_proxy.ts";

const handlers = new Map<string, (req: Request) => Promise<Response>>();
for (const name of Object.keys(UPSTREAM_SECRETS) as FunctionName[]) {
  handlers.set(name, makeHandler(name));
}

Deno.serve({
  hostname: "127.0.0.1",
  port: Number(Deno.env.get("SFTQ_PROXY_PORT") ?? "0"),
  onListen: ({ port }) => console.log(`edge router listening on http://127.0.0.1:${port}`),
}, (req: Request) => {
  const name = new URL(req.url).pathname.split("/")[3] ?? "";
  const handler = handlers.get(name);
  if (handler === undefined) {
    return new Response(JSON.stringify({ error: "no such function", code: "not_found" }),
                        { status: 404, headers: { "content-type": "application/json" } });
  }
  return handler(req);
});
