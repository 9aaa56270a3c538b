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
    # the whole suite on both implementations of the hot path: compiled, then interpreted
    assert commands[1] == (
        'python3 -m pip install -e ".[test]" && python3 -m pytest'
        " && ASYNCREPLICA_NO_EXTENSIONS=1 python3 -m pytest"
    )
