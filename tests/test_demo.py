"""Tests of the ``asyncreplica demo`` command and the training code behind it."""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
from importlib.machinery import ModuleSpec

import numpy as np
import pytest

import asyncreplica as ar
from asyncreplica._tools import _demo
from asyncreplica._tools._cli import main
from asyncreplica._version import __version__

# 130 samples in global batches of 64: two full batches, then a batch of 2. Over 3 replicas a
# full batch splits 22/22/20; over 4 replicas the last batch splits 1/1/0/0 (empty shards).
SMALL = ["--samples", "130", "--batch-size", "64"]

EPOCH_LINE = re.compile(
    r"^epoch (\d+)/(\d+): loss (\d+\.\d{6}) \((\d+) steps, elapsed \d+\.\d\d s\)$"
)
MATCH_LINE = re.compile(
    r"^single-replica reference: weights match \(max abs difference (\S+), tolerance 1e-09\)$"
)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    """Run ``asyncreplica demo ARGS`` in-process; return status, stdout lines and stderr."""
    status = main(["demo", *args])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def without_timings(lines: list[str]) -> list[str]:
    return [re.sub(r"elapsed \d+\.\d\d s", "elapsed - s", line) for line in lines]


def test_demo_prints_epochs_accuracy_and_match(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, err = run_cli(capsys, "--epochs", "2")

    assert status == 0
    assert err == ""
    assert lines[0] == (
        "asyncreplica demo: logistic regression on 4000 samples x 8 features,"
        " global batch 64, 2 epochs"
    )
    assert lines[1] == "4 replicas on CPU:0, CPU:1, CPU:2, CPU:3, backend numpy, loop asyncio"
    epochs = [EPOCH_LINE.match(line) for line in lines[2:4]]
    assert all(epochs), lines
    assert [(m[1], m[2], m[4]) for m in epochs if m] == [("1", "2", "63"), ("2", "2", "63")]
    losses = [float(m[3]) for m in epochs if m]
    assert 0.0 < losses[1] < losses[0] < np.log(2.0)  # starts below chance level and improves
    accuracy = re.fullmatch(r"accuracy: (\d\.\d{4}) \(elapsed \d+\.\d\d s\)", lines[4])
    assert accuracy
    assert float(accuracy[1]) > 0.9
    assert lines[5] == "replicas: all 4 hold bitwise identical weights"
    match = MATCH_LINE.match(lines[6])
    assert match, lines[6]
    assert float(match[1]) <= 1e-9
    assert len(lines) == 7


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", ["64", "7"])
def test_weights_match_single_replica(
    capsys: pytest.CaptureFixture[str], replicas: int, batch_size: str
) -> None:
    status, lines, _ = run_cli(
        capsys,
        "--epochs",
        "2",
        "--samples",
        "130",
        "--batch-size",
        batch_size,
        "--replicas",
        str(replicas),
    )

    assert status == 0, lines
    assert f"replicas: all {replicas} hold bitwise identical weights" in lines
    match = MATCH_LINE.match(lines[-1])
    assert match, lines
    difference = float(match[1])
    assert difference <= 1e-9
    if replicas == 1:
        assert difference == 0.0  # one replica does exactly the reference's arithmetic


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        pytest.param(3, [[22, 22, 20], [22, 22, 20], [1, 1, 0]], id="3-replicas"),
        pytest.param(4, [[16, 16, 16, 16], [16, 16, 16, 16], [1, 1, 0, 0]], id="4-replicas"),
    ],
)
def test_small_config_has_uneven_and_empty_shards(replicas: int, expected: list[list[int]]) -> None:
    # The premise of the test above: the demo's batches really split unevenly.
    config = _demo.DemoConfig(replicas=replicas, samples=130, batch_size=64)
    data = _demo.make_dataset(config.samples, config.features, config.seed)
    batches = _demo.epoch_batches(data, 0, config.batch_size, config.seed)
    strategy = ar.MirroredStrategy(config.devices)

    sizes = [
        [len(y) for y in strategy.experimental_local_results(labels)]
        for _, labels in strategy.experimental_distribute_dataset(batches)
    ]

    assert sizes == expected


def test_output_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    first = run_cli(capsys, "--epochs", "2", *SMALL, "--seed", "3")
    second = run_cli(capsys, "--epochs", "2", *SMALL, "--seed", "3")
    other_seed = run_cli(capsys, "--epochs", "2", *SMALL, "--seed", "4")

    assert without_timings(first[1]) == without_timings(second[1])
    assert without_timings(first[1]) != without_timings(other_seed[1])


@pytest.mark.parametrize("loop", ["asyncio", "trio", "uvloop"])
def test_loops(capsys: pytest.CaptureFixture[str], loop: str) -> None:
    pytest.importorskip(loop)

    status, lines, _ = run_cli(capsys, "--epochs", "2", *SMALL, "--replicas", "3", "--loop", loop)

    assert status == 0
    assert lines[1] == f"3 replicas on CPU:0, CPU:1, CPU:2, backend numpy, loop {loop}"
    assert MATCH_LINE.match(lines[-1])


def test_same_losses_on_every_loop(capsys: pytest.CaptureFixture[str]) -> None:
    on_asyncio = run_cli(capsys, "--epochs", "2", *SMALL, "--loop", "asyncio")[1]
    on_trio = run_cli(capsys, "--epochs", "2", *SMALL, "--loop", "trio")[1]

    assert without_timings(on_asyncio[2:]) == without_timings(on_trio[2:])


def test_unknown_backend_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines, err = run_cli(capsys, "--epochs", "1", "--backend", "no-such-backend")

    assert status == 2
    assert lines == []
    assert len(err.splitlines()) == 1
    assert err.startswith("asyncreplica demo: error: ")
    assert "'no-such-backend'" in err
    assert "numpy" in err  # names what is available


def test_missing_loop_package_is_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        return None if name == "trio" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    status, lines, err = run_cli(capsys, "--loop", "trio")

    assert status == 2
    assert lines == []
    assert (
        err == "asyncreplica demo: error: --loop trio needs the 'trio' package: pip install trio\n"
    )


def test_mismatch_exits_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_reference = _demo.reference_train

    def shifted_reference(config: _demo.DemoConfig) -> _demo.Params:
        params = real_reference(config)
        return {**params, "w": params["w"] + 1e-6}

    monkeypatch.setattr(_demo, "reference_train", shifted_reference)

    status, lines, _ = run_cli(capsys, "--epochs", "1", *SMALL)

    assert status == 1
    assert re.fullmatch(
        r"single-replica reference: weights DO NOT match"
        r" \(max abs difference 1e-06, tolerance 1e-09\)",
        lines[-1],
    )


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="no-command"),
        pytest.param(["train"], id="unknown-command"),
        pytest.param(["demo", "--replicas", "0"], id="zero-replicas"),
        pytest.param(["demo", "--epochs", "two"], id="not-a-number"),
        pytest.param(["demo", "--batch-size", "-1"], id="negative-batch"),
        pytest.param(["demo", "--learning-rate", "0"], id="zero-learning-rate"),
        pytest.param(["demo", "--loop", "curio"], id="unknown-loop"),
        pytest.param(["demo", "--bogus"], id="unknown-option"),
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    with pytest.raises(SystemExit) as exc_info:
        main(args)

    assert exc_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "usage: asyncreplica" in captured.err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc_info:
        main(["--version"])

    assert exc_info.value.code == 0
    assert capsys.readouterr().out == f"asyncreplica {__version__}\n"


@pytest.mark.anyio
async def test_train_from_async_code() -> None:
    # train() is the async API behind the command; a program can await it on its own loop.
    config = _demo.DemoConfig(replicas=3, epochs=2, samples=130, batch_size=64)
    out = io.StringIO()

    result = await _demo.train(config, out=out)

    assert result.replicas_identical
    assert len(result.replica_params) == 3
    assert len(result.epoch_losses) == 2
    assert _demo.max_abs_difference(result.params, _demo.reference_train(config)) <= 1e-9
    assert out.getvalue().splitlines()[1] == "3 replicas on CPU:0, CPU:1, CPU:2, backend numpy"


@pytest.mark.parametrize("args", [["--help"], ["demo", "--help"]], ids=["main", "demo"])
def test_python_dash_m_help(args: list[str]) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "asyncreplica", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage: asyncreplica")
    assert "demo" in completed.stdout
    assert completed.stderr == ""
