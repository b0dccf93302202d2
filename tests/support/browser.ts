/**
 * Headless Chromium for tests that use the console as a person would:
 * Debian's `chromium` (CHROMIUM_PATH, default /usr/bin/chromium) driven by
 * playwright-core, with a fresh profile per browser and every background
 * service that would reach out to the network turned off, so the only
 * requests are the ones the page makes.
 */
import { type BrowserContext, chromium } from "playwright-core";

/** Where the browser binary is. */
export const CHROMIUM_PATH = Deno.env.get("CHROMIUM_PATH") ?? "/usr/bin/chromium";

const ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** A browser with a fresh profile; disposing closes it and removes the profile. */
export interface Browser extends AsyncDisposable {
  context: BrowserContext;
}

/** Starts headless Chromium with a new, empty profile directory. */
export async function launchBrowser(): Promise<Browser> {
  const profile = await Deno.makeTempDir({ prefix: "poimen-chromium-" });
  try {
    // A persistent context is how playwright takes a profile directory of
    // ours (it refuses --user-data-dir in args); it is new, hence fresh.
    const context = await chromium.launchPersistentContext(profile, {
      executablePath: CHROMIUM_PATH,
      headless: true,
      args: ARGS,
      viewport: { width: 1280, height: 800 },
    });
    return {
      context,
      async [Symbol.asyncDispose]() {
        await context.close();
        await Deno.remove(profile, { recursive: true }).catch(() => {});
      },
    };
  } catch (err) {
    await Deno.remove(profile, { recursive: true }).catch(() => {});
    throw err;
  }
}
