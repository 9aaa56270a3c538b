"""A griffe extension: render the reStructuredText markup of asyncreplica's docstrings.

The docstrings are Google style, but they name objects with Sphinx roles
(``:class:`~asyncreplica.abc.Backend```) and introduce code blocks with ``::``. Markdown
would print both literally, so before mkdocstrings renders a docstring this turns

* a role into inline code: ``:func:`anyio.run``` becomes ``anyio.run`` in backticks, and
  ``:class:`~asyncreplica.abc.Backend``` becomes ``Backend`` (``~`` keeps the last part);
* a paragraph's trailing ``::`` into ``:`` (the indented block after it is already a
  Markdown code block), ``Example::`` into a bold label (a bare ``Example:`` would start a
  Google "Examples" section), and a line that is only ``::`` into nothing.

The source is untouched; only what the API reference shows changes.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj|const):`(~?)([^`]+)`")
LABEL = re.compile(r"^(\s*)(\w+)::\s*$")  # "Example::" alone on its line
TRAILING = re.compile(r"::\s*$")


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def convert(text: str) -> str:
    """Return ``text`` with Sphinx roles and ``::`` rewritten for Markdown."""
    lines = []
    for line in ROLE.sub(_role, text).splitlines():
        if line.strip() == "::":
            line = ""
        elif label := LABEL.match(line):
            line = f"{label[1]}**{label[2]}:**"
        else:
            line = TRAILING.sub(":", line)
        lines.append(line)
    return "\n".join(lines)


class RstMarkup(griffe.Extension):
    """Rewrite each docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Convert the docstring of every object griffe creates."""
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
