#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that the user-facing documentation agrees with itself and with bench/RESULTS.md.

  tools/docs_check.py [REPO_ROOT]

1. Links: every relative link in README.md, CONTRIBUTING.md, SECURITY.md, CHANGELOG.md,
   docs/*.md and bench/*.md resolves to a file or folder of the tree; a `#anchor` into a
   markdown file (or into the page itself) names one of its headings, by GitHub's slug rules
   (lower case, punctuation dropped, spaces to hyphens, repeats suffixed -1, -2, ...), or an
   explicit `<a name=...>` / `id=...`. Links inside code spans and fenced code are not links.
2. Figures: every row of the README's "Latest figures" table links the bench/RESULTS.md section
   it quotes (`[...](bench/RESULTS.md#<section>)`), and every ratio in that row (`1.23x`) occurs
   in that section of bench/RESULTS.md (the text from its heading to the next heading of the same
   or a higher level), as a whole number: `9.9x` does not match `19.9x` or `9.90x`.
3. Logs: every path under bench/logs/ a page names, in code spans and fenced code too, names a file
   that exists; `{a,b}` alternatives and `*` / `?` wildcards are expanded (a wildcard must match
   at least one file), so a log the page cites is not deleted while the citation stays.
4. Uncited logs: every file under bench/logs/ is named by one of those pages (a path, or a `{a,b}`
   or wildcard pattern that matches it), so raw output nobody cites does not pile up in the
   repository: a run's logs stay in its OUT folder unless a page quotes them.
5. Probes: every file under bench/probes/<family>/ is named in bench/probes/README.md, where each
   probe has the question it answers and the command that re-runs it.

Prints one line per problem, `file:line: what`, and exits 1 when there is any; 0 otherwise.
Python 3 standard library only.
"""
import re
import sys
from pathlib import Path

DOC_GLOBS = ("README.md", "CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md", "docs/*.md", "bench/*.md",
             "bench/probes/*.md")
RESULTS = "bench/RESULTS.md"
LOGS = "bench/logs"
PROBES = "bench/probes"
FIGURES_HEADING = "Latest figures"

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target "title") / ![alt](target); the text may hold one level of brackets.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_ANCHOR = re.compile(r"<a\s[^>]*(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
HTML_ID = re.compile(r"\sid\s*=\s*[\"']([^\"']+)[\"']", re.I)
RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)x(?![\w])")
LOG_PATH = re.compile(r"bench/logs/([\w{},*?.\-]+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def lines_outside_fences(text):
    """(line number, line) for each line that is not inside a fenced code block."""
    fenced = None
    for no, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fenced:
            if m and m.group(1)[0] == fenced[0] and len(m.group(1)) >= len(fenced):
                fenced = None
            continue
        if m:
            fenced = m.group(1)
            continue
        yield no, line


def strip_code_spans(line):
    return CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)


def github_slug(heading):
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # keeps letters, digits, '_', '-', ' '
    return text.replace(" ", "-")


def headings(text):
    """[(line number, level, text, slug)] with GitHub's -1, -2 suffixes for repeated slugs."""
    out, seen = [], {}
    for no, line in lines_outside_fences(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = github_slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append((no, len(m.group(1)), m.group(2), base if n == 0 else f"{base}-{n}"))
    return out


def anchors(text):
    found = {h[3] for h in headings(text)}
    for _, line in lines_outside_fences(text):
        found.update(HTML_ANCHOR.findall(line))
        found.update(HTML_ID.findall(line))
    return found


def expand_braces(pattern):
    """['a1x', 'a2x'] for 'a{1,2}x' (nested and repeated groups too)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    out = []
    for alt in m.group(1).split(","):
        out += expand_braces(pattern[: m.start()] + alt + pattern[m.end():])
    return out


def links(text):
    """(line number, target) of every inline link, image and reference definition."""
    for no, line in lines_outside_fences(text):
        plain = strip_code_spans(line)
        m = REF_DEF.match(plain)
        if m:
            yield no, m.group(1)
            continue
        for m in INLINE_LINK.finditer(plain):
            yield no, m.group(1)


class Checker:
    def __init__(self, root):
        self.root = Path(root).resolve()
        self.errors = []
        self._anchor_cache = {}
        self.cited_logs = set()  # files under bench/logs/ a page names, relative to it

    def error(self, path, line, what):
        rel = path.relative_to(self.root) if path.is_absolute() else path
        self.errors.append(f"{rel}:{line}: {what}")

    def anchors_of(self, path):
        if path not in self._anchor_cache:
            self._anchor_cache[path] = anchors(path.read_text(encoding="utf-8", errors="replace"))
        return self._anchor_cache[path]

    def doc_files(self):
        files = []
        for pattern in DOC_GLOBS:
            files.extend(sorted(self.root.glob(pattern)))
        return [f for f in files if f.is_file()]

    def check_links(self, path):
        text = path.read_text(encoding="utf-8", errors="replace")
        for no, raw in links(text):
            target = raw[1:-1] if raw.startswith("<") and raw.endswith(">") else raw
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue  # web and mail links are not checked
            file_part, _, anchor = target.partition("#")
            file_part = file_part.split("?", 1)[0]
            if file_part.startswith("/"):
                dest = self.root / file_part.lstrip("/")  # GitHub resolves /x from the repository root
            elif file_part:
                dest = (path.parent / file_part).resolve()
            else:
                dest = path
            try:
                dest.relative_to(self.root)
            except ValueError:
                self.error(path, no, f"link '{raw}' leaves the repository")
                continue
            if not dest.exists():
                self.error(path, no, f"broken link '{raw}': {dest.relative_to(self.root)} does not exist")
                continue
            if anchor and dest.is_file() and dest.suffix.lower() == ".md":
                if anchor.lower() not in {a.lower() for a in self.anchors_of(dest)}:
                    self.error(path, no, f"broken link '{raw}': no heading with anchor #{anchor} in "
                                         f"{dest.relative_to(self.root)}")

    def check_log_paths(self, path):
        text = path.read_text(encoding="utf-8", errors="replace")
        logs = self.root / "bench" / "logs"
        for no, line in enumerate(text.splitlines(), 1):
            for m in LOG_PATH.finditer(line):
                cited = m.group(1).rstrip(".,")
                if not cited.strip("*?{},."):
                    continue
                for name in expand_braces(cited):
                    if any(c in name for c in "*?"):
                        matches = [m for m in logs.glob(name) if m.is_file()]
                    else:
                        matches = [logs / name] if (logs / name).exists() else []
                    found = bool(matches)
                    self.cited_logs.update(m.relative_to(logs).as_posix() for m in matches)
                    if not found:
                        self.error(path, no, f"log 'bench/logs/{cited}': no file bench/logs/{name}")

    def check_uncited_logs(self):
        logs = self.root / LOGS
        if not logs.is_dir():
            return
        for path in sorted(p for p in logs.rglob("*") if p.is_file()):
            name = path.relative_to(logs).as_posix()
            if name not in self.cited_logs:
                self.error(path, 1, f"log '{LOGS}/{name}' is cited by no page (README.md, docs/, bench/*.md): "
                                    f"delete it or cite it where its figures are quoted")

    def check_probes_listed(self):
        probes = self.root / PROBES
        readme = probes / "README.md"
        if not probes.is_dir():
            return
        text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else ""
        for path in sorted(p for p in probes.glob("*/*") if p.is_file()):
            if path.name not in text:
                self.error(readme if readme.is_file() else path, 1,
                           f"probe '{path.relative_to(self.root).as_posix()}' is not listed in {PROBES}/README.md "
                           f"(the question it answers and the command that re-runs it)")

    def section_text(self, results_text, slug):
        """The text of the section whose heading has this slug, or None."""
        lines = results_text.splitlines()
        hs = headings(results_text)
        for i, (no, level, _, s) in enumerate(hs):
            if s != slug:
                continue
            end = len(lines)
            for no2, level2, _, _ in hs[i + 1:]:
                if level2 <= level:
                    end = no2 - 1
                    break
            return "\n".join(lines[no - 1:end])
        return None

    def check_figures(self, readme):
        results = self.root / RESULTS
        if not readme.is_file():
            return
        if not results.is_file():
            self.error(readme, 1, f"{RESULTS} is missing: the figures cannot be checked")
            return
        results_text = results.read_text(encoding="utf-8", errors="replace")
        text = readme.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
        hs = headings(text)
        start = next(((no, lvl) for no, lvl, t, _ in hs if t.strip() == FIGURES_HEADING), None)
        if start is None:
            self.error(readme, 1, f"no '{FIGURES_HEADING}' heading: the figures table cannot be checked")
            return
        end = next((no - 1 for no, lvl, _, _ in hs if no > start[0] and lvl <= start[1]), len(lines))
        rows = 0
        for no in range(start[0] + 1, end + 1):
            line = lines[no - 1]
            if not line.lstrip().startswith("|"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if all(re.fullmatch(r":?-{3,}:?", c) for c in cells if c):
                continue  # the delimiter row
            if rows == 0 and not any(RESULTS in c for c in cells):
                rows += 1  # the header row
                continue
            rows += 1
            self.check_figure_row(readme, no, cells, results_text)
        if rows <= 1:
            self.error(readme, start[0], f"the '{FIGURES_HEADING}' section has no figures table")

    def check_figure_row(self, readme, no, cells, results_text):
        refs = []
        for cell in cells:
            for m in INLINE_LINK.finditer(strip_code_spans(cell)):
                target = m.group(1).strip("<>")
                if target.split("#", 1)[0] == RESULTS and "#" in target:
                    refs.append(target.split("#", 1)[1])
        if not refs:
            self.error(readme, no, f"figures row names no section of {RESULTS} "
                                   f"(add a link [...]({RESULTS}#<section>))")
            return
        sections = []
        for slug in refs:
            section = self.section_text(results_text, slug)
            if section is None:
                self.error(readme, no, f"figures row links {RESULTS}#{slug}, a section that does not exist")
                return
            sections.append(section)
        # Ratios in the row's own cells: not in link targets, and the link cells' text included.
        quoted = []
        for cell in cells:
            plain = INLINE_LINK.sub(lambda m: m.group(0)[: m.group(0).find("](")], cell)
            quoted += RATIO.findall(plain)
        if not quoted:
            self.error(readme, no, "figures row quotes no ratio (e.g. 1.23x)")
        for value in quoted:
            pattern = re.compile(r"(?<![\w.])" + re.escape(value) + r"x(?![\w])")
            if not any(pattern.search(s) for s in sections):
                self.error(readme, no, f"figure {value}x is not in {RESULTS}#{' or #'.join(refs)}")

    def run(self):
        for path in self.doc_files():
            self.check_links(path)
            self.check_log_paths(path)
        self.check_figures(self.root / "README.md")
        self.check_uncited_logs()
        self.check_probes_listed()
        return self.errors


def main(argv):
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    errors = Checker(root).run()
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"docs_check: {len(errors)} problem(s)", file=sys.stderr)
        return 1
    print("docs_check: links, cited logs, probes and README figures agree")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
