"""The documentation site builds cleanly, and every page is reachable from its navigation.

``mkdocs build --strict`` fails on a broken link, a missing snippet (the snippets
extension runs with ``check_paths``), a page left out of the nav, or a docstring the
API reference cannot render. It needs the ``[docs]`` extra; without mkdocs the build
test is skipped and says so. The nav checks need nothing beyond the standard library.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
BUILD_TIMEOUT_S = 300

# A nav entry is "- Title: page.md", one a line; read without YAML so that the check runs
# without the [docs] extra.
NAV_ENTRY = re.compile(r"^\s*-\s*[^:]+:\s*([\w./-]+\.md)\s*$", re.MULTILINE)


def _nav_pages() -> list[str]:
    text = CONFIG.read_text(encoding="utf-8")
    assert "\nnav:\n" in text, "mkdocs.yml has no nav"
    return NAV_ENTRY.findall(text.split("\nnav:\n", 1)[1])


def _doc_pages() -> list[str]:
    """Every markdown page under docs/, relative to it (the examples folder holds no pages)."""
    return sorted(
        p.relative_to(DOCS).as_posix()
        for p in DOCS.rglob("*.md")
        if "examples" not in p.relative_to(DOCS).parts
    )


def test_every_page_is_in_the_nav() -> None:
    nav = _nav_pages()
    missing = [page for page in _doc_pages() if page not in nav]
    assert not missing, f"pages missing from the nav of mkdocs.yml: {missing}"


def test_the_nav_lists_only_existing_pages_once() -> None:
    nav = [page for page in _nav_pages() if "://" not in page]
    assert len(nav) == len(set(nav)), f"a page appears twice in the nav: {nav}"
    absent = [page for page in nav if not (DOCS / page).is_file()]
    assert not absent, f"the nav lists pages that do not exist: {absent}"


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers", "ruff"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]' to build the site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(CONFIG),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,  # snippets resolve "docs/examples/..." and "CHANGELOG.md" from here
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, (
        f"mkdocs build --strict failed ({proc.returncode})\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )
    assert (tmp_path / "site" / "reference" / "asyncreplica" / "index.html").is_file()
    # The [docs] extra brings Ruff, so long signatures are wrapped, not one scrolling line.
    assert "Formatting signatures requires" not in proc.stdout + proc.stderr


def test_rst_markup_extension_rewrites_roles_and_literal_blocks() -> None:
    pytest.importorskip("griffe", reason="griffe comes with the [docs] extra")
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from rst_markup import convert
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    text = "See :class:`~asyncreplica.abc.Backend` and :func:`anyio.run`::\n\n    code\n"
    assert convert(text) == "See `Backend` and `anyio.run`:\n\n    code"
    assert convert("Example::\n\n    x = 1") == "**Example:**\n\n    x = 1"
    assert convert("::\n\n    x = 1") == "\n\n    x = 1"


def test_the_docs_extra_brings_a_signature_formatter() -> None:
    # mkdocstrings wraps long signatures with Ruff (or Black); without either it logs
    # "Formatting signatures requires either Black or Ruff" and renders one long line.
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"][
        "optional-dependencies"
    ]
    for extra in ("docs", "test"):  # the suite builds the site too
        names = {re.split(r"[<>=;\[ ]", dep, maxsplit=1)[0] for dep in extras[extra]}
        assert names & {"ruff", "black"}, f"[{extra}] has no signature formatter"
