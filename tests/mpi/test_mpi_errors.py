"""Every process gives one process's answer, and raises the same error, alike (mpiexec).

Plain values in cross-replica calls, errors found by one process's own ledger, a
collective queued behind a failed exchange, a failing process's exception type, and
``ASYNCREPLICA_TRACE``. The generated comparison with one process is in
``test_mpi_differential.py``; these pin the defects it was written for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from asyncreplica_mpi._protocol import (
    describe_exception,
    differing_fields,
    first_refusal,
    signature_fields,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_mpi import launch

from asyncreplica._tracing._session import rank_path
from asyncreplica.abc import (
    CallSite,
    CollectiveKind,
    LeafSpec,
    ReduceOp,
    Signature,
    signature_differences,
)

pytest.importorskip("mpi4py", reason="the [mpi] extra (mpi4py, mpich) is not installed")


# -- plain values: one process's answer ------------------------------------------------


@pytest.mark.parametrize(
    ("n", "counts", "want"),
    [
        # Every process has several replicas: a plain value is one value, as in one
        # process (MEAN of 0.5 is 0.5, not 0.5 * processes; SUM is ambiguous).
        (2, "2", {"mean": "0.5", "merge": "2.0", "reduce_to": "0.5", "sum": "raised ValueError"}),
        (3, "2", {"mean": "0.5", "merge": "2.0", "reduce_to": "0.5", "sum": "raised ValueError"}),
        # One replica per process: a plain value stands for that replica (run unwraps its
        # value; TensorFlow's multi-worker strategy counts a worker's host value once).
        (2, "1", {"mean": "0.5", "max": "1.0", "sum": "2.0", "max_run": "1.0"}),
        (3, "1", {"mean": "0.5", "max": "2.0", "sum": "3.0", "max_run": "2.0"}),
        # 2 + 1: the process of one replica makes it per-replica; SUM raises ValueError
        # on every process (never a false "reduce op differs").
        (2, "2,1", {"mean": "0.5", "max": "1.0", "merge": "2.0", "sum": "raised ValueError"}),
    ],
)
def test_plain_values_reduce_as_in_one_process(
    n: int, counts: str, want: dict[str, str], tmp_path: Path
) -> None:
    rc, logs, output = launch(n, "plain.py", counts, tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(n):
        lines = dict(line.split(" ", 1) for line in logs[rank].splitlines() if " " in line)
        for what, result in want.items():
            assert lines[what] == result, (rank, what, logs[rank])
        assert lines["bcast"] == "[1.0, 1.0]", logs[rank]  # a copy, not summed over processes
        total = n * int(counts) if "," not in counts else sum(map(int, counts.split(",")))
        sum_run = str(float(sum(range(total))))
        assert lines["sum_run"] == sum_run, logs[rank]
        assert lines["sum_run_to"] == sum_run, logs[rank]
        # inside a merge_fn: the replica's argument sums; a constant is ambiguous where
        # every process has several replicas, and one contribution per process with one
        if counts == "1":
            assert lines["merge_sum"] == f"{sum_run} {0.5 * n}", logs[rank]
        else:
            assert lines["merge_sum"] == f"{sum_run} raised ValueError", logs[rank]
        # a dtype the local backend refuses: TypeError everywhere, the processes in step
        assert lines["bool"] == "raised TypeError", logs[rank]
        # a plain value's axis that differs per process: the mismatch everywhere, then
        # the processes in step (one process's result)
        assert lines["axes"] == "raised CollectiveMismatchError", logs[rank]
        mean = [[float(i + 6 + 4 * row) for i in range(4)] for row in range(3)]
        assert lines["axes_after"] == str(mean), logs[rank]  # np.arange(24.0) (2, 3, 4)
        assert logs[rank].endswith("done\n"), logs[rank]


@pytest.mark.parametrize(("n", "counts"), [(2, "1"), (3, "1"), (2, "2,1"), (2, "2")])
def test_gather_of_a_run_result_crosses_processes(n: int, counts: str, tmp_path: Path) -> None:
    # With one replica per process, run returns plain values: gather must still
    # concatenate every replica's rows (4 or 6 rows of 3, not this process's 2).
    rc, logs, output = launch(n, "plain.py", counts, tmp_path=tmp_path)
    assert rc == 0, output
    total = n * int(counts) if "," not in counts else sum(map(int, counts.split(",")))
    want = [[g] * 3 for g in range(total) for _ in range(2)]
    for rank in range(n):
        assert f"gather {want}\n" in logs[rank], logs[rank]


@pytest.mark.parametrize(("n", "counts"), [(2, "1"), (3, "1"), (2, "2,1"), (2, "2")])
def test_values_of_other_structures_on_other_processes_raise_everywhere(
    n: int, counts: str, tmp_path: Path
) -> None:
    # The last process's replicas return [x], the others {"a": x}: one process's run
    # raises regroup's ValueError naming the first replica that differs; so must every
    # process (before, each got its own structure, and reduce summed x under "a" with
    # x in a list), and the next run works.
    rc, logs, output = launch(n, "structure.py", counts, tmp_path=tmp_path)
    assert rc == 0, output
    layout = [int(k) for k in counts.split(",")] if "," in counts else [int(counts)] * n
    first = sum(layout[:-1])
    want = (
        "raised ValueError: replicas returned values of different structure: replica 0 "
        f"gave {{'a': *}} but replica {first} gave [*]; every replica must return the same "
        "structure (same containers, lengths and keys)"
    )
    for rank in range(n):
        lines = logs[rank].splitlines()
        assert lines[0] == want, logs[rank]
        assert lines[1] == f"after {[float(sum(layout)) * k for k in range(3)]}", logs[rank]
        assert lines[-1] == "done", logs[rank]


@pytest.mark.parametrize(("n", "k"), [(2, 1), (3, 1), (2, 2)])
def test_a_value_one_process_refuses_in_a_cross_replica_call_is_refused_everywhere(
    n: int, k: int, tmp_path: Path
) -> None:
    # One process's error for the whole call (its class as MirroredStrategy(n * k)
    # raises it) on every process; before, the other processes raised
    # ReplicaExitedError (gather of a str array), or TypeError where one process finds
    # the dtypes differ (a bool component among float64 ones).
    rc, logs, output = launch(n, "refusals.py", str(k), tmp_path=tmp_path)
    assert rc == 0, output
    want = {
        "str_gather": "TypeError",
        "str_reduce": "TypeError",
        "bool_reduce": "CollectiveMismatchError",
        "bool_reduce_to": "CollectiveMismatchError",
        "fp_raise": "FloatingPointError",
        "empty_min": "ValueError: Strategy.reduce(MIN, axis=(0,)): replica 1",
        "empty_mean": "[nan, nan, nan] warnings=0",
        "gather": f"({n * k}, 2)",
    }
    for rank in range(n):
        lines = dict(line.split(" ", 1) for line in logs[rank].splitlines() if " " in line)
        assert lines == want, (rank, logs[rank])
        assert logs[rank].endswith("done\n"), logs[rank]


# -- errors: the same class and attributes on every process ----------------------------


def _fields(log: str) -> dict[str, object]:
    return dict(json.loads(log.splitlines()[0]))


@pytest.mark.parametrize("n", [2, 3])
def test_a_collective_queued_behind_a_mismatch_is_not_a_second_failure(
    n: int, tmp_path: Path
) -> None:
    rc, logs, output = launch(n, "errors.py", "queued", tmp_path=tmp_path)
    assert rc == 0, output
    fields = [_fields(logs[r]) for r in range(n)]
    assert fields[0]["class"] == "CollectiveMismatchError", logs[0]
    assert fields[0]["fields"] == ["reduce op"], logs[0]
    assert all(f == fields[0] for f in fields), fields
    for rank in range(n):
        assert logs[rank].endswith(f"again {float(n)}\n"), logs[rank]
    assert "never retrieved" not in output, output
    assert "ExceptionGroup" not in output, output


def test_the_others_name_the_failing_process_exception_type(tmp_path: Path) -> None:
    rc, logs, output = launch(2, "errors.py", "raise", tmp_path=tmp_path)
    assert rc == 0, output
    assert _fields(logs[1])["class"] == "ValueError", logs[1]
    assert _fields(logs[0])["class"] == "ReplicaExitedError", logs[0]
    assert "failed: ValueError: bad value on replica" in logs[0], logs[0]


def test_named_collectives_in_different_orders_deadlock_as_in_one_process(
    tmp_path: Path,
) -> None:
    rc, logs, output = launch(3, "errors.py", "cycle", tmp_path=tmp_path)
    assert rc == 0, output
    want = {"class": "CollectiveDeadlockError", "cycle": [[0, "a"], [2, "b"]]}
    for rank in range(3):
        assert _fields(logs[rank]) == want, logs[rank]
        assert "Replicas 0, 2 wait for each other in a cycle" in logs[rank]
        assert logs[rank].endswith("again 6.0\n"), logs[rank]  # still in step


def test_sparse_on_one_process_and_dense_on_another_is_a_sparsity_mismatch(
    tmp_path: Path,
) -> None:
    rc, logs, output = launch(2, "errors.py", "sparsity", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        fields = _fields(logs[rank])
        assert fields["class"] == "CollectiveMismatchError", logs[rank]
        assert fields["fields"] == ["sparsity"], logs[rank]
        assert logs[rank].endswith("again 2.0\n"), logs[rank]


@pytest.mark.parametrize("n", [2, 3])
def test_a_merge_fn_bound_to_other_values_on_one_process_is_a_mismatch_everywhere(
    n: int, tmp_path: Path
) -> None:
    rc, logs, output = launch(n, "errors.py", "merge_bound", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(n):
        fields = _fields(logs[rank])
        assert fields["class"] == "CollectiveMismatchError", logs[rank]
        assert fields["fields"] == ["merge_fn"], logs[rank]
        assert "lr=0.25" in logs[rank], logs[rank]
        assert logs[rank].endswith(f"again {2.0 * n}\n"), logs[rank]


@pytest.mark.parametrize("scenario", ["reduce_keys", "reduce_keys_1"])
def test_a_plain_nest_of_other_keys_on_one_process_is_a_structure_mismatch(
    scenario: str, tmp_path: Path
) -> None:
    rc, logs, output = launch(2, "errors.py", scenario, tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        fields = _fields(logs[rank])
        assert fields["class"] == "CollectiveMismatchError", logs[rank]
        assert fields["fields"] == ["structure"], logs[rank]
        assert (
            logs[rank].rstrip().endswith("again " + ("4.0" if scenario == "reduce_keys" else "2.0"))
        ), logs[rank]


def test_two_lambdas_on_one_line_are_told_apart_across_processes(tmp_path: Path) -> None:
    rc, logs, output = launch(2, "errors.py", "merge_lambda", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        fields = _fields(logs[rank])
        assert fields["class"] == "CollectiveMismatchError", logs[rank]
        assert fields["fields"] == ["merge_fn"], logs[rank]


def test_gather_of_components_of_different_ranks_is_one_class_everywhere(
    tmp_path: Path,
) -> None:
    # The process that holds both ranks refuses in the agreement: the same class as the
    # processes that see a rank differ across processes, and as one process.
    rc, logs, output = launch(2, "errors.py", "gather_ranks", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        fields = _fields(logs[rank])
        assert fields["class"] == "CollectiveMismatchError", logs[rank]
        assert fields["fields"] == ["shape"], logs[rank]
        # The refusal's signatures (process 0's own check), completed by process 1's
        # replicas: every replica, as one process's check holds (they were empty).
        assert fields["signatures"] == [0, 1, 2, 3], logs[rank]
        assert "replica 0 holds float64[2, 3]; replica 1 holds float64[2, 3, 1]" in logs[rank]
        assert logs[rank].endswith("again 4.0\n"), logs[rank]


@pytest.mark.parametrize(("n", "scenario"), [(2, "too_big"), (3, "too_big"), (3, "too_big_last")])
def test_a_collective_refused_as_it_is_issued_raises_alike_everywhere(
    n: int, scenario: str, tmp_path: Path
) -> None:
    # A value no backend holds (2**70) is refused by the replica that issues it, before
    # the processes agree: every process raises the first refusing replica's TypeError
    # (global id, the local backend's name), as one process does; each process named
    # its own replica before, and the others raised ReplicaExitedError.
    rc, logs, output = launch(n, "errors.py", scenario, tmp_path=tmp_path)
    assert rc == 0, output
    replica = 0 if scenario == "too_big" else 2 * n - 1
    for rank in range(n):
        assert _fields(logs[rank]) == {"class": "TypeError"}, logs[rank]
        want = f"replica {replica} passed value of type builtins.int, which the numpy backend"
        assert logs[rank].splitlines()[1].startswith(want), logs[rank]
        total = n if scenario == "too_big" else 2 * n
        assert logs[rank].endswith(f"again {float(total)}\n"), logs[rank]


@pytest.mark.parametrize(
    ("n", "scenario", "want"),
    [
        (2, "shape_then_too_big", "CollectiveMismatchError"),
        (3, "shape_then_too_big_1", "CollectiveMismatchError"),
        (2, "too_big_then_shape", "TypeError"),
    ],
)
def test_a_mismatch_and_a_refusal_on_different_processes_raise_one_process_error(
    n: int, scenario: str, want: str, tmp_path: Path
) -> None:
    # Process 0's ledger found a shape mismatch (replicas 0, 1) and process 1 refused
    # 2**70 (its last replica): CollectiveMismatchError on process 0, TypeError on
    # process 1. One process finds errors in replica order: the error of the lower
    # replica wins, on every process alike (and a refusal at replica 0 wins over the
    # last process's own mismatch).
    rc, logs, output = launch(n, "errors.py", scenario, tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(n):
        fields = _fields(logs[rank])
        assert fields["class"] == want, logs[rank]
        if want == "CollectiveMismatchError":
            assert fields["fields"] == ["shape"], logs[rank]
            assert fields["position"] == 0, logs[rank]
        else:
            assert logs[rank].splitlines()[1].startswith("replica 0 passed value"), logs[rank]
        assert logs[rank].endswith(f"again {float(n * (1 if n == 3 else 2))}\n"), logs[rank]


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_components_refused_inside_one_process_raise_alike_everywhere(
    n: int, tmp_path: Path
) -> None:
    # The last process alone holds a float32 and a float64 component: it refuses in the
    # agreement, so every process raises its CollectiveMismatchError (the others raised
    # ReplicaExitedError), naming global replica ids.
    rc, logs, output = launch(n, "errors.py", "reduce_dtype", tmp_path=tmp_path)
    assert rc == 0, output
    fields = [_fields(logs[r]) for r in range(n)]
    assert fields[0]["class"] == "CollectiveMismatchError", logs[0]
    assert fields[0]["fields"] == ["dtype"], logs[0]
    assert fields[0]["signatures"] == list(range(2 * n)), logs[0]  # as in one process
    assert all(f == fields[0] for f in fields), fields
    last = 2 * n - 1
    held = ", ".join(map(str, range(last)))
    for rank in range(n):
        assert f"replicas {held} hold float64; replica {last} holds float32" in logs[rank]
        assert logs[rank].endswith(f"again {2.0 * n}\n"), logs[rank]


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_shapes_refused_inside_one_process_raise_alike_everywhere(
    n: int, tmp_path: Path
) -> None:
    # Replica 1 (on process 0) holds another shape: ValueError on every process, as in
    # one process, never a ReplicaExitedError on the others.
    rc, logs, output = launch(n, "errors.py", "reduce_shape", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(n):
        assert _fields(logs[rank]) == {"class": "ValueError"}, logs[rank]
        others = ", ".join(map(str, [0, *range(2, 2 * n)]))
        want = f"replicas {others} hold shape (2, 4); replica 1 holds shape (2, 3)"  # one process's
        assert want in logs[rank], logs[rank]
        assert logs[rank].endswith(f"again {2.0 * n}\n"), logs[rank]


def test_gather_of_components_of_different_ranks_in_one_process() -> None:
    import anyio
    import numpy as np

    import asyncreplica as ar

    async def main() -> None:
        strategy = ar.MirroredStrategy(["CPU:0", "CPU:1", "CPU:2"])
        value = strategy.experimental_distribute_values_from_function(
            lambda c: np.ones((2, 3)) if c.replica_id_in_sync_group == 0 else np.ones((2, 3, 1))
        )
        with pytest.raises(ar.CollectiveMismatchError) as caught:
            await strategy.gather(value, axis=0)
        assert list(caught.value.fields) == ["shape"]

    anyio.run(main)


@pytest.mark.parametrize("n", [2, 3])
def test_a_replica_that_exits_gives_the_same_attributes_everywhere(n: int, tmp_path: Path) -> None:
    # Replica 2n-1 returns early; every other replica waits: replica_id and waiting
    # are global and the same on the process that found it and on the others.
    rc, logs, output = launch(n, "errors.py", "exited", tmp_path=tmp_path)
    assert rc == 0, output
    want = {
        "class": "ReplicaExitedError",
        "replica_id": 2 * n - 1,
        "position": 0,
        "name": None,
        "waiting": list(range(2 * n - 1)),
    }
    for rank in range(n):
        assert _fields(logs[rank]) == want, logs[rank]


def test_the_refusal_one_process_finds_first_wins() -> None:
    # 1 + 3 replicas, a plain bool SUM: process 0 (one replica) finds the dtype refused,
    # process 1 (three) the ambiguous SUM; one process checks the arguments first.
    details = [
        {"rank": 0, "refused": ["TypeError", "cannot reduce values of dtype bool"]},
        {"rank": 1, "refused": ["ValueError", "A non-DistributedValues value ..."]},
    ]
    found = first_refusal(details)
    assert found is not None
    assert found["rank"] == 1
    assert first_refusal([{"rank": 0}, {"rank": 1}]) is None


def test_an_exception_group_is_described_by_its_exceptions() -> None:
    group = ExceptionGroup("2 replicas failed", [ValueError("bad 2"), ValueError("bad 3")])
    assert describe_exception(group) == "ValueError: bad 2 (and 1 more: ValueError)"
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [KeyError("k")])])
    assert describe_exception(nested) == "KeyError: 'k'"


# -- the matcher: processes compare by the local matcher's own code -------------------

KINDS = list(CollectiveKind)


@st.composite
def signatures(draw: st.DrawFn) -> Signature:
    from asyncreplica._core._nest import flatten

    kind = draw(st.sampled_from(KINDS))
    leaves = tuple(
        LeafSpec(
            tuple(draw(st.lists(st.integers(1, 3), max_size=2))),
            draw(st.sampled_from(["float32", "int64"])),
            draw(st.booleans()),
            draw(st.sampled_from([None, "jax.Array"])),
        )
        for _ in range(draw(st.integers(0, 2)))
    )
    keys = [f"k{i}" for i in range(len(leaves))]
    value = draw(
        st.sampled_from(
            [
                [0] * len(leaves),
                tuple([0] * len(leaves)),
                dict.fromkeys(keys, 0),
                dict.fromkeys(reversed(keys), 0),  # another insertion order: equal
                None,
            ]
        )
    )
    structure = None if value is None else flatten(value)[1]
    return Signature(
        kind,
        op=draw(st.sampled_from([None, ReduceOp.SUM, ReduceOp.MEAN])),
        axis=draw(st.sampled_from([None, 0])),
        source=draw(st.sampled_from([None, 0, 1])),
        name=draw(st.sampled_from([None, "grads"])),
        structure=structure,
        leaves=leaves,
        call_path=tuple(
            CallSite("/p/train.py", draw(st.sampled_from([10, 11])), "step", 5)
            for _ in range(draw(st.integers(1, 20)))
        ),
    )


@settings(max_examples=300, deadline=None)
@given(a=signatures(), b=signatures(), check=st.booleans())
def test_processes_compare_exactly_as_one_process(a: Signature, b: Signature, check: bool) -> None:
    # Every kind (barrier, merge_call too), leaves and no leaves, sparse, names, long
    # call paths: the fields named across processes are one process's, in its order.
    local = list(signature_differences(a, b, check_call_sites=check))
    details = [{"fields": signature_fields(s, 0, check_call_sites=check)} for s in (a, b)]
    assert differing_fields(details) == local


def test_a_trace_file_per_process() -> None:
    assert rank_path("/t/run.json", 1) == "/t/run.rank1.json"
    assert rank_path("/t/run.json.gz", 0) == "/t/run.rank0.json.gz"
    assert rank_path("trace", 2) == "trace.rank2"


def test_asyncreplica_trace_records_every_process(tmp_path: Path) -> None:
    from asyncreplica._tracing import load_trace

    path = tmp_path / "run.json"
    rc, _, output = launch(
        2, "plain.py", "2", tmp_path=tmp_path, env={"ASYNCREPLICA_TRACE": str(path)}
    )
    assert rc == 0, output
    for rank in (0, 1):
        trace = load_trace(tmp_path / f"run.rank{rank}.json")
        slices = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        assert slices, trace


# -- options that must agree: refused by the constructor on every process ---------------


@pytest.mark.parametrize(
    ("scenario", "want"),
    [
        ("call_sites", "  * check_call_sites ({}): True on processes 0, 1; False on process 2"),
        ("backend", "  * backend ({}): 'numpy' on processes 0, 1; 'renamed' on process 2"),
    ],
)
def test_options_that_differ_between_processes_are_refused_at_the_constructor(
    scenario: str, want: str, tmp_path: Path
) -> None:
    # check_call_sites=False on one process gave "call site differs" with identical
    # lines at the first collective; now every constructor raises ValueError naming the
    # option and each process's value, and the processes stay in step.
    from asyncreplica_mpi._arrival import _WHY

    rc, logs, output = launch(3, "options.py", scenario, tmp_path=tmp_path)
    assert rc == 0, output
    name = want.split()[1]
    for rank in range(3):
        lines = logs[rank].splitlines()
        assert lines[0] == "ValueError", logs[rank]
        assert want.format(_WHY[name]) in lines, logs[rank]
        assert logs[rank].endswith("again [4.0, 4.0]\n"), logs[rank]  # 1 + 2 + 1 replicas


def test_options_that_may_differ_between_processes_are_not_compared(tmp_path: Path) -> None:
    # stall_warning_seconds, bytes_per_pack, timeout_seconds (each process's bound on its
    # own waits) and the devices are each process's own.
    rc, logs, output = launch(2, "options.py", "same", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(2):
        assert logs[rank] == "created\nagain [3.0, 3.0]\n", logs[rank]


# -- floats past the inline size: one process's bits, warnings and errors ---------------


@pytest.mark.parametrize("n", [2, 3])
def test_floats_past_the_inline_size_are_one_process_bits_warnings_and_errors(
    n: int, tmp_path: Path
) -> None:
    # MPI's built-in SUM/PROD swap operands on part of the buffer (another replica's NaN
    # sign and payload), overflow in C (no RuntimeWarning) and ignore np.seterr; the
    # inline path raised InternalError under np.seterr(all="raise"); broadcast of a
    # big-endian array returned '>f8' in one process and '<f8' across processes. Each
    # case runs on one process's MirroredStrategy and across processes, compared.
    rc, logs, output = launch(n, "float_rules.py", tmp_path=tmp_path)
    assert rc == 0, output
    for rank in range(n):
        lines = logs[rank].splitlines()
        assert lines[-1] == "done", logs[rank]
        assert len(lines) == 1 + 6 + 16 + 6, logs[rank]
        assert all(line.startswith("same ") for line in lines[:-1]), logs[rank]
    assert "Fatal Python error" not in output, output
    assert "InternalError" not in output, output


def test_an_interruption_inside_the_rank_order_operation_is_raised_after_it(
    tmp_path: Path,
) -> None:
    # A KeyboardInterrupt (a signal handler's) inside the Python operation MPI runs was
    # "Fatal Python error: exception in user-defined reduction operation" and MPI_Abort:
    # it is kept, the combine finished, and raised once the MPI call returned, in step.
    rc, logs, output = launch(2, "float_rules.py", "interrupt", tmp_path=tmp_path)
    assert "Fatal Python error" not in output, output
    assert "aborting the MPI job" not in output, output
    assert rc == 0, output
    assert logs[0] == "raised KeyboardInterrupt\ndone\n", logs[0]
    assert logs[1] == "raised ReplicaExitedError\ndone\n", logs[1]
