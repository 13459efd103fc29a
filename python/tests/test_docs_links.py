"""Every relative link of every committed Markdown file points somewhere: an existing file or
folder of the repository and, for ``#anchor`` into a Markdown file, one of its headings. And the
guides name no path outside the repository, which a clone does not have."""

from __future__ import annotations

import re

import pytest
from markdown_docs import dead_links, guide_files, markdown_files, prose_lines, rel


@pytest.mark.parametrize("path", markdown_files(), ids=rel)
def test_relative_links_resolve(path):
    dead = dead_links(path)
    assert not dead, "dead links:\n" + "\n".join(dead)


#: A path that climbs out of the repository (``../shared/``, ``../../x``) from a guide.
_OUTSIDE = re.compile(r"(?<![\w.])\.\./(?:\.\./)*(shared|work|home|tmp)\b")


@pytest.mark.parametrize("path", guide_files(), ids=rel)
def test_guides_name_no_path_outside_the_repository(path):
    text = path.read_text()
    bad = [f"{rel(path)}: {m.group(0)}" for m in _OUTSIDE.finditer(text)]
    bad += [f"{rel(path)}:{n}: links above the repository" for n, line in prose_lines(path) if "](../../" in line]
    assert not bad, "paths outside the repository:\n" + "\n".join(bad)


def test_the_checker_finds_dead_links_and_anchors(tmp_path):
    """The check above can fail: a missing file, a missing heading and a link out of the tree."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "b.md").write_text("# Title\n\n## A `code` heading: with punctuation\n")
    page = tmp_path / "docs" / "a.md"
    page.write_text(
        "[ok](../b.md#a-code-heading-with-punctuation) [ok](../b.md#title) [web](https://example.com)\n"
        "[gone](../missing.md) [no anchor](../b.md#nowhere) [out](../../elsewhere.md)\n"
        "`[in code](../not-a-link.md)`\n\n```sh\n[in a block](../neither.md)\n```\n"
    )
    dead = dead_links(page, root=tmp_path)
    assert [d.split(": ", 1)[1] for d in dead] == [
        "../missing.md (no such file)",
        "../b.md#nowhere (no heading #nowhere in " + rel(tmp_path / "b.md") + ")",
        "../../elsewhere.md (outside the repository)",
    ], dead
