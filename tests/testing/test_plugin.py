"""The pytest plugin asyncreplica.testing._plugin: fixtures, options and schedule fuzzing.

Each test writes a small test file and runs pytest on it in-process (pytester), with the
plugin enabled by ``-p``. ``-p no:asyncreplica`` first blocks the plugin's entry point, so
the module is registered once whether or not the package's entry point is installed.
"""

from __future__ import annotations

import re
import zlib
from typing import ClassVar

import numpy  # noqa: F401  # imported once here: the in-process inner runs cannot re-import it
import pytest
from anyio.pytest_plugin import get_available_backends

import asyncreplica as ar
from asyncreplica import _registry
from asyncreplica.abc import Backend
from asyncreplica.testing import _plugin

pytest_plugins = ["pytester"]

# hypothesis's and pytest-benchmark's plugins are switched off: the inner runs do not need
# them, and re-importing hypothesis in every inner run costs seconds.
COMMON = (
    "-p",
    "no:hypothesispytest",
    "-p",
    "no:benchmark",
    "-p",
    "no:asyncreplica",
    "-p",
    "asyncreplica.testing._plugin",
)
# pytest-asyncio is switched off too, except in the tests that run under it (below).
PLUGIN = (*COMMON, "-p", "no:asyncio")

REPLICAS_TEST = """
import asyncreplica as ar

def test_replicas(strategy):
    assert isinstance(strategy, ar.MirroredStrategy)
    print("REPLICAS", strategy.num_replicas_in_sync, strategy.schedule)
"""

# An order-dependent bug: replica 0 fills a table that the other replicas read before any
# collective, assuming replica 0 has run first. It has in the fifo schedule (replicas start
# in replica order); a random schedule starts them in another order, five runs in a row.
ORDER_TEST = """
import anyio
import pytest
import asyncreplica as ar

@pytest.mark.asyncreplica(replicas=[4])
def test_order(strategy):
    starts = []

    async def step():
        ctx = ar.get_replica_context()
        rid = ctx.replica_id_in_sync_group
        starts.append(rid)
        if rid == 0:
            shared["table"] = [1.0, 2.0]
        table = shared["table"]  # the bug: KeyError when replica 0 has not run yet
        await ctx.barrier()
        return len(table)

    async def main():
        await strategy.run(step)

    try:
        for _ in range(5):
            shared = {}
            anyio.run(main)
    finally:
        print("ORDER", starts)
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*PLUGIN, "-s", *args)


@pytest.fixture(autouse=True)
def _numpy_and_registered_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    # The outcomes below count numpy and the backends these tests register; the cupy
    # entry point is installed too, but whether it runs depends on the machine's GPUs.
    from asyncreplica._registry import available_backends

    monkeypatch.setattr(
        _plugin,
        "_installed_backends",
        lambda: tuple(b for b in available_backends() if b != "cupy"),
    )


def printed(result: pytest.RunResult, tag: str) -> list[str]:
    """What the inner tests printed after ``TAG `` (with -s, also after a -v test id)."""
    found = []
    for line in result.outlines:
        _, sep, rest = line.partition(tag + " ")
        if sep:
            found.append(rest)
    return found


def test_strategy_runs_once_per_default_replica_count(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "-v")

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["test_inner.py::test_replicas?numpy-2? REPLICAS 2*", "PASSED"])
    result.stdout.fnmatch_lines(["test_inner.py::test_replicas?numpy-4? REPLICAS 4*", "PASSED"])
    assert printed(result, "REPLICAS") == ["2 ('fifo', None)", "4 ('fifo', None)"]
    result.stdout.fnmatch_lines(["asyncreplica: replicas 2,4; backends numpy; schedule fifo"])


def test_replicas_option(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "--asyncreplica-replicas=1,3,3", "--asyncreplica-backends=numpy")

    result.assert_outcomes(passed=2)
    assert [line.split()[0] for line in printed(result, "REPLICAS")] == ["1", "3"]
    result.stdout.fnmatch_lines(["asyncreplica: replicas 1,3; backends numpy; schedule fifo"])


@pytest.mark.parametrize("value", ["0", "two", "2,,4", ""])
def test_bad_replicas_option_is_a_usage_error(pytester: pytest.Pytester, value: str) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, f"--asyncreplica-replicas={value}")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--asyncreplica-replicas*"])


def test_bad_schedule_option_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "--asyncreplica-schedule=lifo")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--asyncreplica-schedule*invalid choice*"])


class UnavailableBackend(Backend):
    """A backend that is installed but cannot run here."""

    name: ClassVar[str] = "unavailable"

    @classmethod
    def check_available(cls) -> None:
        raise ar.BackendError("the frobnicator is not plugged in")


# The abstract methods are never called: the plugin skips before making a strategy.
UnavailableBackend.__abstractmethods__ = frozenset()


def test_backends_that_cannot_run_here_are_not_parameters_by_default(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No cupy-2/cupy-4 variants skipped on a machine without a GPU: only what can run.
    monkeypatch.setitem(_registry._registered, "unavailable", UnavailableBackend)
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "-v", "-rs", "--asyncreplica-replicas=2")

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_replicas?numpy-2? *"])
    assert "unavailable-2" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            (
                "asyncreplica: replicas 2; backends numpy (unavailable cannot run here:"
                " 'asyncreplica doctor' says why); schedule fifo"
            )
        ]
    )


def test_unavailable_backend_asked_for_skips_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(_registry._registered, "unavailable", UnavailableBackend)
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(
        pytester, "-rs", "--asyncreplica-replicas=2", "--asyncreplica-backends=numpy,unavailable"
    )

    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED*backend 'unavailable' is not available*the frobnicator is not plugged in*"]
    )


def test_unknown_backend_skips_with_the_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "-rs", "--asyncreplica-backends=nosuch", "--asyncreplica-replicas=2")

    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED*backend 'nosuch' is not available*no backend named*"])


def test_marker_overrides_counts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.asyncreplica(replicas=[1, 3])
        def test_marked(strategy):
            print("REPLICAS", strategy.num_replicas_in_sync)

        def test_plain(strategy):
            print("REPLICAS", strategy.num_replicas_in_sync)
        """
    )

    result = run(pytester, "--strict-markers", "-v")

    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_marked?numpy-1? REPLICAS 1", "*test_marked?numpy-3? *"])
    assert printed(result, "REPLICAS") == ["1", "3", "2", "4"]


def test_factory_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner="""
        def test_factory(asyncreplica_strategy_factory):
            three = asyncreplica_strategy_factory(3)
            one = asyncreplica_strategy_factory(1, check_call_sites=False)
            print("MADE", three.num_replicas_in_sync, one.num_replicas_in_sync, three.schedule)
        """
    )

    result = run(pytester)

    result.assert_outcomes(passed=1)
    assert printed(result, "MADE") == ["3 1 ('fifo', None)"]


def test_a_projects_own_strategy_fixture_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.fixture
        def strategy():
            return "mine"

        def test_mine(strategy):
            assert strategy == "mine"
        """
    )

    result = run(pytester, "-v")

    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_mine PASSED*"])
    assert "test_mine[" not in result.stdout.str()


# Schedule fuzzing ------------------------------------------------------------------------


def test_random_schedule_with_a_given_seed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "--asyncreplica-schedule=random", "--asyncreplica-seed=1234")

    result.assert_outcomes(passed=2)
    assert printed(result, "REPLICAS") == ["2 ('random', 1234)", "4 ('random', 1234)"]
    result.stdout.fnmatch_lines(["asyncreplica: *; schedule random, seed 1234"])


def test_random_schedule_seed_defaults_to_one_derived_from_the_node_id(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "--asyncreplica-schedule=random", "--asyncreplica-replicas=2")

    result.assert_outcomes(passed=1)
    expected = zlib.crc32(b"test_inner.py::test_replicas[numpy-2]")
    assert printed(result, "REPLICAS") == [f"2 ('random', {expected})"]
    result.stdout.fnmatch_lines(["*schedule random, seed derived from each test's id"])


def test_factory_gives_each_strategy_of_a_test_its_own_seed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_inner="""
        def test_factory(asyncreplica_strategy_factory):
            seeds = [asyncreplica_strategy_factory(2).schedule[1] for _ in range(3)]
            print("SEEDS", *seeds)
        """
    )

    result = run(pytester, "--asyncreplica-schedule=random", "--asyncreplica-seed=10")

    assert printed(result, "SEEDS") == ["10 11 12"]


def test_fifo_schedule_passes_the_order_dependent_test(pytester: pytest.Pytester) -> None:
    # The premise: in the default schedule the order-dependent test passes.
    pytester.makepyfile(test_inner=ORDER_TEST)

    result = run(pytester)

    result.assert_outcomes(passed=1)


def test_random_schedule_finds_the_order_dependent_bug_and_the_seed_replays_it(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_inner=ORDER_TEST)

    found = run(pytester, "--asyncreplica-schedule=random")

    found.assert_outcomes(failed=1)
    # The failure report says which seed failed and how to replay it.
    found.stdout.fnmatch_lines(
        [
            "*- asyncreplica -*",
            "strategy 0: 4 replicas, backend numpy, schedule random, seed *",
            (
                "replay: pytest 'test_inner.py::test_order?numpy-4?'"
                " --asyncreplica-schedule=random --asyncreplica-seed=*"
            ),
        ]
    )
    match = re.search(r"--asyncreplica-seed=(\d+)", found.stdout.str())
    assert match
    seed = match[1]
    assert int(seed) == zlib.crc32(b"test_inner.py::test_order[numpy-4]")

    replayed = run(pytester, "--asyncreplica-schedule=random", f"--asyncreplica-seed={seed}")

    replayed.assert_outcomes(failed=1)
    assert printed(replayed, "ORDER") == printed(found, "ORDER")
    assert f"--asyncreplica-seed={seed}" in replayed.stdout.str()


def test_other_seeds_give_other_interleavings(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=ORDER_TEST)

    orders = {
        tuple(
            printed(
                run(pytester, "--asyncreplica-schedule=random", f"--asyncreplica-seed={s}"), "ORDER"
            )
        )
        for s in range(4)
    }

    assert len(orders) > 1


def test_passing_tests_have_no_asyncreplica_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=REPLICAS_TEST)

    result = run(pytester, "--asyncreplica-schedule=random", "-rA")

    result.assert_outcomes(passed=2)
    assert "replay:" not in result.stdout.str()


# Async test runners -----------------------------------------------------------------------
# The fixtures are synchronous, so they serve any runner. Each runner gets a test using the
# `strategy` fixture, the factory, and the order-dependent bug that the random schedule
# finds, with the replay line in the report.

ASYNC_TEST = """
import pytest
import asyncreplica as ar

{mark}

async def step():
    ctx = ar.get_replica_context()
    return await ctx.all_reduce("sum", 1.0)

async def test_fixture(strategy):
    result = await strategy.run(step)
    assert strategy.experimental_local_results(result) == (
        float(strategy.num_replicas_in_sync),
    ) * strategy.num_replicas_in_sync
    print("RAN", strategy.num_replicas_in_sync)

async def test_factory(asyncreplica_strategy_factory):
    strategy = asyncreplica_strategy_factory(3, check_call_sites=False)
    result = await strategy.run(step)
    print("RAN", *strategy.experimental_local_results(result))

@pytest.mark.asyncreplica(replicas=[4])
async def test_order(strategy):
    starts = []

    async def buggy():
        ctx = ar.get_replica_context()
        rid = ctx.replica_id_in_sync_group
        starts.append(rid)
        if rid == 0:
            shared["table"] = [1.0, 2.0]
        table = shared["table"]  # KeyError when replica 0 has not run first
        await ctx.barrier()
        return len(table)

    try:
        for _ in range(5):
            shared = {{}}
            await strategy.run(buggy)
    finally:
        print("ORDER", starts)
"""

RUNNERS = {
    # name: (module-level mark, extra pytest arguments, the id prefix a runner adds).
    # pytest-asyncio loads through its entry point ("-p asyncio" would name the stdlib).
    "pytest-asyncio-strict": (
        "pytestmark = pytest.mark.asyncio",
        ("-o", "asyncio_mode=strict"),
        "",
    ),
    "pytest-asyncio-auto": ("", ("-o", "asyncio_mode=auto"), ""),
    "anyio": (
        (
            "pytestmark = pytest.mark.anyio\n\n"
            "@pytest.fixture\ndef anyio_backend():\n    return 'asyncio'"
        ),
        ("-p", "no:asyncio"),
        "",
    ),
    "anyio-every-backend": ("pytestmark = pytest.mark.anyio", ("-p", "no:asyncio"), "asyncio-"),
}


def run_async(pytester: pytest.Pytester, runner: str, *args: str) -> pytest.RunResult:
    if runner.startswith("pytest-asyncio"):
        pytest.importorskip("pytest_asyncio", reason="pytest-asyncio is in the [test] extra")
    _, options, _ = RUNNERS[runner]
    pytester.makepyfile(test_inner=ASYNC_TEST.format(mark=RUNNERS[runner][0]))
    # The ini option pytest-asyncio asks for, as a project using it sets it.
    loop_scope = ("-o", "asyncio_default_fixture_loop_scope=function")
    extra = loop_scope if runner.startswith("pytest-asyncio") else ()
    # "-p no:asyncreplica" must come before the explicit "-p" of the plugin (COMMON).
    # The outer session already imported the plugin, so pytest (9.0, not 9.2) warns that it
    # cannot rewrite its asserts; with "-W error" that warning alone would end the inner run.
    rewrite = ("-W", "ignore::pytest.PytestAssertRewriteWarning")
    return pytester.runpytest(*COMMON, *options, *extra, "-s", "-W", "error", *rewrite, *args)


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_fixtures_under_each_async_runner(pytester: pytest.Pytester, runner: str) -> None:
    result = run_async(pytester, runner, "-v", "-k", "not order")

    prefix = RUNNERS[runner][2]
    # anyio's own anyio_backend fixture runs each test once per installed anyio backend
    # (asyncio, trio), and says so in the ids: test_fixture[asyncio-numpy-2].
    backends = len(get_available_backends()) if prefix else 1
    result.assert_outcomes(passed=3 * backends)
    result.stdout.fnmatch_lines([f"*test_fixture?{prefix}numpy-2? RAN 2*"])
    result.stdout.fnmatch_lines([f"*test_fixture?{prefix}numpy-4? RAN 4*"])
    assert "RAN 3.0 3.0 3.0" in result.stdout.str()


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_random_schedule_and_replay_under_each_async_runner(
    pytester: pytest.Pytester, runner: str
) -> None:
    prefix = RUNNERS[runner][2]
    # asyncio only: trio shuffles its run queue itself, so runs there do not replay exactly.
    order = "order and not trio"
    fixed = run_async(pytester, runner, "-k", order)
    fixed.assert_outcomes(passed=1)  # replicas start in order: the bug hides

    found = run_async(pytester, runner, "-k", order, "--asyncreplica-schedule=random")

    found.assert_outcomes(failed=1)
    found.stdout.fnmatch_lines(
        [
            "*- asyncreplica -*",
            "strategy 0: 4 replicas, backend numpy, schedule random, seed *",
            (
                f"replay: pytest 'test_inner.py::test_order?{prefix}numpy-4?'"
                " --asyncreplica-schedule=random --asyncreplica-seed=*"
            ),
        ]
    )
    match = re.search(r"--asyncreplica-seed=(\d+)", found.stdout.str())
    assert match
    replay = ("-k", order, "--asyncreplica-schedule=random", f"--asyncreplica-seed={match[1]}")

    replayed = run_async(pytester, runner, *replay)

    replayed.assert_outcomes(failed=1)
    assert printed(replayed, "ORDER") == printed(found, "ORDER")
