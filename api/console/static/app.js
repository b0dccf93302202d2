// The console's one script, served from /console/app.js (the CSP allows no
// other). Pages are server-rendered shells; this script fetches each page's
// server-rendered, escaped HTML fragment with the bearer token the person
// typed, which lives in this tab's sessionStorage only: nothing is stored
// beyond the tab, and no cookie is ever set, so no other site can make the
// browser act with it.
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
  document.body.dataset.loaded = "true";
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
  loadFragment().catch((err) => showError(String(err)));
}

start();
