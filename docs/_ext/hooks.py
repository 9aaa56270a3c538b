"""mkdocs hooks: pages whose text lives outside ``docs/``.

``docs/changelog.md`` is a link to the repository's ``CHANGELOG.md``, so that read as plain
Markdown (a repository browser, an editor) it sends the reader to the one changelog; on
the docs site this hook shows ``CHANGELOG.md``'s text in its place. (A snippet include
would print its ``--8<--`` line in a Markdown viewer.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# page under docs/ -> the file, relative to the repository's root, that the site shows.
SHOWN_FROM_ROOT = {"changelog.md": "CHANGELOG.md"}


def on_page_markdown(markdown: str, *, page: Any, **kwargs: Any) -> str:
    """Replace a page listed in ``SHOWN_FROM_ROOT`` by its file's text."""
    target = SHOWN_FROM_ROOT.get(page.file.src_uri)
    if target is None:
        return markdown
    return (ROOT / target).read_text(encoding="utf-8")
