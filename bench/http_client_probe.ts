/**
 * One HTTP client of `POST /v1/runs`, measured alone in its own process (so
 * its CPU and RSS are its own), as the relay would use it: N admissions with
 * new keys, C in flight, through a service token. Run by the relay section:
 *
 *   deno run --allow-net --allow-env --allow-read=node_modules \
 *     bench/http_client_probe.ts <api url> <token> <tenant> <client> <N> <C>
 *
 * `client` is `fetch` (Deno's, through `PoimenClient.send`: what the relay
 * uses), `node-http` (node:http with a keep-alive agent of C sockets),
 * `undici` (a pool of C connections) or `undici-pipelined` (C/8 connections,
 * 8 requests pipelined on each). Prints one JSON line: rate, CPU per
 * request, peak RSS.
 */
import http from "node:http";
import process from "node:process";
import { Pool } from "undici";
import { PoimenClient } from "../client/http.ts";

const HTTP_CLIENTS = ["fetch", "node-http", "undici", "undici-pipelined"] as const;

const [url, token, tenant, client, n, c] = Deno.args;
const total = Number(n);
const inFlight = Number(c);
if (!HTTP_CLIENTS.includes(client as typeof HTTP_CLIENTS[number]) || !(total > 0 && inFlight > 0)) {
  console.error(
    `usage: http_client_probe.ts <url> <token> <tenant> <${HTTP_CLIENTS.join("|")}> <N> <C>`,
  );
  Deno.exit(2);
}
const origin = new URL(url);
const headers: Record<string, string> = {
  "content-type": "application/json",
  authorization: `Bearer ${token}`,
  "poimen-tenant": tenant,
  "poimen-source": "bench:http-client-probe",
};
const prefix = `${client}-${crypto.randomUUID()}`;
const body = (i: number) =>
  JSON.stringify({ workflow_ref: "echo", input: { n: 1 }, dispatch_key: `${prefix}-${i}` });

const poimen = new PoimenClient({ url, token, tenant });
const agent = new http.Agent({ keepAlive: true, maxSockets: inFlight });
const pipelined = client === "undici-pipelined";
const pool = new Pool(origin.origin, {
  connections: pipelined ? Math.max(1, Math.round(inFlight / 8)) : inFlight,
  pipelining: pipelined ? 8 : 1,
});

async function post(i: number): Promise<number> {
  if (client === "fetch") {
    return (await poimen.send("POST", "/v1/runs", {
      headers: { "content-type": "application/json", "poimen-source": headers["poimen-source"] },
      body: body(i),
    })).status;
  }
  if (client === "node-http") {
    return await new Promise((resolve, reject) => {
      const req = http.request(
        {
          agent,
          host: origin.hostname,
          port: origin.port,
          path: "/v1/runs",
          method: "POST",
          headers,
        },
        (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
          res.on("error", reject);
        },
      );
      req.on("error", reject);
      req.end(body(i));
    });
  }
  const res = await pool.request({ path: "/v1/runs", method: "POST", headers, body: body(i) });
  await res.body.text();
  return res.statusCode;
}

let next = 0;
let refused = 0;
let peakRss = 0;
const sampler = setInterval(() => peakRss = Math.max(peakRss, process.memoryUsage().rss), 100);
const cpu0 = process.cpuUsage();
const t0 = performance.now();
await Promise.all(Array.from({ length: inFlight }, async () => {
  for (let i = next++; i < total; i = next++) if ((await post(i)) !== 201) refused++;
}));
const seconds = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
clearInterval(sampler);
peakRss = Math.max(peakRss, process.memoryUsage().rss);
await pool.close();
agent.destroy();
console.log(JSON.stringify({
  client,
  prefix,
  rate: total / seconds,
  cpuUsPerRequest: (cpu.user + cpu.system) / total,
  peakRssMb: peakRss / 1e6,
  refused,
}));
