/**
 * The console's page shells: server-rendered HTML without tenant data. A
 * browser cannot send a bearer token on a navigation, so each shell names
 * the fragment it shows (`data-fragment`), and /console/app.js fetches that
 * fragment with the token this tab holds; a shell that names a stream
 * (`data-live`) also follows it, and says whether it does (`#live`).
 */
import type { Child } from "hono/jsx";

/** The pages a shell can be. */
export type ShellPage = "login" | "runs" | "run" | "queue" | "workflows" | "schedules";

interface ShellProps {
  page: ShellPage;
  title: string;
  /** Where app.js fetches this page's content (the page's query string is appended). */
  fragment?: string;
  /** The stream of events after which app.js reloads the fragment (an open run's page). */
  live?: string;
  children?: Child;
}

function Shell({ page, title, fragment, live, children }: ShellProps) {
  return (
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width, initial-scale=1" />
        <title>{title} · poimen console</title>
        {/* No favicon request: an empty data: icon (the CSP allows data: images). */}
        <link rel="icon" href="data:," />
        <link rel="stylesheet" href="/console/console.css" />
        <script src="/console/app.js" defer></script>
      </head>
      <body data-page={page} data-fragment={fragment} data-live={live}>
        <header>
          <span class="brand">poimen</span>
          <nav>
            <a href="/console/runs">Runs</a>
            <a href="/console/queue">Queue</a>
            <a href="/console/workflows">Workflows</a>
            <a href="/console/schedules">Schedules</a>
          </nav>
          <button id="logout" class="quiet" type="button" hidden>Log out</button>
        </header>
        <div id="message" role="alert" hidden></div>
        {live
          ? (
            // Whether the page follows the run (app.js fills it in).
            <p id="live" class="live" role="status" hidden>
              <span id="live-text"></span>{" "}
              <button id="live-refresh" class="quiet" type="button" hidden>Reload</button>
            </p>
          )
          : ""}
        <main id="content">
          {children ?? <p class="muted">Loading…</p>}
          <noscript>
            The console needs its script (/console/app.js) to send your token.
          </noscript>
        </main>
      </body>
    </html>
  );
}

/** The whole document for a shell. */
export async function renderShell(props: ShellProps): Promise<string> {
  return "<!doctype html>" + await Promise.resolve(Shell(props).toString());
}

/** The login page: a token (and, for a service token, the tenant it acts for). */
export function loginShell(): Promise<string> {
  return renderShell({
    page: "login",
    title: "Log in",
    children: (
      <section class="login">
        <h1>Log in</h1>
        <p class="muted">
          Your API token is kept in this tab only (sessionStorage) and sent as a bearer token;
          closing the tab forgets it.
        </p>
        <form id="login" method="post" action="/console/login" autocomplete="off">
          <label>
            API token
            <input name="token" type="password" required autofocus />
          </label>
          <label>
            Tenant (service tokens only)
            <input name="tenant" type="text" />
          </label>
          <button type="submit">Log in</button>
        </form>
      </section>
    ),
  });
}
