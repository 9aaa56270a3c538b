"""A griffe extension: render the reStructuredText markup of asyncreplica's docstrings.

The docstrings are Google style, but they name objects with Sphinx roles
(``:class:`~asyncreplica.abc.Backend```) and introduce code blocks with ``::``. Markdown
would print both literally, so before mkdocstrings renders a docstring this turns

* a role into inline code: ``:func:`anyio.run``` becomes ``anyio.run`` in backticks, and
  ``:class:`~asyncreplica.abc.Backend``` becomes ``Backend`` (``~`` keeps the last part);
* a paragraph's trailing ``::`` into ``:`` (the indented block after it is already a
  Markdown code block), ``Example::`` into a bold label (a bare ``Example:`` would start a
  Google "Examples" section), and a line that is only ``::`` into nothing;
* a doctest block (lines from one starting with ``>>>`` to the next blank line, outside a
  literal block) into a fenced ``pycon`` block: Markdown would read its ``>>>`` prompts
  as three nested blockquotes and drop them.

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


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _fence_doctests(lines: list[str]) -> list[str]:
    """Wrap each doctest block of ``lines`` in a ``pycon`` fence, at its own indentation.

    A block inside a fence or inside an rST literal block (the more indented lines after a
    line ending in ``::``) is already code and stays as it is.
    """
    out: list[str] = []
    in_fence = False
    literal: int | None = None  # the indentation of the "::" line of the literal block
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if literal is not None and stripped and _indent(line) <= literal:
            literal = None
        if stripped.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and literal is None and stripped.startswith(">>>"):
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            pad = " " * _indent(line)
            out += [f"{pad}```pycon", *lines[i:end], f"{pad}```"]
            i = end
            continue
        elif not in_fence and stripped.endswith("::"):
            literal = _indent(line)
        out.append(line)
        i += 1
    return out


def convert(text: str) -> str:
    """Return ``text`` with Sphinx roles, ``::`` and doctests rewritten for Markdown."""
    lines = []
    for line in _fence_doctests(ROLE.sub(_role, text).splitlines()):
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
