import assert from "node:assert/strict";
import { MaintenanceService } from "../core/maintenance.ts";
import { silentLogger } from "../core/log.ts";
import { waitFor } from "./support/db.ts";

/** Counts its rounds; the first `throwing` rounds throw. */
class Counter extends MaintenanceService {
  rounds = 0;
  firstWaits: boolean[] = [];
  constructor(readonly firstMs: number, readonly throwing = 0) {
    super("counter", silentLogger);
  }
  protected nextWaitMs(first: boolean): number {
    this.firstWaits.push(first);
    return first ? this.firstMs : 5;
  }
  protected round(): Promise<void> {
    this.rounds++;
    if (this.rounds <= this.throwing) return Promise.reject(new Error("boom"));
    return Promise.resolve();
  }
}

Deno.test("MaintenanceService runs rounds until stopped, and no round after stop()", async () => {
  const s = new Counter(0);
  await s.start();
  await waitFor("three rounds", () => s.rounds >= 3, 5_000, 1);
  await Promise.all([s.stop(), s.stop()]);
  await s.stop();
  const after = s.rounds;
  // A loop still running would count on within a few waits of 5 ms.
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(s.rounds, after);
  assert.equal(s.firstWaits[0], true);
  assert.ok(s.firstWaits.slice(1).every((f) => f === false));
  await assert.rejects(async () => await s.start(), /stopped/);
});

Deno.test("MaintenanceService waits its first interval before the first round when asked", async () => {
  const s = new Counter(60_000);
  await s.start();
  await s.stop();
  assert.equal(s.rounds, 0, "stopped during the first wait: no round ran");
});

Deno.test("MaintenanceService keeps its schedule when a round throws", async () => {
  const s = new Counter(0, 2);
  await s.start();
  await waitFor("rounds after the failing ones", () => s.rounds >= 4, 5_000, 1);
  await s.stop();
});

Deno.test("MaintenanceService refuses a second start", async () => {
  const s = new Counter(60_000);
  await s.start();
  await assert.rejects(async () => await s.start(), /already started/);
  await s.stop();
});
