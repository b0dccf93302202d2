/**
 * The console's static files: its one script and one stylesheet, embedded
 * in the code (api/console/static/embedded.ts, written by `deno task embed`
 * from the files of api/console/static/) so the API process reads no file,
 * and served from memory under fixed same-origin paths, the only sources its
 * Content-Security-Policy allows.
 */
import { appJs, css } from "./static/embedded.ts";

/** The console's script and stylesheet. */
export interface ConsoleAssets {
  appJs: string;
  css: string;
}

/** The console's static files, as embedded. */
export function loadConsoleAssets(): ConsoleAssets {
  return { appJs, css };
}
