/**
 * The console's static files: its one script and one stylesheet, read once
 * at start-up (the API process may read api/console/static and nothing else)
 * and served from memory under fixed same-origin paths, the only sources its
 * Content-Security-Policy allows.
 */

/** The console's script and stylesheet. */
export interface ConsoleAssets {
  appJs: string;
  css: string;
}

/** Reads the console's static files. */
export async function loadConsoleAssets(): Promise<ConsoleAssets> {
  const read = (name: string) => Deno.readTextFile(new URL(`./static/${name}`, import.meta.url));
  const [appJs, css] = await Promise.all([read("app.js"), read("console.css")]);
  return { appJs, css };
}
