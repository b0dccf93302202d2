// The console's one script, served from /console/app.js (the CSP allows no
// other). Pages are server-rendered shells; this script fetches each page's
// server-rendered, escaped HTML fragment with the bearer token the person
// typed, which lives in this tab's sessionStorage only: nothing is stored
// beyond the tab, and no cookie is ever set, so no other site can make the
// browser act with it. An open run's page also reads the run's event stream
// (body data-live) and reloads its fragment on each event; the stream is
// fetched rather than opened with EventSource, which cannot send the token.
"use strict";

const TOKEN = "poimen.token";
const TENANT = "poimen.tenant";

function headers() {
  const h = { authorization: `Bearer ${sessionStorage.getItem(TOKEN) ?? ""}` };
  const tenant = sessionStorage.getItem(TENANT);
  if (tenant) h["poimen-tenant"] = tenant;
  return h;
}

function toLogin() {
  location.replace("/console/login");
}

// A problem+json body as one line of text for the person.
async function problemText(res) {
  try {
    const p = await res.json();
    const fields = (p.errors ?? []).map((e) => `${e.path}: ${e.message}`).join("; ");
    return [p.title, p.detail, fields].filter(Boolean).join(" — ");
  } catch {
    return `HTTP ${res.status}`;
  }
}

function showError(text) {
  const box = document.getElementById("message");
  box.textContent = text;
  box.hidden = false;
}

// Replaces the children of `target` with the fragment's nodes. DOMParser
// never runs scripts, and the server escaped every value it rendered; this
// is the only place HTML from the server enters the page.
function place(target, html) {
  const doc = new DOMParser().parseFromString(html, "text/html");
  target.replaceChildren(...Array.from(doc.body.childNodes, (n) => document.adoptNode(n)));
}

async function loadFragment() {
  const main = document.getElementById("content");
  const url = document.body.dataset.fragment + location.search;
  const res = await fetch(url, { headers: headers(), cache: "no-store" });
  if (res.status === 401) {
    sessionStorage.removeItem(TOKEN);
    return toLogin();
  }
  if (!res.ok) {
    main.replaceChildren();
    return showError(await problemText(res));
  }
  place(main, await res.text());
  showSignalOutcome();
  document.body.dataset.loaded = "true";
}

// Reloads the fragment after events, one load at a time: events that come
// during a load cost one more load, not one each.
let loading;
let loadAgain = false;
function refresh() {
  if (loading) {
    loadAgain = true;
    return loading;
  }
  loading = (async () => {
    do {
      loadAgain = false;
      await loadFragment();
    } while (loadAgain);
  })().finally(() => {
    loading = undefined;
  });
  return loading;
}

const FINAL = new Set(["succeeded", "failed", "cancelled"]);
// Stream openings in a row that brought no event before the page gives up
// following (an API that keeps ending streams: it is stopping).
const MAX_EMPTY_STREAMS = 5;

// Says on the page whether it follows the run; `reload` offers the button.
function setLive(state, text, reload) {
  const box = document.getElementById("live");
  box.dataset.state = state;
  document.getElementById("live-text").textContent = text;
  document.getElementById("live-refresh").hidden = !reload;
  box.hidden = false;
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

// Reads a server-sent event stream until it ends, calling `onEvent` for each
// event (an id: line); comment lines only keep it open, but `: reconnect`
// says the stream reached its lifetime (the run goes on). Resolves with how
// many events came, and whether it ended so.
async function readEvents(body, onEvent) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let events = 0;
  let reconnect = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return { events, reconnect };
    buffer += decoder.decode(value, { stream: true });
    const blocks = buffer.split(/\r?\n\r?\n/);
    buffer = blocks.pop();
    for (const block of blocks) {
      if (/^: ?reconnect/m.test(block)) reconnect = true;
      if (/^id:/m.test(block)) {
        events++;
        onEvent();
      }
    }
  }
}

let following;

// Follows the run while it is open: a stream resumed after the last event
// the fragment shows, a reload per event, a new stream when one is cut.
// Refused (busy, no stream in this browser, an error), the page stays as
// loaded and says to reload it: what it did before it was live.
async function follow() {
  following?.abort();
  const stop = new AbortController();
  following = stop;
  const url = document.body.dataset.live;
  let empty = 0;
  let opened = false;
  setLive("connecting", "Connecting to live updates…", false);
  while (!stop.signal.aborted) {
    const run = document.getElementById("run");
    // No run shown (not found, or an error): nothing to follow.
    if (!run) {
      document.getElementById("live").hidden = true;
      return;
    }
    if (FINAL.has(run.dataset.status)) {
      return setLive("final", `Run ${run.dataset.status}: no more updates.`, false);
    }
    if (typeof ReadableStream !== "function" || !("body" in Response.prototype)) {
      return setLive("off", "Not live: this browser cannot read a stream. Reload to update.", true);
    }
    // A stream cut without an event: the server's retry: interval before the next.
    if (empty > 0) await pause(2000, stop.signal);
    let res;
    try {
      res = await fetch(url, {
        headers: {
          ...headers(),
          accept: "text/event-stream",
          "last-event-id": run.dataset.eventSeq,
        },
        cache: "no-store",
        signal: stop.signal,
      });
    } catch {
      if (stop.signal.aborted) return;
      // Never opened (blocked, or no such route in front of the API): give up
      // at once; cut after it was live: try again.
      if (!opened) {
        return setLive("off", "Not live: the stream could not be opened. Reload to update.", true);
      }
    }
    if (res?.status === 401) {
      sessionStorage.removeItem(TOKEN);
      return toLogin();
    }
    if (res && !res.ok) {
      return setLive("off", `Not live (${await problemText(res)}). Reload to update.`, true);
    }
    let ended = { events: 0, reconnect: false };
    if (res?.body) {
      opened = true;
      setLive("live", "Live: this page updates as the run changes.", false);
      try {
        ended = await readEvents(res.body, () => {
          refresh().catch((err) => showError(String(err)));
        });
      } catch {
        if (stop.signal.aborted) return;
      }
    }
    // A stream that reached its lifetime is no sign of a stopping API.
    empty = ended.events > 0 || ended.reconnect ? 0 : empty + 1;
    if (empty >= MAX_EMPTY_STREAMS) {
      return setLive("off", "Not live: the stream keeps ending. Reload to update.", true);
    }
    // Ended: the run is final, or the stream was cut. The fragment says which.
    await refresh();
  }
}

async function reloadAndFollow() {
  document.getElementById("message").hidden = true;
  await refresh();
  await follow();
}

async function cancelRun(button) {
  button.disabled = true;
  const runId = button.dataset.cancel;
  const res = await fetch(`/v1/runs/${encodeURIComponent(runId)}/cancel`, {
    method: "POST",
    headers: headers(),
  });
  if (!res.ok) showError(await problemText(res));
  await loadFragment();
}

// The answer to the last signal sent from this page: kept across fragment
// reloads (the signal's own event reloads the fragment), shown as text.
let signalOutcome;

function showSignalOutcome() {
  const box = document.getElementById("signal-outcome");
  const form = document.getElementById("signal");
  if (!box || !form || signalOutcome?.runId !== form.dataset.signal) return;
  box.dataset.outcome = signalOutcome.kind;
  box.dataset.httpStatus = String(signalOutcome.status);
  box.textContent = signalOutcome.text;
  box.hidden = false;
}

// What each answer of POST /v1/runs/{id}/signals means for the person.
const SIGNAL_ANSWERS = {
  201: ["sent", "Sent (201)"],
  200: ["replayed", "Already sent (200), nothing new stored"],
  409: ["refused", "Refused (409): the run is finished and takes no more signals"],
  422: ["invalid", "Invalid (422)"],
};

async function sendSignal(form) {
  const runId = form.dataset.signal;
  const f = form.elements;
  const report = (kind, status, text) => {
    signalOutcome = { runId, kind, status, text };
    showSignalOutcome();
  };
  let payload;
  try {
    payload = JSON.parse(f.payload.value.trim() || "null");
  } catch (err) {
    return report("invalid", 0, `Not sent: the payload is not JSON (${err.message})`);
  }
  const body = { name: f.name.value, payload };
  if (f.signal_id.value.trim()) body.signal_id = f.signal_id.value.trim();
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  try {
    const res = await fetch(`/v1/runs/${encodeURIComponent(runId)}/signals`, {
      method: "POST",
      headers: { ...headers(), "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    if (res.status === 401) {
      sessionStorage.removeItem(TOKEN);
      return toLogin();
    }
    const [kind, label] = SIGNAL_ANSWERS[res.status] ?? ["error", `Failed (${res.status})`];
    if (res.ok) {
      const r = await res.json();
      const taken = r.consumed_by ? `taken by wait ${r.consumed_by}` : "kept until a wait takes it";
      report(
        kind,
        res.status,
        `${label}: signal ${r.name}, id ${r.signal_id}, ${taken}; the run is ${r.run_status}`,
      );
    } else report(kind, res.status, `${label}: ${await problemText(res)}`);
  } finally {
    button.disabled = false;
  }
}

async function logIn(form) {
  const token = form.elements.token.value.trim();
  const tenant = form.elements.tenant.value.trim();
  sessionStorage.setItem(TOKEN, token);
  if (tenant) sessionStorage.setItem(TENANT, tenant);
  else sessionStorage.removeItem(TENANT);
  const res = await fetch("/console/fragments/whoami", { headers: headers(), cache: "no-store" });
  if (!res.ok) {
    sessionStorage.removeItem(TOKEN);
    sessionStorage.removeItem(TENANT);
    return showError(await problemText(res));
  }
  location.assign("/console/runs");
}

function start() {
  const page = document.body.dataset.page;
  if (page === "login") {
    const form = document.getElementById("login");
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      logIn(form).catch((err) => showError(String(err)));
    });
    return;
  }
  if (!sessionStorage.getItem(TOKEN)) return toLogin();
  const logout = document.getElementById("logout");
  logout.hidden = false;
  logout.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN);
    sessionStorage.removeItem(TENANT);
    toLogin();
  });
  document.addEventListener("click", (e) => {
    const button = e.target instanceof Element ? e.target.closest("button[data-cancel]") : null;
    if (button) cancelRun(button).catch((err) => showError(String(err)));
  });
  // The signal form comes with the fragment: one listener for every load.
  document.addEventListener("submit", (e) => {
    const form = e.target instanceof HTMLFormElement && e.target.dataset.signal ? e.target : null;
    if (!form) return;
    e.preventDefault();
    sendSignal(form).catch((err) => showError(String(err)));
  });
  if (document.body.dataset.live) {
    document.getElementById("live-refresh").addEventListener("click", () => {
      reloadAndFollow().catch((err) => showError(String(err)));
    });
    reloadAndFollow().catch((err) => showError(String(err)));
    return;
  }
  loadFragment().catch((err) => showError(String(err)));
}

start();
