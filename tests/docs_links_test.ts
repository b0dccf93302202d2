/**
 * The README is the front door and docs/ the reference: the README stays at
 * most 250 lines, every relative link of README.md and docs/*.md reaches a
 * file (and a heading, when it names an anchor), and every repository file
 * they name in code (`contracts/runs.ts`) exists, so a rename or a split
 * cannot leave them pointing at nothing.
 */
import assert from "node:assert/strict";
import {
  codeSpans,
  docFiles,
  headingAnchors,
  isExternal,
  linkTargets,
  ROOT,
  slug,
} from "./support/markdown.ts";

const README_MAX_LINES = 250;

/** A repository path in a code span: relative, with a folder and a known extension. */
const FILE_PATH =
  /^(?:\.\.\/)?[A-Za-z0-9_.-]+(?:\/[A-Za-z0-9_.-]+)+\.(?:ts|tsx|js|mjs|md|sql|xml|yaml|yml|json|lua|png|css)$/;

async function exists(url: URL): Promise<boolean> {
  try {
    await Deno.stat(url);
    return true;
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return false;
    throw err;
  }
}

/**
 * The relative links of one file that lead nowhere, each as `target (why)`.
 * `anchorsOf` gives the anchors of a Markdown file by its URL.
 */
async function brokenLinks(
  path: string,
  text: string,
  anchorsOf: (url: URL) => Promise<Set<string>>,
): Promise<string[]> {
  const here = new URL(path, ROOT);
  const broken: string[] = [];
  for (const target of linkTargets(text)) {
    if (isExternal(target)) continue;
    const [file, anchor] = target.split("#", 2) as [string, string | undefined];
    if (file.startsWith("/")) {
      broken.push(`${target} (absolute: GitHub resolves it against the host, not the repository)`);
      continue;
    }
    const url = file === "" ? here : new URL(decodeURI(file), here);
    if (!url.href.startsWith(ROOT.href)) {
      broken.push(`${target} (outside the repository)`);
      continue;
    }
    if (!(await exists(url))) {
      broken.push(`${target} (no such file)`);
      continue;
    }
    if (anchor === undefined || anchor === "") continue;
    if (!url.pathname.endsWith(".md")) {
      broken.push(`${target} (an anchor into a file that is not Markdown)`);
      continue;
    }
    if (!(await anchorsOf(url)).has(decodeURIComponent(anchor))) {
      broken.push(`${target} (no heading with that anchor)`);
    }
  }
  return broken;
}

function anchorReader(): (url: URL) => Promise<Set<string>> {
  const cache = new Map<string, Set<string>>();
  return async (url) => {
    let anchors = cache.get(url.href);
    if (!anchors) {
      anchors = headingAnchors(await Deno.readTextFile(url));
      cache.set(url.href, anchors);
    }
    return anchors;
  };
}

Deno.test(`docs: README.md is the front door, at most ${README_MAX_LINES} lines`, async () => {
  const lines = (await Deno.readTextFile(new URL("README.md", ROOT))).trimEnd().split("\n").length;
  assert.ok(lines <= README_MAX_LINES, `README.md has ${lines} lines`);
});

Deno.test("docs: the Markdown reading finds links, anchors and code spans as GitHub does", () => {
  const text = [
    "# How admission stays exactly-once",
    "## `deno task up`",
    "## Runs: lifecycle and events",
    "## Runs: lifecycle and events",
    "See [the API](docs/api.md#the-run), ![shot](docs/console/run.png), [out](https://x.dev/a)",
    "and `[not a link](nowhere.md)` or `contracts/runs.ts`.",
    "```sh",
    "# not a heading",
    "[not a link either](gone.md)",
    "```",
    "[ref]: docs/kafka.md",
  ].join("\n");
  assert.deepEqual(
    [...headingAnchors(text)],
    [
      "how-admission-stays-exactly-once",
      "deno-task-up",
      "runs-lifecycle-and-events",
      "runs-lifecycle-and-events-1",
    ],
  );
  assert.equal(slug("The `RELAY_TOKEN` (a service token)"), "the-relay_token-a-service-token");
  assert.deepEqual(linkTargets(text), [
    "docs/api.md#the-run",
    "docs/console/run.png",
    "https://x.dev/a",
    "docs/kafka.md",
  ]);
  assert.deepEqual(codeSpans(text), [
    "deno task up",
    "[not a link](nowhere.md)",
    "contracts/runs.ts",
  ]);
});

Deno.test("docs: a link to a missing file, heading or outside the repository is reported", async () => {
  const text = [
    "[ok](docs/api.md#problems) [ok too](#here) [gone](relay/kafka.ts)",
    "[no anchor](docs/api.md#no-such-heading) [out](../../etc/passwd) [abs](/README.md)",
    "## Here",
  ].join("\n");
  const broken = await brokenLinks(
    "README.md",
    text,
    async (url) =>
      url.href === new URL("README.md", ROOT).href
        ? headingAnchors(text)
        : headingAnchors(await Deno.readTextFile(url)),
  );
  assert.deepEqual(broken.map((b) => b.split(" ")[0]), [
    "relay/kafka.ts",
    "docs/api.md#no-such-heading",
    "../../etc/passwd",
    "/README.md",
  ]);
});

Deno.test("docs: every relative link in README.md and docs/*.md resolves, anchors included", async () => {
  const docs = await docFiles();
  assert.ok(docs.length >= 8, `README.md and docs/*.md were read: ${docs.map((d) => d.path)}`);
  const anchorsOf = anchorReader();
  const broken: string[] = [];
  let links = 0;
  for (const { path, text } of docs) {
    links += linkTargets(text).length;
    for (const b of await brokenLinks(path, text, anchorsOf)) broken.push(`${path}: ${b}`);
  }
  assert.ok(links >= 30, `the links were found (${links})`);
  assert.deepEqual(broken, [], `links that lead nowhere:\n${broken.join("\n")}`);
});

Deno.test("docs: every repository file README.md and docs/*.md name in code exists", async () => {
  const missing: string[] = [];
  let named = 0;
  for (const { path, text } of await docFiles()) {
    for (const span of codeSpans(text)) {
      if (!FILE_PATH.test(span)) continue;
      named++;
      // Written from the repository root (`contracts/runs.ts`), or relative to the file.
      const candidates = [new URL(span, ROOT), new URL(span, new URL(path, ROOT))];
      const found = await Promise.all(candidates.map(exists));
      if (!found.some(Boolean)) missing.push(`${path}: ${span}`);
    }
  }
  assert.ok(named >= 10, `file paths were found in the docs (${named})`);
  assert.deepEqual(missing, [], `files the docs name that do not exist:\n${missing.join("\n")}`);
});
