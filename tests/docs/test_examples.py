"""The documentation's examples run, and every page includes only examples that exist.

Every code example in ``docs/*.md`` lives in ``docs/examples/`` (or a subfolder such as
``docs/examples/errors/``) as a script that asserts what the page claims; pages include
them with the pymdownx.snippets line ``--8<-- "docs/examples/NAME.py"``. This module runs
each script in a fresh interpreter and checks the includes in both directions.

Examples named ``torch_*.py`` need PyTorch, which is not in ``[test]`` (its default wheel
brings the CUDA libraries): they are skipped, with the reason, where torch is missing.

The one other include is ``docs/changelog.md``, which pulls in the repository's
``CHANGELOG.md`` as markdown (outside any fence); ``MARKDOWN_INCLUDES`` lists it.

It also checks the anchors of ``docs/errors.md``: each error's section has the anchor of
its code (``#ar103``, what ``asyncreplica explain AR103`` prints) and of its class name in
lowercase (``#replicaexitederror``, which other pages link to), and a broken and a fixed
example.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = sorted((DOCS / "examples").rglob("*.py"))
EXAMPLE_IDS = [p.relative_to(DOCS / "examples").as_posix() for p in EXAMPLES]
PAGES = sorted(DOCS.glob("*.md"))
INCLUDE = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$', re.MULTILINE)
TIMEOUT_S = 60
# Markdown files a page may include as markdown, outside a fence: page -> target.
MARKDOWN_INCLUDES = {"changelog.md": "CHANGELOG.md"}
# Examples that need a package outside [test], by file-name prefix: (module, why not in [test]).
OPTIONAL = {
    "torch_": ("torch", "its default wheel brings the CUDA libraries, too heavy for CI"),
}


def _missing(example: Path) -> str | None:
    """Why ``example`` cannot run here (a package it needs is missing), or None."""
    for prefix, (module, why) in OPTIONAL.items():
        if example.name.startswith(prefix) and importlib.util.find_spec(module) is None:
            return f"{example.name} needs {module}, which is not installed ({why})"
    return None


def _includes(page: Path) -> list[str]:
    """The examples ``page`` includes (not its allowed markdown include)."""
    allowed = MARKDOWN_INCLUDES.get(page.name)
    return [t for t in INCLUDE.findall(page.read_text(encoding="utf-8")) if t != allowed]


def test_markdown_includes_exist() -> None:
    for page, target in MARKDOWN_INCLUDES.items():
        assert (ROOT / target).is_file(), f"{target} does not exist"
        text = (DOCS / page).read_text(encoding="utf-8")
        assert f'--8<-- "{target}"' in text, f"docs/{page} does not include {target}"
        assert "```" not in text, f"docs/{page} includes {target} as markdown, outside a fence"


def test_optional_examples_skip_only_where_their_package_is_missing() -> None:
    torch_examples = [p for p in EXAMPLES if p.name.startswith("torch_")]
    assert torch_examples, "no docs/examples/**/torch_*.py found"
    have_torch = importlib.util.find_spec("torch") is not None
    assert all((_missing(p) is None) == have_torch for p in torch_examples)
    assert all(_missing(p) is None for p in EXAMPLES if not p.name.startswith("torch_"))


def test_there_are_examples_and_pages() -> None:
    assert EXAMPLES, "no docs/examples/*.py found"
    assert PAGES, "no docs/*.md found"


@pytest.mark.parametrize("example", EXAMPLES, ids=EXAMPLE_IDS)
def test_example_runs(example: Path) -> None:
    reason = _missing(example)
    if reason is not None:
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, str(example)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{example.relative_to(ROOT)} exited with {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_includes_use_the_checked_syntax(page: Path) -> None:
    # Any other spelling (single quotes, sections, inline) would escape the checks below.
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        if "--8<--" in line:
            assert INCLUDE.match(line), (
                f'{page.name}:{number}: write includes as --8<-- "docs/examples/NAME.py" '
                f"alone on a line, got {line!r}"
            )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_includes_point_at_existing_examples(page: Path) -> None:
    for target in _includes(page):
        assert (ROOT / target).is_file(), f"{page.name} includes {target!r}, which does not exist"
        assert target.startswith("docs/examples/"), (
            f"{page.name} includes {target!r}: examples live in docs/examples/"
        )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_includes_are_inside_python_fences(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    fence: str | None = None
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
        elif (match := INCLUDE.match(line)) and match[1] != MARKDOWN_INCLUDES.get(page.name):
            assert fence == "python", (
                f"{page.name}:{number}: the include must sit in a ```python fenced block"
            )


def test_every_example_is_included_by_a_page() -> None:
    included = {target for page in PAGES for target in _includes(page)}
    orphans = [
        str(p.relative_to(ROOT))
        for p in EXAMPLES
        if str(p.relative_to(ROOT).as_posix()) not in included
    ]
    assert not orphans, f"examples no page includes: {orphans}"


# docs/errors.md anchors ---------------------------------------------------------------

ERRORS_PAGE = DOCS / "errors.md"
ANCHOR = re.compile(r'<a id="([a-z0-9_-]+)"></a>')
# One section per exception: the anchor is the class name in lowercase, as messages print it.
ERROR_ANCHORS = [
    "asyncreplicaerror",
    "collectiveerror",
    "collectivemismatcherror",
    "replicaexitederror",
    "collectivetimeouterror",
    "collectivedeadlockerror",
    "replicacontexterror",
    "backenderror",
    "backendnotfounderror",
    "replicacancellederror",
    "internalerror",
]
# Where the library names an error kind for its last line: `see_also("ClassName")`.
LIBRARY_LINK = re.compile(r'(?:_see|see_also)\(\s*"([A-Za-z0-9_]+)"\s*\)')
PAGE_LINK = re.compile(r"errors\.md#([A-Za-z0-9_-]+)")


def _anchors() -> set[str]:
    return set(ANCHOR.findall(ERRORS_PAGE.read_text(encoding="utf-8")))


@pytest.mark.parametrize("anchor", ERROR_ANCHORS)
def test_errors_page_has_the_anchor(anchor: str) -> None:
    text = ERRORS_PAGE.read_text(encoding="utf-8")
    assert anchor in _anchors(), f'docs/errors.md has no <a id="{anchor}"></a>'
    # The anchor sits right before the section's heading (after the code's anchor), so
    # the link lands on it.
    following = text.split(f'<a id="{anchor}"></a>', 1)[1].lstrip("\n")
    assert following.startswith("## "), f"the anchor {anchor!r} must be followed by a heading"
    code = getattr(__import__("asyncreplica"), following[3:].split()[0]).code
    assert text.split(f'<a id="{anchor}"></a>', 1)[0].endswith(f'<a id="{code.lower()}"></a>\n')
    assert following.startswith(f"## {following[3:].split()[0]} ({code})\n")


@pytest.mark.parametrize("anchor", ERROR_ANCHORS)
def test_every_error_section_has_a_broken_and_a_fixed_example(anchor: str) -> None:
    included = set(_includes(ERRORS_PAGE))
    for kind in ("broken", "fixed"):
        target = f"docs/examples/errors/{anchor}_{kind}.py"
        assert (ROOT / target).is_file(), f"{target} does not exist"
        assert target in included, f"docs/errors.md does not include {target}"


def test_every_public_exception_has_an_anchor() -> None:
    import asyncreplica as ar

    exceptions = [
        name
        for name in ar.__all__
        if isinstance(getattr(ar, name), type) and issubclass(getattr(ar, name), BaseException)
    ]
    assert exceptions
    missing = sorted(name for name in exceptions if name.lower() not in _anchors())
    assert not missing, f"docs/errors.md has no section for {missing}"


def test_library_messages_point_at_existing_anchors() -> None:
    links: set[str] = set()
    for source in sorted((ROOT / "asyncreplica").rglob("*.py")):
        links.update(name.lower() for name in LIBRARY_LINK.findall(source.read_text("utf-8")))
    assert "collectivemismatcherror" in links, "found no see_also() in the library"
    missing = sorted(links - _anchors())
    assert not missing, f"messages link to docs/errors.md anchors that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_into_the_errors_page_resolve(page: Path) -> None:
    missing = sorted(set(PAGE_LINK.findall(page.read_text(encoding="utf-8"))) - _anchors())
    assert not missing, f"{page.name} links to docs/errors.md anchors that do not exist: {missing}"
