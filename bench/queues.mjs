// Node (>= 22) side of `deno task bench`: pg-boss and graphile-worker, run
// as their users run them (in process, a pool of their own), installed into
// bench/.deps by the bench. Prints one JSON line on stdout.
//
//   node queues.mjs enqueue <pg-boss|graphile> <new|dup> <callers> <seconds> <prefix> <keys>
//   node queues.mjs work graphile <concurrency> <jobs> <prefix>
import { performance } from "node:perf_hooks";

const url = process.env.DATABASE_URL;
const [command, lib, ...rest] = process.argv.slice(2);
const WARMUP_MS = Number(process.env.BENCH_WARMUP_MS ?? 1000);

function quantile(sorted, p) {
  return sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

async function pgBoss() {
  const { PgBoss } = await import("pg-boss");
  const boss = new PgBoss({ connectionString: url, max: 10, supervise: false, schedule: false });
  boss.on("error", (err) => console.error(String(err)));
  await boss.start();
  // "short": one queued job per singletonKey (the unique index job_i1), which
  // is how pg-boss dedupes enqueues by key.
  await boss.createQueue("bench", { policy: "short" }).catch(() => {});
  return {
    add: async (key) => (await boss.send("bench", { n: 1 }, { singletonKey: key })) !== null,
    close: () => boss.stop({ graceful: false, wait: true }),
  };
}

async function graphile() {
  const gw = await import("graphile-worker");
  const utils = await gw.makeWorkerUtils({ connectionString: url });
  await utils.migrate();
  return {
    gw,
    utils,
    // addJob returns the job holding the key either way: whether it was new
    // is not told (the bench counts jobs per key in the database instead).
    add: async (key) => {
      await utils.addJob("enqueued", { n: 1 }, { jobKey: key, jobKeyMode: "unsafe_dedupe" });
      return undefined;
    },
    close: () => utils.release(),
  };
}

async function enqueue() {
  const [mode, callers, seconds, prefix, keys] = rest;
  const q = lib === "pg-boss" ? await pgBoss() : await graphile();
  const keyCount = Number(keys);
  const keyOf = mode === "new"
    ? (c, i) => `${prefix}-${c}-${i}`
    : (c, i) => `${prefix}-${(i * 7 + c) % keyCount}`;
  if (mode === "dup") {
    for (let k = 0; k < keyCount; k++) await q.add(`${prefix}-${k}`);
  }
  const latencies = [];
  let created = 0;
  const from = performance.now() + WARMUP_MS;
  const end = from + Number(seconds) * 1000;
  await Promise.all(Array.from({ length: Number(callers) }, async (_, c) => {
    for (let i = 0; performance.now() < end; i++) {
      const t0 = performance.now();
      const added = await q.add(keyOf(c, i));
      if (t0 >= from) {
        latencies.push(performance.now() - t0);
        if (added) created++;
      }
    }
  }));
  const elapsed = (performance.now() - from) / 1000;
  await q.close();
  latencies.sort((a, b) => a - b);
  console.log(JSON.stringify({
    ops: latencies.length,
    seconds: elapsed,
    rate: latencies.length / elapsed,
    p50_ms: quantile(latencies, 0.5),
    p99_ms: quantile(latencies, 0.99),
    created: lib === "pg-boss" ? created : null,
  }));
}

async function work() {
  const [concurrency, jobs, prefix] = rest;
  const n = Number(jobs);
  const q = await graphile();
  // Queued before the runner starts, as the poimen worker's runs are.
  for (let i = 0; i < n; i += 1000) {
    const specs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) {
      specs.push({ identifier: "noop", payload: { n: j }, jobKey: `${prefix}-${j}` });
    }
    await q.utils.addJobs(specs);
  }
  let executed = 0;
  let first = 0;
  let last = 0;
  const done = Promise.withResolvers();
  const runner = await q.gw.run({
    connectionString: url,
    concurrency: Number(concurrency),
    noHandleSignals: true,
    pollInterval: 1000,
    logger: new q.gw.Logger(() => () => {}),
    taskList: {
      noop: () => {
        if (executed === 0) first = performance.now();
        executed++;
        last = performance.now();
        if (executed === n) done.resolve();
      },
    },
  });
  await done.promise;
  // Until the last completion is written: graphile completes in batches.
  const client = await q.utils.withPgClient((c) =>
    (async () => {
      for (;;) {
        const { rows } = await c.query(
          "select count(*)::int as n from graphile_worker._private_jobs where key like $1",
          [`${prefix}-%`],
        );
        if (rows[0].n === 0) return performance.now();
        await new Promise((r) => setTimeout(r, 20));
      }
    })()
  );
  await runner.stop();
  await q.close();
  const seconds = (client - first) / 1000;
  console.log(
    JSON.stringify({
      jobs: n,
      executed,
      seconds,
      rate: n / seconds,
      handler_seconds: (last - first) / 1000,
    }),
  );
}

if (command === "enqueue") await enqueue();
else if (command === "work") await work();
else throw new Error(`unknown command ${command}`);
