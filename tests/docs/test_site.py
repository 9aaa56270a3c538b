"""The documentation site builds cleanly, and every page is reachable from its navigation.

``mkdocs build --strict`` fails on a broken link, a page left out of the nav, or a
docstring the API reference cannot render. The built HTML is checked too: the API
reference's doctest examples are code blocks with their ``>>>`` prompts, each "Returns:"
section is one row, and pages show their examples and the changelog. It needs the ``[docs]`` extra; without mkdocs the build
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


# A Markdown link's target: ``[text](target)`` or ``[text](target#anchor)``.
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def test_every_page_is_linked_from_the_home_page_with_a_line_that_says_what_it_covers() -> None:
    """On a code host there is no nav: index.md's table is the way to every page."""
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| [")]
    linked: dict[str, str] = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 2, f"a row of index.md's table has {len(cells)} cells: {row}"
        targets = LINK.findall(cells[0])
        assert len(targets) == 1, f"a row of index.md's table links {targets}: {row}"
        assert cells[1], f"index.md's row for {targets[0]} says nothing about it"
        linked[targets[0]] = cells[1]
    pages = [page for page in _doc_pages() if page != "index.md"]
    missing = [page for page in pages if page not in linked]
    assert not missing, f"pages index.md's table does not link: {missing}"
    absent = [target for target in linked if not (DOCS / target).is_file()]
    assert not absent, f"index.md's table links pages that do not exist: {absent}"


def _markdown_files() -> list[Path]:
    """Every Markdown file a reader opens on a code host: the README, the changelog, the pages."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *(DOCS / page for page in _doc_pages())]


def test_relative_links_resolve_when_read_as_plain_markdown() -> None:
    """A code host resolves a link against the file's folder; the site is checked by mkdocs."""
    broken = []
    for path in _markdown_files():
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # code blocks
        text = re.sub(r"`[^`\n]*`", "", text)  # inline code
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, f"links that lead nowhere on a code host: {broken}"


def test_generated_pages_say_how_to_read_them_as_plain_markdown() -> None:
    """A ``::: module`` directive is all a code host shows of an API page: say where the text is."""
    for page in _doc_pages():
        text = (DOCS / page).read_text(encoding="utf-8")
        for module in re.findall(r"^::: ([\w.]+)$", text, flags=re.MULTILINE):
            said = " ".join(text.split(":::", 1)[0].split())
            assert f"`python3 -m pydoc {module}` shows the same text" in said, page


def test_the_readme_links_every_guide_of_the_home_page() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    linked = {target.removeprefix("docs/") for target in LINK.findall(readme)}
    guides = [page for page in _doc_pages() if "/" not in page and page != "changelog.md"]
    missing = [page for page in guides if page not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_nav_lists_only_existing_pages_once() -> None:
    nav = [page for page in _nav_pages() if "://" not in page]
    assert len(nav) == len(set(nav)), f"a page appears twice in the nav: {nav}"
    absent = [page for page in nav if not (DOCS / page).is_file()]
    assert not absent, f"the nav lists pages that do not exist: {absent}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``mkdocs build --strict``; the folder of its HTML."""
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers", "ruff"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[docs]' to build the site")
    out = tmp_path_factory.mktemp("site") / "site"
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
            str(out),
        ],
        cwd=ROOT,  # the hooks and the API reference resolve their paths from here
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
    # The [docs] extra brings Ruff, so long signatures are wrapped, not one scrolling line.
    assert "Formatting signatures requires" not in proc.stdout + proc.stderr
    return out


def _reference_pages(site: Path) -> dict[str, str]:
    pages = {p.parent.name: p.read_text("utf-8") for p in (site / "reference").glob("*/index.html")}
    assert "asyncreplica" in pages, sorted(pages)
    return pages


@pytest.mark.slow
def test_mkdocs_build_strict(site: Path) -> None:
    assert (site / "reference" / "asyncreplica" / "index.html").is_file()


@pytest.mark.slow
def test_doctest_examples_render_as_code_with_their_prompts(site: Path) -> None:
    # Markdown reads ">>>" as three nested blockquotes and drops the prompts; the griffe
    # extension fences each doctest block as pycon.
    for name, html in _reference_pages(site).items():
        assert not re.search(r"<blockquote>\s*<blockquote>", html), f"{name}: nested blockquotes"
        outside_code = re.sub(r'<div class="highlight">.*?</div>', "", html, flags=re.S)
        assert "&gt;&gt;&gt;" not in outside_code, f"{name}: a >>> prompt outside a code block"
        assert not re.search(r"<p>import ", outside_code), f"{name}: a doctest without prompts"
    html = _reference_pages(site)["asyncreplica"]
    # the package's own example, first on its page, with its prompts
    first = html.index('<div class="highlight">')
    assert html.index("asyncreplica: tf.distribute") < first
    assert re.match(
        r'<div class="highlight"><pre><span></span><code><span class="gp">&gt;&gt;&gt; </span>'
        r'<span class="kn">import</span>',
        html[first:],
    )
    prompts = len(re.findall(r'<span class="gp">&gt;&gt;&gt; </span>', html))
    assert prompts >= 30, f"only {prompts} >>> prompts on the asyncreplica page"


RETURNS_TABLE = re.compile(
    r'<span class="doc-section-title">Returns:</span></p>\s*<table>.*?<tbody>(.*?)</tbody>', re.S
)


@pytest.mark.slow
def test_each_returns_section_is_one_row(site: Path) -> None:
    # griffe reads each line of a "Returns:" section as its own value unless
    # returns_multiple_items is off (mkdocs.yml): a wrapped sentence became 2-3 rows.
    count = 0
    for name, html in _reference_pages(site).items():
        for body in RETURNS_TABLE.findall(html):
            count += 1
            rows = body.count('<tr class="doc-section-item">')
            assert rows == 1, f"{name}: a Returns table of {rows} rows: {body[:600]}"
    assert count >= 20, f"found only {count} Returns tables"
    html = _reference_pages(site)["asyncreplica"]
    at = html.index('id="asyncreplica.ReplicaContext.all_reduce"')
    body = RETURNS_TABLE.search(html, at)
    assert body is not None
    assert "each\nreplica&#39;s own view" in body[1] or "each\nreplica's own view" in body[1]


@pytest.mark.slow
def test_pages_show_their_examples_and_the_changelog(site: Path) -> None:
    # The example files are inline in the pages, titled with their path; the changelog
    # page shows CHANGELOG.md (docs/_ext/hooks.py).
    home = (site / "index.html").read_text("utf-8")
    assert '<span class="filename">docs/examples/quickstart.py</span>' in home
    assert "--8&lt;--" not in home
    changelog = (site / "changelog" / "index.html").read_text("utf-8")
    assert ">Unreleased<" in changelog
    assert "Keep a Changelog" in changelog


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
    # A doctest block becomes a pycon fence at its own indentation (inside an "Example:"
    # section too); one in a literal block or a fence stays as it is.
    assert convert("Run:\n\n>>> f(1)\n2\n\nThen.") == "Run:\n\n```pycon\n>>> f(1)\n2\n```\n\nThen."
    assert convert("Example:\n    >>> f(1)\n    2") == (
        "Example:\n    ```pycon\n    >>> f(1)\n    2\n    ```"
    )
    literal = "Like this::\n\n    >>> f(1)\n    2\n\nAfter."
    assert convert(literal) == "Like this:\n\n    >>> f(1)\n    2\n\nAfter."
    fenced = "```python\n>>> f(1)\n```"
    assert convert(fenced) == fenced


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
