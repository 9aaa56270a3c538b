"""The ``asyncreplica`` command line.

Subcommands:

* ``demo``: data-parallel logistic regression on N CPU replicas, checked against a
  single-replica run (see :mod:`asyncreplica._demo`).

Exit status: 0 on success; 1 when the demo's weights do not match the single-replica run;
2 on a usage error (argparse) or an unknown backend or event loop.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import TYPE_CHECKING

from asyncreplica._version import __version__

if TYPE_CHECKING:
    from collections.abc import Callable

    from asyncreplica._demo import LoopName

__all__ = ["main"]

PROG = "asyncreplica"
_LOOP_PACKAGES = {"asyncio": None, "trio": "trio", "uvloop": "uvloop"}


def _positive_int(text: str) -> int:
    """Parse a command-line integer that must be at least 1 (argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    """Parse a command-line number that must be greater than 0 (argparse ``type``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "tf.distribute's replica model (Strategy.run, all_reduce, merge_call) as coroutines"
            " on one event loop, with collectives that never hang."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="data-parallel logistic regression on N CPU replicas",
        description=(
            "Train logistic regression on a seeded synthetic data set (two Gaussian blobs)"
            " data-parallel on N CPU replicas: every replica takes a contiguous shard of each"
            " global batch, the gradients are summed with all_reduce, and every replica applies"
            " the same update. The result is compared with a plain single-replica numpy run."
            " Exit status 0 when the weights match, 1 when they do not."
        ),
    )
    demo.add_argument(
        "--replicas",
        type=_positive_int,
        default=4,
        metavar="N",
        help="number of replicas, on devices CPU:0..CPU:N-1 (default: %(default)s)",
    )
    demo.add_argument(
        "--epochs",
        type=_positive_int,
        default=5,
        metavar="N",
        help="passes over the data set (default: %(default)s)",
    )
    demo.add_argument(
        "--batch-size",
        type=_positive_int,
        default=64,
        metavar="N",
        help="global batch size, over all replicas (default: %(default)s)",
    )
    demo.add_argument(
        "--samples",
        type=_positive_int,
        default=4000,
        metavar="N",
        help="samples in the synthetic data set (default: %(default)s)",
    )
    demo.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=0.1,
        metavar="LR",
        help="gradient descent step size (default: %(default)s)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the data set and its shuffles (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        default="numpy",
        metavar="NAME",
        help="asyncreplica backend that reduces the arrays (default: %(default)s)",
    )
    demo.add_argument(
        "--loop",
        choices=list(_LOOP_PACKAGES),
        default="asyncio",
        help="event loop to run the replicas on (default: %(default)s)",
    )
    demo.set_defaults(handler=_run_demo)
    return parser


def _error(command: str, message: str) -> int:
    """Print a one-line error for ``command`` on stderr and return exit status 2."""
    print(f"{PROG} {command}: error: {message}", file=sys.stderr)
    return 2


def _run_demo(args: argparse.Namespace) -> int:
    """Run ``asyncreplica demo`` with parsed arguments and return its exit status."""
    loop: LoopName = args.loop
    package = _LOOP_PACKAGES[loop]
    if package is not None and importlib.util.find_spec(package) is None:
        return _error("demo", f"--loop {loop} needs the {package!r} package: pip install {package}")

    # Imported here: numpy and the strategy are only needed once a demo actually runs.
    import asyncreplica as ar
    from asyncreplica._demo import DemoConfig, run_demo

    config = DemoConfig(
        replicas=args.replicas,
        epochs=args.epochs,
        batch_size=args.batch_size,
        samples=args.samples,
        seed=args.seed,
        learning_rate=args.learning_rate,
        backend=args.backend,
    )
    try:
        return run_demo(config, loop=loop)
    except ar.BackendNotFoundError as exc:
        # The message names the backend, the available ones and how to install it.
        return _error("demo", " ".join(str(exc).split()))


def main(argv: list[str] | None = None) -> int:
    """Run the ``asyncreplica`` command line.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when ``None``.

    Returns:
        The exit status: 0 on success, 1 when the demo's weights do not match the
        single-replica run, 2 for an unknown backend or an unavailable event loop.

    Raises:
        SystemExit: As argparse does: status 2 on a usage error, 0 after ``--help`` or
            ``--version``.
    """
    args = _build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)
