/**
 * A durable run on its console page: its step timeline (ctx.step, ctx.sleep,
 * ctx.waitForSignal, in call order), what it waits for while waiting, and a
 * form to send it a signal. Rendered with hono's JSX, which escapes every
 * value (a step or signal name is whatever the handler chose). The form
 * posts nowhere by itself: /console/app.js sends it to
 * `POST /v1/runs/{id}/signals` with the tab's bearer token (no cookie, so
 * no other site can make the browser send it) and writes the answer into
 * `#signal-outcome` as text.
 */
import type { Run, RunStep, WaitingFor } from "../../contracts/runs.ts";

function When({ iso }: { iso: string | null }) {
  if (iso === null) return <span class="muted">—</span>;
  return <time datetime={iso}>{iso.replace("T", " ").replace(/\.\d+Z$/, "Z")}</time>;
}

function bytes(n: number | null): string {
  if (n === null) return "—";
  if (n < 1024) return `${n} B`;
  return `${(n / 1024).toFixed(1)} KiB`;
}

/** What a waiting run waits for: its sleep's end, or its signal and when the wait times out. */
export function DurableWait({ waiting }: { waiting: WaitingFor }) {
  if (waiting.reason === "sleep") {
    return (
      <>
        {"sleep "}
        <span class="mono" id="run-waiting-name">{waiting.name ?? ""}</span>
        {" until "}
        <span id="run-waiting-until">
          <When iso={waiting.until ?? null} />
        </span>
      </>
    );
  }
  return (
    <>
      {"signal "}
      <span class="mono" id="run-waiting-name">{waiting.name ?? ""}</span>
      {waiting.until
        ? (
          <>
            {", times out at "}
            <span id="run-waiting-until">
              <When iso={waiting.until} />
            </span>
          </>
        )
        : ", no timeout"}
    </>
  );
}

/** The run's durable calls in call order: name, kind, status, result size, when. */
export function StepTimeline({ steps }: { steps: RunStep[] }) {
  return (
    <>
      <h2>Steps</h2>
      {steps.length === 0
        ? <p class="muted" id="no-steps">No durable steps.</p>
        : (
          <table id="steps">
            <thead>
              <tr>
                <th>#</th>
                <th>Name</th>
                <th>Kind</th>
                <th>Status</th>
                <th>Size</th>
                <th>Started</th>
                <th>Completed</th>
                <th>Until</th>
              </tr>
            </thead>
            <tbody>
              {steps.map((s) => (
                <tr data-step={s.name} data-kind={s.kind} data-step-status={s.status}>
                  <td>{String(s.seq)}</td>
                  <td class="mono">
                    {s.name}
                    {s.signal_name !== null && s.signal_name !== s.name
                      ? <span class="muted">{` (signal ${s.signal_name})`}</span>
                      : ""}
                  </td>
                  <td>{s.kind}</td>
                  <td>
                    <span class={`status status-${s.status}`}>{s.status}</span>
                    {s.error !== null ? <span class="step-error">{` ${s.error}`}</span> : ""}
                  </td>
                  <td>{bytes(s.size)}</td>
                  <td>
                    <When iso={s.started_at} />
                  </td>
                  <td>
                    <When iso={s.completed_at} />
                  </td>
                  <td>
                    <When iso={s.until} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
    </>
  );
}

/** Whether the run can still take a signal (a final run answers 409). */
export function signalable(run: Run): boolean {
  return run.status === "queued" || run.status === "running" || run.status === "waiting";
}

/**
 * The form that sends the run a signal. The signal's name defaults to the
 * one a waiting run waits for.
 */
export function SignalForm({ run }: { run: Run }) {
  const waitingFor = run.waiting_for?.reason === "signal" ? run.waiting_for.name ?? "" : "";
  return (
    <>
      <h2>Send a signal</h2>
      <form id="signal" class="signal" data-signal={run.run_id} method="post" action="#">
        <label>
          Name
          <input name="name" type="text" required maxLength={200} value={waitingFor} />
        </label>
        <label>
          Payload (JSON)
          <textarea name="payload" rows={3} spellcheck={false}>{"{}"}</textarea>
        </label>
        <label>
          Signal id (optional: the same id is one signal)
          <input name="signal_id" type="text" maxLength={255} />
        </label>
        <button type="submit">Send signal</button>
      </form>
      <p id="signal-outcome" role="status" hidden></p>
    </>
  );
}
