"""The README's example runs and prints what the README says; its commands are the CI's."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_example_prints_what_it_claims(tmp_path: pathlib.Path) -> None:
    code = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    claimed = re.search(r"print\(.*\)\s+# (.*)", code)
    assert claimed is not None
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == claimed.group(1)


def test_readme_error_excerpt_matches_the_real_message() -> None:
    import asyncio

    import asyncreplica as ar

    async def step() -> None:
        ctx = ar.get_replica_context()
        assert ctx is not None
        if ctx.replica_id_in_sync_group == 0:
            await ctx.all_reduce(ar.ReduceOp.SUM, 1.0)

    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    try:
        asyncio.run(strategy.run(step))
    except ar.ReplicaExitedError as error:
        message = str(error)
    excerpt = re.findall(
        r"```\n(asyncreplica\.ReplicaExitedError: .*?)\n\.\.\.\n```", README, re.S
    )[0]
    first = " ".join(
        excerpt.split("\n\n")[0].removeprefix("asyncreplica.ReplicaExitedError: ").split()
    )
    assert message.splitlines()[0] == first
    assert "  * replica 1 returned without making any collective" in message


def test_ci_runs_the_readme_test_command() -> None:
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(commands) == 2
    assert commands[0] == "python3 -m pip install . && asyncreplica demo"
    assert commands[1] in (ROOT / ".ci/run").read_text()
    # the whole suite on the compiled hot path, then on the interpreted one the tests that
    # run the library in process (tests/_passes.py; tests/test_passes.py checks the rule)
    assert commands[1] == (
        'python3 -m pip install -e ".[test]" && python3 -m pytest'
        ' && ASYNCREPLICA_NO_EXTENSIONS=1 python3 -m pytest -m "not out_of_process"'
    )


def test_getting_started_gives_the_readme_test_command() -> None:
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert f"```sh\n{commands[1]}\n```" in page


def test_the_readme_numbers_of_the_build_are_the_builds() -> None:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    modules = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["custom"]["modules"]
    text = " ".join(README.split())
    assert f"compiles {len(modules)} modules on the collective's path" in text
    assert f"`hot path: compiled (mypyc): {len(modules)} modules`" in text
    # The build's notice, as the README quotes it, is the one hatch_build.py prints.
    (quoted,) = re.findall(r"`asyncreplica: (compiled \d+ modules with mypyc [^`]*)`", text)
    assert quoted == f"compiled {len(modules)} modules with mypyc (into the wheel) in 50 s"
    hook = (ROOT / "hatch_build.py").read_text("utf-8")
    assert 'f"compiled {len(modules)} modules with mypyc "' in hook
    assert "f\"({'in place' if editable else 'into the wheel'}) in {info['seconds']} s\"" in hook
    page = " ".join((ROOT / "docs" / "getting-started.md").read_text("utf-8").split())
    assert f"`asyncreplica: compiled {len(modules)} modules with mypyc ... in N s`" in page
    from asyncreplica._compiled import Implementation

    assert Implementation(True, tuple(modules), "compiled", "").describe() == (
        f"compiled (mypyc): {len(modules)} modules"
    )


def _test_extra() -> list[tuple[str, str]]:
    """``[test]``'s requirements as ``(name with extras, environment marker)``."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    found = []
    for requirement in pyproject["project"]["optional-dependencies"]["test"]:
        spec, _, marker = requirement.partition(";")
        name = re.match(r"[A-Za-z0-9_.\-]+(\[[^\]]*\])?", spec.strip())
        assert name is not None, requirement
        found.append((name.group(0), marker.strip()))
    return found


# How the pages word an environment marker of [test].
MARKERS = {"sys_platform != 'win32'": "not on Windows", "sys_platform == 'linux'": "on Linux"}


def test_the_test_extra_is_described_exactly_where_its_command_is_given() -> None:
    """The README and getting-started.md name every package of [test], and no other."""
    names = [name for name, _ in _test_extra()]
    for path in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = " ".join(path.read_text(encoding="utf-8").split())
        start = text.index("is everything the suite checks (pyproject.toml lists it): ")
        described = text[start : text.index(". PyTorch is not in it", start)]
        missing = [name for name in names if name not in described]
        assert not missing, f"{path.name} does not name {missing} of [test]"
        for name, marker in _test_extra():
            if marker:
                assert MARKERS[marker] in described.split(name, 1)[1].split(";")[0], (
                    f"{path.name}: {name} is installed only {MARKERS[marker]}"
                )
        # Every package the paragraph names is in [test]: strip what it says about them.
        words = re.sub(r"\([^)]*\)", "", described.split(": ", 1)[1])
        named = {w.strip() for w in re.split(r";|,| and ", words) if w.strip()}
        assert named == set(names), f"{path.name} names {sorted(named - set(names))} too"
