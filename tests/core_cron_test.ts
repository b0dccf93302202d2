/**
 * Schedule times across daylight saving changes, with fixed instants (no
 * wall clock): Europe/Paris and America/New_York, spring and autumn, as
 * core/cron.ts documents them (Vixie cron's rules).
 */
import assert from "node:assert/strict";
import { cronProblem, nextOccurrence, occurrencesBetween } from "../core/cron.ts";

const iso = (ds: Date[]) => ds.map((d) => d.toISOString());

Deno.test("Europe/Paris spring forward: 02:30 does not exist, fires once at 03:00 CEST", () => {
  const got = occurrencesBetween(
    "30 2 * * *",
    "Europe/Paris",
    new Date("2026-03-28T00:00:00Z"),
    new Date("2026-03-30T23:59:00Z"),
  );
  assert.deepEqual(iso(got), [
    "2026-03-28T01:30:00.000Z", // 02:30 CET
    "2026-03-29T01:00:00.000Z", // the gap: 03:00 CEST, right after it
    "2026-03-30T00:30:00.000Z", // 02:30 CEST
  ]);
});

Deno.test("Europe/Paris fall back: 02:30 happens twice, fires once (the first)", () => {
  const got = occurrencesBetween(
    "30 2 * * *",
    "Europe/Paris",
    new Date("2026-10-24T00:00:00Z"),
    new Date("2026-10-26T23:59:00Z"),
  );
  assert.deepEqual(iso(got), [
    "2026-10-24T00:30:00.000Z",
    "2026-10-25T00:30:00.000Z", // 02:30 CEST; not 01:30Z (02:30 CET) again
    "2026-10-26T01:30:00.000Z",
  ]);
});

Deno.test("America/New_York spring forward: 02:30 fires once at 03:00 EDT", () => {
  const got = occurrencesBetween(
    "30 2 * * *",
    "America/New_York",
    new Date("2026-03-07T00:00:00Z"),
    new Date("2026-03-09T23:59:00Z"),
  );
  assert.deepEqual(iso(got), [
    "2026-03-07T07:30:00.000Z",
    "2026-03-08T07:00:00.000Z",
    "2026-03-09T06:30:00.000Z",
  ]);
});

Deno.test("America/New_York fall back: 01:30 fires once; an every-30-minutes keeps its interval", () => {
  assert.deepEqual(
    iso(occurrencesBetween(
      "30 1 * * *",
      "America/New_York",
      new Date("2026-10-31T00:00:00Z"),
      new Date("2026-11-02T23:59:00Z"),
    )),
    ["2026-10-31T05:30:00.000Z", "2026-11-01T05:30:00.000Z", "2026-11-02T06:30:00.000Z"],
  );
  assert.deepEqual(
    iso(occurrencesBetween(
      "*/30 * * * *",
      "America/New_York",
      new Date("2026-11-01T05:00:00Z"),
      new Date("2026-11-01T06:30:00Z"),
    )),
    [
      "2026-11-01T05:00:00.000Z",
      "2026-11-01T05:30:00.000Z",
      "2026-11-01T06:00:00.000Z",
      "2026-11-01T06:30:00.000Z",
    ],
  );
});

Deno.test("occurrences include both ends; next is strictly after", () => {
  const from = new Date("2026-01-01T00:00:00Z");
  assert.equal(
    occurrencesBetween("* * * * *", "UTC", from, new Date("2026-01-01T00:02:00Z")).length,
    3,
  );
  assert.equal(
    nextOccurrence("* * * * *", "UTC", from)?.toISOString(),
    "2026-01-01T00:01:00.000Z",
  );
  assert.equal(occurrencesBetween("* * * * *", "UTC", from, new Date("2027-01-01Z"), 5).length, 5);
});

Deno.test("cronProblem refuses what is not a 5-field cron in a known zone", () => {
  assert.equal(cronProblem("*/5 * * * *", "Europe/Paris"), undefined);
  assert.match(cronProblem("* * * * * *", "UTC") ?? "", /5 fields/);
  assert.match(cronProblem("* * * *", "UTC") ?? "", /5 fields/);
  assert.match(cronProblem("61 * * * *", "UTC") ?? "", /./);
  assert.match(cronProblem("* * * * *", "Mars/Olympus") ?? "", /time zone/);
  assert.match(cronProblem("0 0 30 2 *", "UTC") ?? "", /./);
});
