"""The documentation's examples run, and every page shows them exactly as they run.

Every code example in ``docs/*.md`` lives in ``docs/examples/`` (or a subfolder such as
``docs/examples/errors/``) as a script that asserts what the page claims. A page shows
the script's text inline, in a fence titled with its path
(```` ```python title="docs/examples/NAME.py" ````), so that it reads the same on the docs
site and as plain Markdown on a code host; ``scripts/sync_doc_examples.py`` copies the
files in. This module runs each script in a fresh interpreter, checks that each block
equals its file, that every script is shown, and that no page holds a snippet include
(``--8<--``), which a Markdown viewer prints as it is.

Examples that import PyTorch need it, and it is not in ``[test]`` (its default wheel
brings the CUDA libraries): they are skipped, with the reason, where torch is missing.
Examples that import JAX need it; ``[test]`` brings it, and where it is missing (an
install without the extra) they are skipped with the reason, as the JAX tests are.

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
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = sorted((DOCS / "examples").rglob("*.py"))
EXAMPLE_IDS = [p.relative_to(DOCS / "examples").as_posix() for p in EXAMPLES]
PAGES = sorted(DOCS.glob("*.md"))
# Every Markdown file a reader opens: the README and the pages, wherever they are.
MARKDOWN = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
# A pymdownx.snippets line (``--8<-- "file"``, or a bare ``--8<--`` opening a block).
SNIPPET = re.compile(r"^\s*;?-+8<-+")
TIMEOUT_S = 60
# Packages an example may import that a plain install lacks: module -> where to get it.
OPTIONAL = {
    "torch": "not in [test]: its default wheel brings the CUDA libraries, too heavy for CI",
    "jax": "pip install -e '.[test]' brings it",
}


def _imports(example: Path, module: str) -> bool:
    pattern = rf"^\s*(import|from) {module}(\.|\s|$)"
    return re.search(pattern, example.read_text(encoding="utf-8"), re.MULTILINE) is not None


def _sync() -> ModuleType:
    path = ROOT / "scripts" / "sync_doc_examples.py"
    spec = importlib.util.spec_from_file_location("sync_doc_examples", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


SYNC = _sync()


def _missing(example: Path) -> str | None:
    """Why ``example`` cannot run here (a package it imports is missing), or None."""
    for module, why in OPTIONAL.items():
        if _imports(example, module) and importlib.util.find_spec(module) is None:
            return f"{example.name} needs {module}, which is not installed ({why})"
    return None


def _shown(page: Path) -> list[str]:
    """The example files ``page`` shows, in order."""
    return [block.target for block in SYNC.blocks(page.read_text(encoding="utf-8"), page.name)]


@pytest.mark.parametrize("module", sorted(OPTIONAL))
def test_optional_examples_skip_only_where_their_package_is_missing(module: str) -> None:
    optional = [p for p in EXAMPLES if _imports(p, module)]
    assert optional, f"no docs/examples/**/*.py imports {module}"
    have = importlib.util.find_spec(module) is not None
    assert all((_missing(p) is None) == have for p in optional)
    plain = [p for p in EXAMPLES if not any(_imports(p, m) for m in OPTIONAL)]
    assert all(_missing(p) is None for p in plain)
    assert {p.name for p in EXAMPLES if p.name.startswith(f"{module}_")} <= {
        p.name for p in optional
    }


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


@pytest.mark.parametrize("page", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_no_snippet_includes(page: Path) -> None:
    # A code host or an editor shows an include line as it is, where the code should be.
    lines = page.read_text(encoding="utf-8").splitlines()
    found = [
        f"{page.name}:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if SNIPPET.match(line)
    ]
    assert not found, f"show the file's text inline (scripts/sync_doc_examples.py): {found}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_shown_examples_equal_their_files(page: Path) -> None:
    stale = SYNC.stale(page)
    assert not stale, f"run `python scripts/sync_doc_examples.py`: {stale}"


@pytest.mark.parametrize("example", EXAMPLES, ids=EXAMPLE_IDS)
def test_examples_can_be_shown_inline(example: Path) -> None:
    # A line of backticks would close the page's fence early.
    text = example.read_text(encoding="utf-8")
    assert "```" not in text, f"{example.name} holds ```, which would end the page's fence"


def test_every_example_is_shown_by_a_page() -> None:
    shown = {target for page in PAGES for target in _shown(page)}
    orphans = [
        str(p.relative_to(ROOT))
        for p in EXAMPLES
        if str(p.relative_to(ROOT).as_posix()) not in shown
    ]
    assert not orphans, f"examples no page shows: {orphans}"


def test_python_fences_that_name_a_file_are_example_blocks() -> None:
    # A typo in the opener (single quotes, another path) would escape the checks above.
    loose = re.compile(r"^\s*```\s*py(?:thon)?\b.*\btitle=")
    for page in PAGES:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if loose.match(line):
                assert SYNC.OPENER.match(line), (
                    f'{page.name}:{number}: write ```python title="docs/examples/NAME.py"'
                    f", got {line.strip()!r}"
                )


def test_sync_rewrites_a_stale_block_and_keeps_its_indentation() -> None:
    target = "docs/examples/quickstart.py"
    page = f'Text.\n\n  ```python title="{target}"\n  old\n\n  code\n  ```\n\nMore.\n'
    [block] = SYNC.blocks(page)
    assert block.target == target
    assert block.lines != SYNC.expected(block)
    new = SYNC.synced(page)
    [block] = SYNC.blocks(new)
    assert block.lines == SYNC.expected(block)
    body = "\n".join(line.removeprefix("  ") for line in block.lines) + "\n"
    assert body == (ROOT / target).read_text(encoding="utf-8")
    assert new.startswith("Text.\n\n  ```python title=")
    assert new.endswith("\n  ```\n\nMore.\n")
    assert "\n\n" in body  # blank lines of the file stay blank, without the indentation
    assert all(line == "" or line.startswith("  ") for line in block.lines)


def test_changelog_page_points_at_the_changelog() -> None:
    # docs/_ext/hooks.py shows CHANGELOG.md's text on the site; plain Markdown links to it.
    text = (DOCS / "changelog.md").read_text(encoding="utf-8")
    assert "](../CHANGELOG.md)" in text
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "_ext" / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.SHOWN_FROM_ROOT == {"changelog.md": "CHANGELOG.md"}


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
    shown = set(_shown(ERRORS_PAGE))
    for kind in ("broken", "fixed"):
        target = f"docs/examples/errors/{anchor}_{kind}.py"
        assert (ROOT / target).is_file(), f"{target} does not exist"
        assert target in shown, f"docs/errors.md does not show {target}"


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
