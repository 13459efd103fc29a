"""The repository's Markdown files as the doc tests read them: their fenced code blocks, their
relative links, the anchors of their headings (as GitHub makes them) and their inline code.

The *guides* are README.md and docs/*.md: every code block in them is an example that
``./scripts/test`` runs or checks (test_docs_examples.py, test_docs_commands.py, and the Rust
doc tests that include these files). Every committed Markdown file has its links checked
(test_docs_links.py).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Folders that hold no Markdown of the repository's own (build outputs, environments, checkouts).
SKIPPED_DIRS = {"target", "node_modules", "shared", "__pycache__", "artifacts", "corpus"}


def guide_files() -> list[Path]:
    """README.md and every guide under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def markdown_files() -> list[Path]:
    """Every Markdown file of the repository (hidden folders and build outputs left out)."""
    found = []
    for path in sorted(REPO.rglob("*.md")):
        parts = path.relative_to(REPO).parts[:-1]
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts):
            continue
        found.append(path)
    return found


def rel(path: Path) -> str:
    """A path as the repository names it (for test ids and messages)."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it starts (the line of its opening fence), its info string and text."""

    path: Path
    line: int
    info: str
    text: str

    @property
    def lang(self) -> str:
        """The info string's first word (``python``, ``rust``, ``sh``, …), or ``""``."""
        return self.info.split(maxsplit=1)[0] if self.info.strip() else ""

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def _scan(text: str):
    """Yields ``(line number, line, state, block)`` for every line: ``state`` is ``None`` outside
    code blocks, else ``"open"``, ``"inside"`` or ``"close"``, and ``block`` the block's
    ``(first line, indent, fence, info, lines so far)``."""
    open_block = None
    for number, line in enumerate(text.splitlines(), start=1):
        m = _FENCE.match(line)
        if open_block is None:
            if m:
                open_block = (number, len(m["indent"]), m["fence"], m["info"].strip(), [])
                yield number, line, "open", open_block
            else:
                yield number, line, None, None
        else:
            start, indent, fence, info, lines = open_block
            if m and m["fence"][0] == fence[0] and len(m["fence"]) >= len(fence) and not m["info"].strip():
                yield number, line, "close", open_block
                open_block = None
            else:
                lines.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
                yield number, line, "inside", open_block


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order (indented ones, as in a list, dedented)."""
    blocks = []
    for _, _, state, block in _scan(path.read_text()):
        if state == "close":
            start, _, _, info, lines = block
            blocks.append(Block(path, start, info, "\n".join(lines) + "\n"))
    return blocks


def prose_lines(path: Path):
    """Yields ``(line number, line)`` for each line outside code blocks."""
    for number, line, state, _ in _scan(path.read_text()):
        if state is None:
            yield number, line


_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_LINK = re.compile(r"""<(?:a|img)\s[^>]*(?:href|src)\s*=\s*["']([^"']+)["']""")


def inline_code(path: Path):
    """Yields ``(line number, code)`` for each inline code span outside code blocks."""
    for number, line in prose_lines(path):
        for m in _INLINE_CODE.finditer(line):
            yield number, m.group(2).strip()


def links(path: Path):
    """Yields ``(line number, target)`` for each link or image outside code blocks and code spans:
    inline ``[text](target)``, reference definitions ``[x]: target``, HTML ``href``/``src``."""
    for number, line in prose_lines(path):
        plain = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        for pattern in (_LINK, _REF_DEF, _HTML_LINK):
            for m in pattern.finditer(plain):
                yield number, m.group(1)


def is_external(target: str) -> bool:
    """Whether a link leaves the repository on purpose (a URL, an e-mail address)."""
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text without Markdown, lower case, every character
    that is not a letter, mark, digit, ``_``, ``-`` or space dropped, and spaces made ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat[0] in "LMN" or ch in "_- ":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ANCHOR = re.compile(r"""<a\s[^>]*(?:id|name)\s*=\s*["']([^"']+)["']""")


def anchors(path: Path) -> set[str]:
    """Every anchor a link into ``path`` may name: its headings' slugs (a repeated one gets
    ``-1``, ``-2``, … as on GitHub) and explicit ``<a id=…>`` / ``<a name=…>``."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in prose_lines(path):
        m = _HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        for a in _HTML_ANCHOR.finditer(line):
            found.add(a.group(1))
    return found


def dead_links(path: Path, root: Path = REPO) -> list[str]:
    """The relative links of ``path`` that point nowhere: a file or folder that does not exist,
    one outside ``root`` (the repository), or an ``#anchor`` that no heading of the Markdown
    file makes. Each as ``file:line: target (why)``."""
    dead = []
    for number, target in links(path):
        if is_external(target):
            continue
        where = f"{rel(path)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_relative_to(root.resolve()):
            dead.append(f"{where} (outside the repository)")
        elif not dest.exists():
            dead.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{where} (no heading #{anchor} in {rel(dest)})")
    return dead
