"""``asyncreplica._tools._lint``: what the static check flags, what it leaves alone, and how it reports.

Snippets are written as users write step functions. Each test pins the exact findings (line,
condition line, and where it matters the whole message), so a check that flags too much or
too little fails.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from asyncreplica._tools._lint import IGNORE_COMMENT, Finding, lint_paths, lint_source

HEADER = "import asyncreplica as ar\n"  # line 1 of every snippet


def lint(body: str) -> list[Finding]:
    return lint_source(HEADER + textwrap.dedent(body), "snippet.py")


def pairs(body: str) -> set[tuple[int, int | None]]:
    """``{(collective line, condition line)}`` of the findings of ``body``."""
    return {(f.line, f.condition_line) for f in lint(body)}


# -- the message -------------------------------------------------------------------------------


def test_exact_message_and_str() -> None:
    (finding,) = lint(
        """
        async def step():
            ctx = ar.get_replica_context()
            if ctx.replica_id_in_sync_group == 0:
                await ctx.all_reduce("sum", 1.0)
        """
    )
    message = (
        "all_reduce at line 6 runs only when `ctx.replica_id_in_sync_group == 0` (line 5) is "
        "true; a collective every replica must reach cannot depend on the replica id"
    )
    assert finding == Finding("snippet.py", 6, 15, 5, message)
    assert str(finding) == f"snippet.py:6:15: {message}"


def test_finding_is_frozen() -> None:
    finding = Finding("a.py", 1, 1, 1, "m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        finding.line = 2  # type: ignore[misc]


def test_message_for_per_replica_data_names_the_parameter() -> None:
    (finding,) = lint(
        """
        async def step(ctx, batch):
            if len(batch) > 0:
                await ctx.barrier()
        """
    )
    assert finding.message == (
        "barrier at line 5 runs only when `len(batch) > 0` (line 4) is true; a collective "
        "every replica must reach cannot depend on per-replica data (`batch`)"
    )


def test_message_for_else_branch_early_return_and_loop() -> None:
    findings = lint(
        """
        async def step(ctx, shard):
            rid = ctx.replica_id_in_sync_group
            if rid:
                pass
            else:
                await ctx.barrier()
            if shard is None:
                return
            for b in shard:
                await ctx.all_reduce("sum", b)
        """
    )
    assert [f.message.split(";")[0] for f in findings] == [
        "barrier at line 8 runs only when `rid` (line 5) is false",
        (
            "all_reduce at line 12 runs once per item of `shard` (line 11), whose length can "
            "differ between replicas"
        ),
    ]


def test_early_return_message() -> None:
    (finding,) = lint(
        """
        async def step(ctx, loss):
            if loss is None:
                return None
            return await ctx.all_reduce("sum", loss)
        """
    )
    assert finding.message.startswith(
        "all_reduce at line 6 is skipped when `loss is None` (line 4) is true "
        "(the replica returns at line 5); "
    )
    assert finding.condition_line == 4


def test_long_conditions_are_shortened() -> None:
    (finding,) = lint(
        """
        async def step(ctx):
            if ctx.replica_id_in_sync_group in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13):
                await ctx.barrier()
        """
    )
    condition = finding.message.split("`")[1]
    assert condition.endswith("...")
    assert len(condition) == 60


# -- what is flagged ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "collective",
    [
        'all_reduce("sum", 1.0)',
        "all_gather(x, 0)",
        "broadcast(x)",
        'reduce_scatter("sum", x, 0)',
        "barrier()",
        "merge_call(fn, args=(x,))",
    ],
)
def test_every_collective_kind(collective: str) -> None:
    findings = lint(
        f"""
        async def step(x, fn):
            ctx = ar.get_replica_context()
            if ctx.replica_id_in_sync_group == 0:
                await ctx.{collective}
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(6, 5)]
    assert findings[0].message.startswith(collective.split("(")[0] + " at line 6 ")


def test_if_elif_else() -> None:
    assert pairs(
        """
        async def step(ctx):
            r = ctx.replica_id_in_sync_group
            if r == 0:
                await ctx.all_reduce("sum", 1.0)
            elif r == 1:
                await ctx.all_gather(1.0, 0)
            else:
                await ctx.barrier()
        """
    ) == {(6, 5), (8, 7), (10, 7)}


def test_while_loop() -> None:
    assert pairs(
        """
        async def step(ctx):
            n = ctx.replica_id_in_sync_group + 2
            while n > 0:
                await ctx.barrier()
                n -= 1
        """
    ) == {(6, 5)}


def test_for_loop_over_per_replica_data_even_with_names() -> None:
    assert pairs(
        """
        async def step(shard):
            ctx = ar.get_replica_context()
            for i, batch in enumerate(shard):
                await ctx.all_reduce("sum", batch, name=f"b{i}")
        """
    ) == {(6, 5)}


def test_for_loop_over_a_range_of_the_replica_id() -> None:
    assert pairs(
        """
        async def step(ctx):
            for _ in range(3 + (ctx.replica_id_in_sync_group == 0)):
                await ctx.all_reduce("sum", 1.0)
        """
    ) == {(5, 4)}


def test_comprehensions() -> None:
    assert pairs(
        """
        async def step(ctx, grads):
            a = [await ctx.all_reduce("sum", g) for g in grads]
            b = {k: await ctx.all_reduce("sum", v) for k, v in enumerate(range(4)) if v < len(grads)}
            return a, b
        """
    ) == {(4, 4), (5, 5)}


def test_ternary_and_short_circuit() -> None:
    assert pairs(
        """
        async def step(ctx):
            r = ctx.replica_id_in_sync_group
            x = await ctx.all_reduce("sum", 1.0) if r == 0 else 0.0
            y = 0.0 if r == 0 else await ctx.all_reduce("sum", 1.0)
            r == 0 and await ctx.barrier()
            r == 0 or await ctx.barrier()
            return x, y
        """
    ) == {(5, 5), (6, 6), (7, 7), (8, 8)}


def test_match_subject_and_case_guard() -> None:
    assert pairs(
        """
        async def step(ctx, kind):
            match ctx.replica_id_in_sync_group:
                case 0:
                    await ctx.barrier()
            match "fixed":
                case "fixed" if kind == "a":
                    await ctx.barrier()
                case _:
                    await ctx.all_reduce("sum", 1.0)
        """
    ) == {(6, 4), (9, 8)}


def test_break_skips_later_iterations() -> None:
    assert pairs(
        """
        async def step(ctx, batch):
            for _ in range(10):
                await ctx.all_reduce("sum", 1.0)
                if len(batch) > 3:
                    break
            await ctx.barrier()
        """
    ) == {(5, 6)}


def test_continue_skips_the_rest_of_the_iteration() -> None:
    assert pairs(
        """
        async def step(ctx, batch):
            for i in range(10):
                await ctx.all_reduce("sum", 1.0)
                if batch[i] is None:
                    continue
                await ctx.all_gather(batch[i], 0)
            await ctx.barrier()
        """
    ) == {(8, 6)}


def test_return_inside_a_loop_skips_later_iterations_and_what_follows() -> None:
    assert pairs(
        """
        async def step(ctx, batch):
            for i in range(10):
                await ctx.all_reduce("sum", 1.0)
                if batch[i] is None:
                    return
            await ctx.barrier()
        """
    ) == {(5, 6), (8, 6)}


def test_nested_return_under_an_innocent_condition() -> None:
    assert pairs(
        """
        async def step(ctx, loss, epoch_is_odd=True):
            if True:
                if loss is None:
                    return
            await ctx.barrier()
        """
    ) == {(7, 5)}


# -- taint -------------------------------------------------------------------------------------


def test_taint_through_assignments_unpacking_and_augmented_assignment() -> None:
    assert pairs(
        """
        async def step(ctx):
            a = ctx.replica_id_in_sync_group
            b, c = a % 2, 0
            d = 1
            d += c + b
            if d:
                await ctx.barrier()
            if c:
                await ctx.barrier()
        """
    ) == {(9, 8), (11, 10)}  # c is tainted with the tuple as a whole (conservative)


def test_taint_through_attributes_subscripts_and_walrus() -> None:
    assert pairs(
        """
        async def step(ctx, batch):
            if batch.shape[0] > 1:
                await ctx.barrier()
            if (n := len(batch["x"])) and n > 2:
                await ctx.barrier()
        """
    ) == {(5, 4), (7, 6)}


def test_taint_stored_on_self() -> None:
    assert pairs(
        """
        class T:
            async def step(self):
                ctx = ar.get_replica_context()
                self.main = ctx.replica_id_in_sync_group == 0
                if self.main:
                    await ctx.barrier()
        """
    ) == {(8, 7)}


def test_helper_returning_the_replica_id() -> None:
    assert pairs(
        """
        def rid():
            return ar.get_replica_context().replica_id_in_sync_group

        def is_chief(ctx):
            return ctx.replica_id_in_sync_group == 0

        async def step():
            ctx = ar.get_replica_context()
            if rid() % 2:
                await ctx.barrier()
            if is_chief(ctx):
                await ctx.barrier()
        """
    ) == {(12, 11), (14, 13)}


def test_helper_whose_result_does_not_depend_on_its_argument() -> None:
    assert not pairs(
        """
        def log(x):
            print(x)
            return True

        async def step(ctx, batch):
            if log(batch):
                await ctx.barrier()
        """
    )


def test_helper_making_a_collective_under_a_condition_is_flagged_at_the_call() -> None:
    (finding,) = lint(
        """
        async def sync(ctx, x):
            return await ctx.all_reduce("sum", x)

        async def step(ctx):
            if ctx.replica_id_in_sync_group == 0:
                await sync(ctx, 1.0)
        """
    )
    assert (finding.line, finding.condition_line) == (8, 7)
    assert finding.message.startswith(
        "sync() at line 8 (which calls all_reduce at line 4) runs only when "
    )


def test_helper_parameters_are_as_per_replica_as_what_callers_pass() -> None:
    # `times` is a constant at the only call, so the loop is fine; `shard` is per-replica.
    assert pairs(
        """
        async def repeat(ctx, x, times):
            for _ in range(times):
                await ctx.all_reduce("sum", x)

        async def each(ctx, items):
            for x in items:
                await ctx.all_reduce("sum", x)

        async def step(ctx, shard):
            await repeat(ctx, 1.0, 3)
            await each(ctx, shard)
        """
    ) == {(9, 8)}


def test_closures_see_the_enclosing_taint() -> None:
    assert pairs(
        """
        async def step(ctx):
            rid = ctx.replica_id_in_sync_group

            async def inner():
                if rid == 0:
                    await ctx.barrier()

            await inner()
        """
    ) == {(8, 7)}


def test_result_of_reduce_scatter_is_per_replica() -> None:
    assert pairs(
        """
        async def step(ctx):
            part = await ctx.reduce_scatter("sum", [1.0, 2.0], 0)
            if part[0] > 1:
                await ctx.barrier()
        """
    ) == {(6, 5)}


def test_tf_style_context_and_non_awaited_calls() -> None:
    assert pairs(
        """
        import tensorflow as tf

        def step_fn(inputs):
            replica_ctx = tf.distribute.get_replica_context()
            if replica_ctx.replica_id_in_sync_group == 0:
                replica_ctx.all_reduce("sum", inputs)
            if inputs is None:
                tf.distribute.get_replica_context().merge_call(print)
        """
    ) == {(8, 7), (10, 9)}


def test_receiver_annotated_as_a_replica_context() -> None:
    assert pairs(
        """
        async def step(rc: ar.ReplicaContext, batch):
            if batch:
                await rc.barrier()
        """
    ) == {(5, 4)}


# -- what is not flagged -----------------------------------------------------------------------


def test_conditions_identical_on_every_replica() -> None:
    assert not pairs(
        """
        DEBUG = False

        async def step(ctx):
            if ctx.num_replicas_in_sync > 1:
                await ctx.barrier()
            if DEBUG:
                await ctx.barrier()
            for _ in range(3):
                await ctx.all_reduce("sum", 1.0)
            while False:
                await ctx.barrier()
        """
    )


def test_collectives_after_the_branch() -> None:
    assert not pairs(
        """
        async def step(ctx, batch):
            total = 0.0
            if ctx.replica_id_in_sync_group == 0:
                total += 1.0
            for b in batch:
                total += b
            return await ctx.all_reduce("sum", total)
        """
    )


def test_conditions_on_agreed_values() -> None:
    assert not pairs(
        """
        async def step(ctx, shard):
            steps = await ctx.all_reduce("max", len(shard))
            for i in range(int(steps)):
                await ctx.all_reduce("sum", shard[i] if i < len(shard) else 0.0)
            flags = await ctx.all_gather(shard is None, 0)
            if any(flags):
                return None
            await ctx.barrier()
        """
    )


MERGE = """
def merge_fn(strategy, value, ctx):
    if value is None:
        return ctx.broadcast(value)
    return value

async def step(ctx, x):
    return await ctx.merge_call({fn}, args=(x, ctx))
"""


def test_merge_fn_bodies() -> None:
    # The same function is flagged when it is not a merge_fn (the control).
    assert not pairs(MERGE.format(fn="merge_fn"))
    assert pairs(MERGE.format(fn="other")) == {(5, 4)}


def test_context_parameters_are_not_data() -> None:
    assert not pairs(
        """
        async def step(ctx, strategy, replica_context):
            if ctx.num_replicas_in_sync > 1 and strategy.num_replicas_in_sync:
                await replica_context.barrier()
        """
    )


def test_methods_of_other_objects_are_not_collectives() -> None:
    assert not pairs(
        """
        import numpy as np

        async def step(batch, backend):
            if len(batch):
                np.broadcast(batch, batch)
                await backend.all_reduce("sum", batch)
        """
    )


def test_parameters_of_functions_without_collectives_are_not_tainted() -> None:
    assert not pairs(
        """
        def make_step(kind, rounds):
            async def step(x):
                ctx = ar.get_replica_context()
                for _ in range(rounds):
                    if kind == "sum":
                        await ctx.all_reduce("sum", x)
            return step
        """
    )


# -- the ignore comment ------------------------------------------------------------------------


BAD = """
async def step(ctx):
    if ctx.replica_id_in_sync_group == 0:{cond}
        await ctx.barrier(){call}
    if ctx.replica_id_in_sync_group == 1:
        await ctx.barrier()
"""


def test_ignore_comment_constant() -> None:
    assert IGNORE_COMMENT == "# asyncreplica: ignore"


@pytest.mark.parametrize("where", ["call", "cond"])
def test_ignore_comment_silences_only_its_finding(where: str) -> None:
    comment = {"call": "", "cond": ""}
    comment[where] = f"  {IGNORE_COMMENT}"
    assert pairs(BAD.format(**comment)) == {(7, 6)}
    assert pairs(BAD.format(call="", cond="")) == {(5, 4), (7, 6)}


def test_ignore_comment_on_the_exit_condition() -> None:
    assert not pairs(
        """
        async def step(ctx, loss):
            if loss is None:  # asyncreplica: ignore (every replica has a loss)
                return
            await ctx.barrier()
        """
    )


def test_ignore_comment_inside_a_string_does_not_count() -> None:
    assert pairs(
        """
        async def step(ctx):
            if ctx.replica_id_in_sync_group == 0:
                await ctx.all_reduce("sum", "# asyncreplica: ignore")
        """
    ) == {(5, 4)}


def test_ignored_inner_condition_falls_back_to_the_outer_one() -> None:
    findings = lint(
        """
        async def step(ctx, batch):
            for b in batch:
                if b is None:  # asyncreplica: ignore
                    await ctx.barrier()
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(6, 4)]


# -- files, directories, errors ----------------------------------------------------------------


def test_syntax_error_is_a_finding() -> None:
    (finding,) = lint_source("def f(:\n    pass\n", "bad.py")
    assert finding.path == "bad.py"
    assert finding.line == 1
    assert finding.condition_line is None
    assert finding.message.startswith("cannot parse: ")
    assert str(finding).startswith("bad.py:1:")


def test_directories_are_walked(tmp_path: Path) -> None:
    bad = "import asyncreplica as ar\n\nasync def f(ctx):\n    if ctx.replica_id_in_sync_group:\n        await ctx.barrier()\n"
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "b.py").write_text(bad)
    (tmp_path / "pkg" / "a.py").write_text(bad)
    (tmp_path / "pkg" / "clean.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "notes.txt").write_text(bad)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "hidden.py").write_text(bad)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "cached.py").write_text(bad)
    findings = lint_paths([str(tmp_path)])
    assert [(Path(f.path).relative_to(tmp_path).as_posix(), f.line) for f in findings] == [
        ("pkg/a.py", 5),
        ("pkg/sub/b.py", 5),
    ]


def test_files_are_named_as_given_and_explicit_files_are_checked(tmp_path: Path) -> None:
    script = tmp_path / "job"
    script.write_text(
        "async def f(ctx):\n    if ctx.replica_id_in_sync_group:\n        await ctx.barrier()\n"
    )
    (finding,) = lint_paths([str(script)])
    assert finding.path == str(script)
    assert (finding.line, finding.col, finding.condition_line) == (3, 15, 2)


def test_unparsable_and_undecodable_files_are_findings(tmp_path: Path) -> None:
    (tmp_path / "a_syntax.py").write_text("async def f(:\n")
    (tmp_path / "b_binary.py").write_bytes(b"x = '\xff\xfe'\n")
    (tmp_path / "c_good.py").write_text("x = 1\n")
    findings = lint_paths([str(tmp_path)])
    assert [(Path(f.path).name, f.condition_line) for f in findings] == [
        ("a_syntax.py", None),
        ("b_binary.py", None),
    ]
    assert findings[0].message.startswith("cannot parse: ")
    assert findings[1].message.startswith("cannot read: ")


def test_missing_path_raises(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError, match=r"no such file or directory: .*nope\.py"):
        lint_paths([str(missing)])


def test_nothing_is_imported_or_run(tmp_path: Path) -> None:
    path = tmp_path / "boom.py"
    path.write_text(
        "raise SystemExit('imported!')\n"
        "import asyncreplica as ar\n"
        "async def f(ctx):\n"
        "    if ctx.replica_id_in_sync_group:\n"
        "        await ctx.barrier()\n"
    )
    assert [f.line for f in lint_paths([str(path)])] == [5]


# -- named collectives in both branches; the process rank ----------------------------------------


def test_the_same_named_collectives_in_both_branches_are_reached_by_every_replica() -> None:
    """Started as tasks in a different order per replica: names pair by name, no finding."""
    assert (
        pairs(
            """
            import asyncio

            async def step(x):
                ctx = ar.get_replica_context()
                if ctx.replica_id_in_sync_group == 0:
                    a = asyncio.create_task(ctx.all_reduce("sum", x, name="a"))
                    b = asyncio.create_task(ctx.all_reduce("sum", x, name="b"))
                else:
                    b = asyncio.create_task(ctx.all_reduce("sum", x, name="b"))
                    a = asyncio.create_task(ctx.all_reduce("sum", x, name="a"))
                return await a, await b
            """
        )
        == set()
    )


@pytest.mark.parametrize(
    ("else_branch", "expected"),
    [
        # one name missing from the else branch: every collective of the if depends on it
        ('b = asyncio.create_task(ctx.all_reduce("sum", x, name="b"))', {(8, 7), (9, 7), (11, 7)}),
        # unnamed: the call sites differ, so the replicas disagree
        ('b = ctx.all_reduce("sum", x); a = ctx.all_reduce("sum", x)', {(8, 7), (9, 7), (11, 7)}),
        # a name computed per replica: not provably the same set
        (
            'b = ctx.all_reduce("sum", x, name=n); a = ctx.all_reduce("sum", x, name="a")',
            {(8, 7), (9, 7), (11, 7)},
        ),
        # an early return in a branch
        (
            'b = ctx.all_reduce("sum", x, name="b"); a = ctx.all_reduce("sum", x, name="a"); return',
            {(8, 7), (9, 7), (11, 7)},
        ),
    ],
)
def test_named_collectives_in_branches_that_differ_are_flagged(
    else_branch: str, expected: set[tuple[int, int]]
) -> None:
    found = pairs(
        f"""
        import asyncio

        async def step(x, n):
            ctx = ar.get_replica_context()
            if ctx.replica_id_in_sync_group == 0:
                a = asyncio.create_task(ctx.all_reduce("sum", x, name="a"))
                b = asyncio.create_task(ctx.all_reduce("sum", x, name="b"))
            else:
                {else_branch}
        """
    )
    assert expected <= found


def test_a_condition_on_the_mpi_rank_blames_the_rank_not_the_step_number() -> None:
    findings = lint(
        """
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()

        async def step(step_no, x):
            ctx = ar.get_replica_context()
            if step_no % 10 == 0 and rank == 0:
                await ctx.all_reduce("sum", x)
            if rank == 0:
                await ctx.all_reduce("sum", x)
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(10, 9), (12, 11)]
    for finding in findings:
        assert finding.message.endswith(
            "cannot depend on the process rank (each process runs its own replicas)"
        ), finding.message


@pytest.mark.parametrize(
    "rank",
    [
        "MPI.COMM_WORLD.rank",
        "comm.Get_rank()",
        "comm.rank",
        'int(os.environ["RANK"])',
        'int(os.environ.get("OMPI_COMM_WORLD_RANK", 0))',
        'int(os.getenv("PMI_RANK", "0"))',
        "strategy.cluster_resolver.task_id",
    ],
)
def test_every_way_to_read_the_process_rank(rank: str) -> None:
    findings = lint(
        f"""
        import os
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        strategy = ar.MultiWorkerMirroredStrategy

        async def step(x):
            ctx = ar.get_replica_context()
            if {rank} == 0:
                await ctx.all_reduce("sum", x)
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(11, 10)]
    assert "the process rank" in findings[0].message


@pytest.mark.parametrize(
    "receiver", ["ctx.strategy.extended", "strategy.extended", "ar.get_strategy().extended"]
)
def test_extended_update_is_a_collective(receiver: str) -> None:
    findings = lint(
        f"""
        async def step(v, fn, strategy):
            ctx = ar.get_replica_context()
            if ctx.replica_id_in_sync_group == 0:
                await {receiver}.update(v, fn)
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(6, 5)]
    assert findings[0].message.startswith("update at line 6 ")


def test_a_dict_update_is_not_a_collective() -> None:
    findings = lint(
        """
        async def step(x):
            ctx = ar.get_replica_context()
            d = {}
            if ctx.replica_id_in_sync_group == 0:
                d.update(x=1)
            await ctx.all_reduce("sum", x)
        """
    )
    assert findings == []


# -- attack 23d, E5: the false negatives left over ---------------------------------------------


def test_a_context_parameter_with_any_name_is_a_context() -> None:
    # The receiver `c` is a replica context because its replica id is read.
    assert pairs(
        """
        async def helper(c, x):
            if c.replica_id_in_sync_group:
                await c.all_reduce("sum", x)

        async def step(x):
            await helper(ar.get_replica_context(), x)
        """
    ) == {(5, 4)}


def test_a_context_parameter_with_any_name_is_not_per_replica_data() -> None:
    # `c.num_replicas_in_sync` is the same on every replica: `c` is no data parameter.
    assert (
        pairs(
            """
        async def helper(c, x):
            rid = c.replica_id_in_sync_group
            if c.num_replicas_in_sync > 1:
                await c.all_reduce("sum", x)
            return rid
        """
        )
        == set()
    )


def test_getattr_of_the_replica_id_is_the_replica_id() -> None:
    assert pairs(
        """
        async def step(x):
            ctx = ar.get_replica_context()
            if getattr(ctx, "replica_id_in_sync_group"):
                await ctx.all_reduce("sum", x)
        """
    ) == {(6, 5)}


def test_a_name_bound_to_a_collective_is_a_collective() -> None:
    findings = lint(
        """
        async def step(x):
            ctx = ar.get_replica_context()
            f = ctx.all_reduce
            g = lambda: ctx.all_gather(x, axis=0)
            if ctx.replica_id_in_sync_group:
                await f("sum", x)
                await g()
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(8, 7), (9, 7)]
    assert findings[0].message.startswith("all_reduce (called as `f`) at line 8 ")
    assert findings[1].message.startswith("all_gather (called as `g`) at line 9 ")


def test_a_name_bound_to_another_method_is_not_a_collective() -> None:
    assert (
        pairs(
            """
        async def step(x, pg):
            ctx = ar.get_replica_context()
            f = pg.all_reduce
            g = lambda: print(x)
            if ctx.replica_id_in_sync_group:
                await f("sum", x)
                g()
        """
        )
        == set()
    )


def test_a_raise_caught_by_a_try_skips_the_rest_of_its_body() -> None:
    findings = lint(
        """
        async def step(x):
            ctx = ar.get_replica_context()
            try:
                if ctx.replica_id_in_sync_group:
                    raise KeyError
                await ctx.all_reduce("sum", x)
            except KeyError:
                pass
            await ctx.all_reduce("sum", x)
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(8, 6)]
    assert "(the replica raises at line 7, caught by the try at line 5)" in findings[0].message


def test_a_raise_caught_by_suppress_skips_the_rest_of_the_with() -> None:
    findings = lint(
        """
        import contextlib

        async def step(x):
            ctx = ar.get_replica_context()
            with contextlib.suppress(ValueError):
                if x.sum() > 0:
                    raise ValueError
                await ctx.all_reduce("sum", x)
            await ctx.all_reduce("sum", x)
        """
    )
    assert [(f.line, f.condition_line) for f in findings] == [(10, 8)]
    assert "caught by the with at line 7" in findings[0].message


def test_a_raise_outside_a_try_is_not_an_early_exit() -> None:
    # Uncaught, the replica fails and the run reports its error: nothing is skipped.
    assert (
        pairs(
            """
        async def step(x):
            ctx = ar.get_replica_context()
            if ctx.replica_id_in_sync_group > 8:
                raise ValueError("too many replicas")
            await ctx.all_reduce("sum", x)
        """
        )
        == set()
    )


def test_a_raise_caught_inside_the_branch_is_not_an_early_exit() -> None:
    assert (
        pairs(
            """
        async def step(x):
            ctx = ar.get_replica_context()
            try:
                if ctx.replica_id_in_sync_group:
                    try:
                        raise KeyError
                    except KeyError:
                        pass
                await ctx.all_reduce("sum", x)
            except ValueError:
                pass
        """
        )
        == set()
    )
