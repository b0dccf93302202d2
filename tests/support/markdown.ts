/**
 * Just enough Markdown for the documentation tests: the README and docs/*.md
 * files, their links, their headings' anchors as GitHub renders them, and
 * their inline code spans. Fenced code blocks are never read as prose.
 */

/** The repository root, as a file URL ending in `/`. */
export const ROOT = new URL("../../", import.meta.url);

/** One documentation file: its path from the root and its text. */
export interface Doc {
  path: string;
  text: string;
}

/** README.md and every `docs/*.md`, the README first. */
export async function docFiles(): Promise<Doc[]> {
  const out: Doc[] = [{
    path: "README.md",
    text: await Deno.readTextFile(new URL("README.md", ROOT)),
  }];
  const names: string[] = [];
  for await (const e of Deno.readDir(new URL("docs/", ROOT))) {
    if (e.isFile && e.name.endsWith(".md")) names.push(e.name);
  }
  for (const name of names.sort()) {
    out.push({
      path: `docs/${name}`,
      text: await Deno.readTextFile(new URL(`docs/${name}`, ROOT)),
    });
  }
  return out;
}

/** The text with every fenced code block blanked (line count kept). */
export function withoutFences(text: string): string {
  const lines = text.split("\n");
  let fence: string | null = null;
  return lines.map((line) => {
    const m = /^\s*(`{3,}|~{3,})/.exec(line);
    if (fence === null && m) {
      fence = m[1];
      return "";
    }
    if (fence !== null) {
      if (m && m[1][0] === fence[0] && m[1].length >= fence.length) fence = null;
      return "";
    }
    return line;
  }).join("\n");
}

/** Inline code spans of the prose (outside fenced blocks), their content trimmed. */
export function codeSpans(text: string): string[] {
  const prose = withoutFences(text);
  return [...prose.matchAll(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g)].map((m) =>
    m[2].replace(/\s+/g, " ").trim()
  );
}

/** Every link and image target of the prose, code spans and fences left out. */
export function linkTargets(text: string): string[] {
  const prose = withoutFences(text).replace(/(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/g, "code");
  const inline = [...prose.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)]
    .map((m) => m[1]);
  const reference = [...prose.matchAll(/^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)/gm)]
    .map((m) => m[1]);
  return [...inline, ...reference];
}

/** Whether a link target leaves the repository (a scheme, or protocol-relative). */
export function isExternal(target: string): boolean {
  return /^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith("//");
}

/**
 * The anchors GitHub gives a file's headings: the heading's text (inline
 * markup removed) lower-cased, punctuation dropped, each space a hyphen, and
 * `-1`, `-2`… after a repeated one.
 */
export function headingAnchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const line of withoutFences(text).split("\n")) {
    const m = /^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = slug(m[1]);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

/** One heading's anchor, as github-slugger makes it. */
export function slug(heading: string): string {
  const textOnly = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/<[^>]+>/g, "")
    .replace(/[`*~]/g, "");
  return textOnly.toLowerCase().replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "").replace(/ /g, "-");
}

/** The text under the heading `## title` (any level), up to the next heading of that level or higher. */
export function section(text: string, title: string): string {
  const lines = text.split("\n");
  // Headings are looked for outside fences: a shell comment is no heading.
  const prose = withoutFences(text).split("\n");
  const start = prose.findIndex((l) => new RegExp(`^#{1,6} ${escape(title)}\\s*$`).test(l));
  if (start < 0) throw new Error(`no heading "${title}"`);
  const level = /^#+/.exec(prose[start])![0].length;
  let end = lines.length;
  for (let i = start + 1; i < prose.length; i++) {
    const h = /^(#+) /.exec(prose[i]);
    if (h && h[1].length <= level) {
      end = i;
      break;
    }
  }
  return lines.slice(start, end).join("\n");
}

function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
