"""The ``asyncreplica demo`` program: data-parallel logistic regression.

This module is an *application* of asyncreplica, written the way a user would write a
tf.distribute custom training loop (``strategy.run(train_step, ...)`` once per global batch),
with the step function made ``async``:

1. A seeded synthetic data set (two Gaussian blobs) is split into global batches, and
   :meth:`~asyncreplica.MirroredStrategy.experimental_distribute_dataset` cuts every global
   batch into contiguous per-replica shards (a partial last batch is cut unevenly, so a replica
   may get an empty shard, as in TF).
2. Each replica computes the gradient of its shard, already scaled by ``1 / global_batch_size``
   (the standard TF recipe), and the replicas sum their gradients with
   ``await ctx.all_reduce("SUM", grads)``. Every replica then applies the same update to its
   own copy of the weights.
3. The per-replica losses are summed with ``await strategy.reduce(...)``.
4. At the end, the weights are compared with a plain numpy run that takes the full-batch
   gradient of the same global batches in one piece: data parallelism must not change the
   result beyond floating-point rounding.

Unlike the library runtime, this module imports numpy: it is a program that uses the library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import time
from collections.abc import Iterator
from typing import Literal, TextIO

import anyio
import numpy as np
from numpy.typing import NDArray

import asyncreplica as ar

__all__ = [
    "BUGS",
    "BugName",
    "DemoConfig",
    "TrainResult",
    "format_error",
    "make_dataset",
    "reference_train",
    "run_demo",
    "train",
]

FloatArray = NDArray[np.float64]
Params = dict[str, FloatArray]
"""Model weights: ``"w"`` of shape ``(features,)`` and the bias ``"b"`` of shape ``()``."""
Batch = tuple[FloatArray, FloatArray]
"""One batch: features of shape ``(n, features)`` and 0/1 labels of shape ``(n,)``."""

LoopName = Literal["asyncio", "trio", "uvloop"]
BugName = Literal["skip", "swap", "shape", "stall"]

BUGGY_REPLICA = 1
"""The replica that misbehaves when the demo runs with a bug."""
STALL_TIMEOUT_SECONDS = 0.5
"""``timeout_seconds`` of the collectives when the demo runs with the ``"stall"`` bug."""
BUGS: dict[BugName, str] = {
    "skip": f"replica {BUGGY_REPLICA} skips the all_reduce of the weight gradient",
    "swap": (
        f"replica {BUGGY_REPLICA} reduces the loss before the bias gradient; the others"
        " reduce the bias gradient first (two named collectives in swapped order)"
    ),
    "shape": f"replica {BUGGY_REPLICA}'s bias gradient has shape (1,) instead of ()",
    "stall": (
        f"replica {BUGGY_REPLICA} awaits an event that is never set"
        f" (timeout_seconds={STALL_TIMEOUT_SECONDS:g})"
    ),
}
"""Each bug the demo can show, and what it does."""


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run.

    Attributes:
        replicas: Number of replicas; they run on devices ``"CPU:0"`` .. ``"CPU:<replicas-1>"``.
        epochs: Number of passes over the data set.
        batch_size: Global batch size (all replicas together).
        samples: Number of samples in the synthetic data set.
        features: Number of features per sample.
        seed: Seed of the data set and of the per-epoch shuffles.
        learning_rate: Step size of plain gradient descent.
        backend: Backend name passed to :class:`~asyncreplica.MirroredStrategy`.
        tolerance: Largest absolute difference from the single-replica weights that still
            counts as equal.
        bug: ``None`` for the correct training step, or the name of a bug (a key of
            :data:`BUGS`) that replica :data:`BUGGY_REPLICA` makes in its step, so that the
            run fails with the error asyncreplica raises for it. Needs at least 2 replicas.
        mpi: Run across the processes of an ``mpiexec`` launch with
            :class:`~asyncreplica.MultiWorkerMirroredStrategy`: ``replicas`` is the global
            count, split as evenly as possible over the processes (rank order). Only
            rank 0 prints.
    """

    replicas: int = 4
    epochs: int = 5
    batch_size: int = 64
    samples: int = 4000
    features: int = 8
    seed: int = 0
    learning_rate: float = 0.1
    backend: str = "numpy"
    tolerance: float = 1e-9
    bug: BugName | None = None
    mpi: bool = False

    def __post_init__(self) -> None:
        if self.bug is not None and self.bug not in BUGS:
            raise ValueError(f"unknown bug {self.bug!r}; choose one of {', '.join(BUGS)}")
        if self.bug is not None and self.replicas <= BUGGY_REPLICA:
            raise ValueError(
                f"a bug needs at least {BUGGY_REPLICA + 1} replicas, got {self.replicas}"
            )

    @property
    def devices(self) -> list[str]:
        """The device of each replica, in replica order."""
        return [f"CPU:{i}" for i in range(self.replicas)]

    def local_devices(self, rank: int, size: int) -> list[str]:
        """The devices of process ``rank`` of ``size`` under MPI (replicas split evenly)."""
        count = self.replicas // size + (1 if rank < self.replicas % size else 0)
        return [f"CPU:{i}" for i in range(count)]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        params: The trained weights of replica 0.
        replica_params: The trained weights of every replica, in replica order.
        epoch_losses: Mean training loss of each epoch.
        accuracy: Fraction of the data set that the trained model classifies correctly.
        elapsed: Seconds spent training and evaluating.
    """

    params: Params
    replica_params: tuple[Params, ...]
    epoch_losses: tuple[float, ...]
    accuracy: float
    elapsed: float
    identical: bool = True

    @property
    def replicas_identical(self) -> bool:
        """Whether every replica (of every process, under MPI) ended with the same bits."""
        first = self.params
        return self.identical and all(
            all(np.array_equal(first[key], other[key]) for key in first)
            for other in self.replica_params
        )


def make_dataset(samples: int, features: int, seed: int) -> Batch:
    """Generate two Gaussian blobs, one per class, in a seeded order.

    Args:
        samples: Number of samples (half of them, rounded down, have label 0).
        features: Number of features per sample.
        seed: Seed of the random generator.

    Returns:
        The features, of shape ``(samples, features)``, and the 0/1 labels, of shape
        ``(samples,)``, both float64.
    """
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=features)
    center = 1.5 * direction / np.linalg.norm(direction)
    labels = np.zeros(samples)
    labels[samples // 2 :] = 1.0
    x = rng.normal(size=(samples, features)) + np.where(labels[:, None] > 0, center, -center)
    order = rng.permutation(samples)
    return x[order], labels[order]


def epoch_batches(data: Batch, epoch: int, batch_size: int, seed: int) -> list[Batch]:
    """Shuffle the data set for one epoch and cut it into global batches.

    The last batch is partial when ``batch_size`` does not divide the number of samples.

    Args:
        data: The whole data set, as returned by :func:`make_dataset`.
        epoch: 0-based epoch number; it seeds the shuffle together with ``seed``.
        batch_size: Global batch size.
        seed: Seed of the run.

    Returns:
        The global batches of this epoch, in order.
    """
    x, y = data
    order = np.random.default_rng([seed, epoch]).permutation(len(y))
    return [
        (x[order[i : i + batch_size]], y[order[i : i + batch_size]])
        for i in range(0, len(y), batch_size)
    ]


def _sigmoid(z: FloatArray) -> FloatArray:
    # tanh form: no overflow for large |z| (warnings are errors in the test suite).
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _losses(x: FloatArray, y: FloatArray, params: Params) -> tuple[FloatArray, FloatArray]:
    """Per-example cross-entropy and its derivative with respect to the logits."""
    logits = x @ params["w"] + params["b"]
    loss = np.logaddexp(0.0, logits) - y * logits
    return loss, _sigmoid(logits) - y


def _gradients(x: FloatArray, dlogits: FloatArray, scale: float) -> Params:
    """Gradients of ``scale * sum(loss)`` with respect to the weights."""
    return {"w": x.T @ dlogits * scale, "b": np.asarray(np.sum(dlogits) * scale)}


def _apply(params: Params, grads: Params, learning_rate: float) -> Params:
    """One step of gradient descent."""
    return {key: params[key] - learning_rate * grads[key] for key in params}


def initial_params(features: int) -> Params:
    """Return the starting weights (all zero) of a model with ``features`` inputs."""
    return {"w": np.zeros(features), "b": np.zeros(())}


async def train_step(
    batch: Batch, params: Params, global_batch_size: int, learning_rate: float
) -> tuple[Params, np.float64]:
    """One training step of one replica (run by ``strategy.run``).

    Args:
        batch: This replica's shard of the global batch (possibly empty).
        params: This replica's copy of the weights.
        global_batch_size: Number of samples in the global batch, over all replicas.
        learning_rate: Step size.

    Returns:
        The updated weights (the same on every replica) and this replica's share of the mean
        loss of the global batch (the shares add up to the mean).
    """
    x, y = batch
    loss, dlogits = _losses(x, y, params)
    # Scale by the *global* batch size, so that the SUM over replicas is the batch mean.
    scale = 1.0 / global_batch_size
    grads = _gradients(x, dlogits, scale)
    ctx = ar.get_replica_context()
    if ctx is None:
        raise RuntimeError("train_step must run inside strategy.run (a replica context)")
    summed: Params = await ctx.all_reduce(ar.ReduceOp.SUM, grads)
    new_params = _apply(params, summed, learning_rate)
    # A NumPy scalar, not a Python float: each replica must return its own object, or
    # strategy.run would unwrap equal-by-identity results into one non-distributed value.
    return new_params, np.float64(np.sum(loss) * scale)


async def _never() -> None:
    """Wait for an event that nobody sets: the stalled replica of the ``"stall"`` bug."""
    await anyio.Event().wait()


async def buggy_train_step(
    batch: Batch, params: Params, global_batch_size: int, learning_rate: float, bug: BugName
) -> tuple[Params, np.float64]:
    """A training step in which replica :data:`BUGGY_REPLICA` makes the mistake ``bug``.

    The correct replicas reduce the weight gradient, the bias gradient and the loss with
    three ``all_reduce`` calls, in that order. The faulty replica differs as :data:`BUGS`
    says, and the run fails with the error that asyncreplica raises for that class of bug
    (instead of hanging or silently mixing values).

    Args:
        batch: This replica's shard of the global batch (possibly empty).
        params: This replica's copy of the weights.
        global_batch_size: Number of samples in the global batch, over all replicas.
        learning_rate: Step size.
        bug: Which mistake the faulty replica makes (a key of :data:`BUGS`).

    Returns:
        The updated weights and the mean loss of the global batch (never, with a bug).
    """
    x, y = batch
    loss, dlogits = _losses(x, y, params)
    scale = 1.0 / global_batch_size
    grads = _gradients(x, dlogits, scale)
    share = np.float64(np.sum(loss) * scale)
    ctx = ar.get_replica_context()
    if ctx is None:
        raise RuntimeError("buggy_train_step must run inside strategy.run (a replica context)")
    faulty = ctx.replica_id_in_sync_group == BUGGY_REPLICA
    if faulty and bug == "shape":
        grads["b"] = grads["b"].reshape(1)  # as if summed with keepdims=True
    if faulty and bug == "stall":
        await _never()
    summed: Params = {}
    # The branches below are the deliberate bugs; `asyncreplica lint` flags them without
    # the ignore comments.
    if faulty and bug == "skip":  # asyncreplica: ignore
        summed["w"] = grads["w"]  # uses its own gradient: the replicas drift apart
    else:
        summed["w"] = await ctx.all_reduce(ar.ReduceOp.SUM, grads["w"])
    # For the swap, every replica names these two collectives: they then match by name, and
    # the error says that the replicas issue them in different orders. (Unnamed, the
    # swapped pair is a call-site mismatch at the first of them, which cannot tell a swap
    # from an extra or a skipped call.)
    name_b, name_loss = ("grad_b", "loss") if bug == "swap" else (None, None)
    if faulty and bug == "swap":  # asyncreplica: ignore
        total = await ctx.all_reduce(ar.ReduceOp.SUM, share, name=name_loss)
        summed["b"] = await ctx.all_reduce(ar.ReduceOp.SUM, grads["b"], name=name_b)
    else:
        summed["b"] = await ctx.all_reduce(ar.ReduceOp.SUM, grads["b"], name=name_b)
        total = await ctx.all_reduce(ar.ReduceOp.SUM, share, name=name_loss)
    return _apply(params, summed, learning_rate), np.float64(total / ctx.num_replicas_in_sync)


async def eval_step(batch: Batch, params: Params) -> np.int64:
    """Count the samples of this replica's shard that the model classifies correctly.

    Args:
        batch: This replica's shard of the global batch.
        params: This replica's copy of the weights.

    Returns:
        The number of correct predictions.
    """
    x, y = batch
    predicted = (x @ params["w"] + params["b"]) > 0.0
    return np.int64(np.count_nonzero(predicted == (y > 0.5)))


def _replica_params(strategy: ar.Strategy, params: object) -> tuple[Params, ...]:
    """Split the regrouped weights (a dict of PerReplica values) into one dict per replica."""
    if not isinstance(params, dict):
        raise TypeError(f"expected a dict of weights, got {type(params).__name__}")
    keys = sorted(params)
    columns = [strategy.experimental_local_results(params[key]) for key in keys]
    return tuple(
        {key: np.asarray(column[i]) for key, column in zip(keys, columns, strict=True)}
        for i in range(len(columns[0]))
    )


async def train(
    config: DemoConfig,
    *,
    out: TextIO | None = None,
    loop: str | None = None,
    trace: str | os.PathLike[str] | None = None,
) -> TrainResult:
    """Train the model data-parallel on ``config.replicas`` replicas.

    Prints a summary of the settings, then one line per epoch, to ``out``.

    Args:
        config: The settings of the run.
        out: Where to print; ``sys.stdout`` when ``None``.
        loop: Name of the running event loop, for the summary; left out when ``None``.
        trace: When given, record every run in a Chrome trace written to this path
            (``strategy.trace(path)``), also when a run fails.

    Returns:
        The trained weights of every replica, the loss of each epoch and the final accuracy.

    Raises:
        asyncreplica.BackendNotFoundError: ``config.backend`` names no installed backend.
        asyncreplica.CollectiveError: ``config.bug`` is set (the error it provokes).
    """
    stream = sys.stdout if out is None else out
    options = (
        ar.CommunicationOptions(timeout_seconds=STALL_TIMEOUT_SECONDS)
        if config.bug == "stall"
        else None
    )
    strategy: ar.MirroredStrategy | ar.MultiWorkerMirroredStrategy
    if config.mpi:
        from mpi4py import MPI

        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        if config.replicas < size:
            raise ValueError(
                f"--replicas {config.replicas} is fewer than the {size} MPI processes: "
                "every process needs at least one replica"
            )
        strategy = ar.MultiWorkerMirroredStrategy(
            config.local_devices(rank, size), backend=config.backend, communication_options=options
        )
        if rank != 0:
            stream = io.StringIO()  # only rank 0 prints
    else:
        strategy = ar.MirroredStrategy(
            config.devices, backend=config.backend, communication_options=options
        )
    for line in _summary(config, loop, strategy):
        print(line, file=stream)
    with contextlib.ExitStack() as stack:
        if trace is not None:
            stack.enter_context(strategy.trace(trace))
        return await _train(strategy, config, stream)


async def _train(
    strategy: ar.MirroredStrategy | ar.MultiWorkerMirroredStrategy,
    config: DemoConfig,
    stream: TextIO,
) -> TrainResult:
    """The training and evaluation loops of :func:`train`."""
    data = make_dataset(config.samples, config.features, config.seed)
    # Every replica starts from its own copy of the same weights, like a MirroredVariable.
    params: object = initial_params(config.features)
    start = time.perf_counter()
    epoch_losses: list[float] = []
    for epoch in range(config.epochs):
        batches = epoch_batches(data, epoch, config.batch_size, config.seed)
        loss_sum = 0.0
        for global_batch, shards in zip(
            batches, strategy.experimental_distribute_dataset(batches), strict=True
        ):
            global_batch_size = len(global_batch[1])
            if config.bug is None:
                params, loss = await strategy.run(
                    train_step, args=(shards, params, global_batch_size, config.learning_rate)
                )
            else:
                params, loss = await strategy.run(
                    buggy_train_step,
                    args=(shards, params, global_batch_size, config.learning_rate, config.bug),
                )
            batch_loss = await strategy.reduce(ar.ReduceOp.SUM, loss, axis=None)
            loss_sum += float(batch_loss) * global_batch_size
        epoch_losses.append(loss_sum / config.samples)
        print(
            f"epoch {epoch + 1}/{config.epochs}: loss {epoch_losses[-1]:.6f}"
            f" ({len(batches)} steps, elapsed {time.perf_counter() - start:.2f} s)",
            file=stream,
        )

    correct = 0
    batches = epoch_batches(data, 0, config.batch_size, config.seed)
    for shards in strategy.experimental_distribute_dataset(batches):
        counts = await strategy.run(eval_step, args=(shards, params))
        correct += int(await strategy.reduce(ar.ReduceOp.SUM, counts, axis=None))
    elapsed = time.perf_counter() - start

    replica_params = _replica_params(strategy, params)
    identical = all(
        all(np.array_equal(replica_params[0][key], other[key]) for key in other)
        for other in replica_params
    )
    if isinstance(strategy, ar.MultiWorkerMirroredStrategy):
        # Every process's replicas must hold the same bits: compare the extremes of
        # every weight over all replicas of all processes.
        async def extremes(p: Params) -> tuple[object, object]:
            ctx = ar.get_replica_context()
            assert ctx is not None
            return await ctx.all_reduce("MAX", p), await ctx.all_reduce("MIN", p)

        high, low = await strategy.run(extremes, args=(params,))
        high_0 = strategy.experimental_local_results(high)[0]
        low_0 = strategy.experimental_local_results(low)[0]
        identical = identical and all(
            np.array_equal(np.asarray(high_0[key]), np.asarray(low_0[key])) for key in high_0
        )
    return TrainResult(
        identical=identical,
        params=replica_params[0],
        replica_params=replica_params,
        epoch_losses=tuple(epoch_losses),
        accuracy=correct / config.samples,
        elapsed=elapsed,
    )


def reference_train(config: DemoConfig) -> Params:
    """Train the same model on one replica in plain numpy, for comparison.

    Every step takes the gradient of the whole global batch at once, on the same batches in
    the same order as :func:`train`.

    Args:
        config: The settings of the run (``config.replicas`` and ``config.backend`` are not
            used).

    Returns:
        The trained weights.
    """
    data = make_dataset(config.samples, config.features, config.seed)
    params = initial_params(config.features)
    for epoch in range(config.epochs):
        for x, y in epoch_batches(data, epoch, config.batch_size, config.seed):
            _, dlogits = _losses(x, y, params)
            params = _apply(params, _gradients(x, dlogits, 1.0 / len(y)), config.learning_rate)
    return params


def max_abs_difference(a: Params, b: Params) -> float:
    """Return the largest absolute difference between two sets of weights."""
    return max(float(np.max(np.abs(a[key] - b[key]), initial=0.0)) for key in a)


def _run_on_loop(
    config: DemoConfig, loop: LoopName, out: TextIO, trace: str | os.PathLike[str] | None
) -> TrainResult:
    async def main() -> TrainResult:
        return await train(config, out=out, loop=loop, trace=trace)

    if loop == "uvloop":
        return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})
    return anyio.run(main, backend=loop)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _summary(
    config: DemoConfig,
    loop: str | None,
    strategy: ar.MirroredStrategy | ar.MultiWorkerMirroredStrategy | None = None,
) -> Iterator[str]:
    yield (
        f"asyncreplica demo: logistic regression on {_plural(config.samples, 'sample')} x"
        f" {_plural(config.features, 'feature')}, global batch {config.batch_size},"
        f" {_plural(config.epochs, 'epoch')}"
    )
    on_loop = "" if loop is None else f", loop {loop}"
    if isinstance(strategy, ar.MultiWorkerMirroredStrategy):
        count = strategy.process_count
        where = f"{count} MPI process{'' if count == 1 else 'es'} (MultiWorkerMirroredStrategy)"
    else:
        where = ", ".join(config.devices)
    yield f"{_plural(config.replicas, 'replica')} on {where}, backend {config.backend}{on_loop}"
    if config.bug is not None:
        yield f"bug: {BUGS[config.bug]}"


def format_error(error: BaseException) -> str:
    """Return ``error`` as the last lines of its traceback show it, without the module.

    Args:
        error: An exception.

    Returns:
        ``"TypeName: message"``, followed by the exception's notes, one per line, except
        the note about hidden traceback frames: no traceback is printed here.
    """
    from asyncreplica._runtime._traceback import NOTE

    lines = [f"{type(error).__name__}: {error}"]
    lines.extend(str(note) for note in getattr(error, "__notes__", ()) if note != NOTE)
    return "\n".join(lines)


def run_demo(
    config: DemoConfig,
    *,
    loop: LoopName = "asyncio",
    out: TextIO | None = None,
    err: TextIO | None = None,
    trace: str | os.PathLike[str] | None = None,
) -> int:
    """Run the demo from synchronous code and print its report.

    With ``config.bug`` set, the run is expected to fail: the error asyncreplica raises is
    printed to ``err`` as a user sees it (type name, message, notes) and the status is 1.

    Args:
        config: The settings of the run.
        loop: The event loop to run on: ``"asyncio"``, ``"trio"`` or ``"uvloop"``.
        out: Where to print; ``sys.stdout`` when ``None``.
        err: Where to print the error of a run with a bug; ``sys.stderr`` when ``None``.
        trace: When given, write a Chrome trace of the runs to this path.

    Returns:
        0 when the data-parallel weights equal the single-replica weights (within
        ``config.tolerance``) and all replicas hold the same weights, else 1. Always 1
        when ``config.bug`` is set.

    Raises:
        asyncreplica.BackendNotFoundError: ``config.backend`` names no installed backend.
    """
    stream = sys.stdout if out is None else out
    if config.mpi:
        from mpi4py import MPI

        if MPI.COMM_WORLD.Get_rank() != 0:
            # Only rank 0 reports; every process raises the same error.
            stream = err = open(os.devnull, "w")  # noqa: SIM115 - closed at exit
    if config.bug is not None:
        errors = sys.stderr if err is None else err
        try:
            _run_on_loop(config, loop, stream, trace)
        except ar.CollectiveError as exc:
            print(format_error(exc), file=errors)
        else:
            print(
                f"the bug {config.bug!r} went unnoticed: the run completed without an error",
                file=errors,
            )
        return 1
    result = _run_on_loop(config, loop, stream, trace)
    reference = reference_train(config)
    difference = max_abs_difference(result.params, reference)
    matches = difference <= config.tolerance
    print(f"accuracy: {result.accuracy:.4f} (elapsed {result.elapsed:.2f} s)", file=stream)
    if result.replicas_identical:
        print(f"replicas: all {config.replicas} hold bitwise identical weights", file=stream)
    else:
        print(f"replicas: weights DIFFER between the {config.replicas} replicas", file=stream)
    verdict = "match" if matches else "DO NOT match"
    print(
        f"single-replica reference: weights {verdict}"
        f" (max abs difference {difference:.3g}, tolerance {config.tolerance:g})",
        file=stream,
    )
    return 0 if matches and result.replicas_identical else 1
