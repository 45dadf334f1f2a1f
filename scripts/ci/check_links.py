#!/usr/bin/env python3
"""Checks that every relative link of the repository's Markdown files resolves: the file or
directory it names exists, and its `#anchor` (also a page's links to itself) is a heading of the
target page, slugged as GitHub slugs headings. Reference-style links must have a definition.
Links to other sites are not fetched (the suite stays on loopback). Code blocks and code spans
are skipped.

Usage: check_links.py [ROOT]   (exit 1 listing every broken link; scripts/ci/readme-check.sh
runs it)
"""

import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP_DIRS = {".git", "target", "node_modules"}


def markdown_files():
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(d, f)


def without_blocks(text):
    """`text` with fenced code blocks blanked (line numbers kept)."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", lambda m: "\n" * m.group(0).count("\n"), text,
                  flags=re.M | re.S)


def prose(text):
    """`text` with fenced code blocks and code spans blanked (line numbers kept)."""
    return re.sub(r"`[^`\n]*`", "``", without_blocks(text))


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    """Every heading anchor of the Markdown file at `path`, duplicates numbered as GitHub does."""
    if path not in _anchors:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            for line in without_blocks(f.read()).splitlines():
                m = re.match(r"^#{1,6} +(.*?)#*\s*$", line)
                if not m:
                    continue
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                out.add(base if n == 0 else f"{base}-{n}")
        _anchors[path] = out
    return _anchors[path]


def check_target(page, target, problems, where):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
        return  # another site, mailto:, ...
    path, _, fragment = target.partition("#")
    resolved = page if not path else os.path.normpath(os.path.join(os.path.dirname(page), path))
    if not os.path.exists(resolved):
        problems.append(f"{where}: `{target}`: no such file {os.path.relpath(resolved, ROOT)}")
        return
    if fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
        problems.append(f"{where}: `{target}`: {os.path.relpath(resolved, ROOT)} has no heading "
                        f"with anchor #{fragment}")


def check_page(page, problems):
    with open(page, encoding="utf-8") as f:
        text = prose(f.read())
    rel = os.path.relpath(page, ROOT)
    definitions = {}
    for m in re.finditer(r"^ {0,3}\[([^\]]+)\]:\s*(\S+)", text, re.M):
        definitions[m.group(1).lower()] = m.group(2)
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{n}"
        if re.match(r"^ {0,3}\[[^\]]+\]:\s", line):
            check_target(page, re.match(r"^ {0,3}\[[^\]]+\]:\s*(\S+)", line).group(1), problems, where)
            continue
        # inline links and images: [text](target "title")
        for m in re.finditer(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            check_target(page, m.group(1), problems, where)
        # reference links: [text][ref], [ref][], and [ref] alone when it names a definition
        for m in re.finditer(r"\[([^\[\]]+)\]\[([^\[\]]*)\]", line):
            ref = (m.group(2) or m.group(1)).lower()
            if ref not in definitions:
                problems.append(f"{where}: reference `[{ref}]` has no definition")
        for m in re.finditer(r"(?<![\]\\])\[([^\[\]\s]+)\](?![(\[:])", line):
            ref = m.group(1).lower()
            if "/" in ref or "-" in ref:  # shaped like a link label, not like `[N]` or `[x]`
                if ref not in definitions:
                    problems.append(f"{where}: reference `[{ref}]` has no definition")


def main():
    problems, pages = [], list(markdown_files())
    for page in pages:
        check_page(page, problems)
    for p in problems:
        print(f"FAIL  {p}", file=sys.stderr)
    print(f"links: {len(pages)} Markdown files; {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
