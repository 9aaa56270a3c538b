"""The asyncreplica pytest plugin: a ``strategy`` fixture and schedule fuzzing.

Installing asyncreplica registers this plugin with pytest (entry point ``pytest11``, name
``asyncreplica``). Where plugins are not loaded automatically
(``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), load it with ``-p asyncreplica``; without the entry
point (a source checkout that is not installed), with ``-p asyncreplica.testing._plugin``.
Never both: pytest refuses to register one module under two names.

Fixtures:

* ``strategy``: a fresh :class:`~asyncreplica.MirroredStrategy` per test, and the test runs
  once per replica count (``--asyncreplica-replicas``, default ``2,4``) and per backend
  (``--asyncreplica-backends``, default: every installed backend that can run here, so no
  ``cupy`` variants without a GPU). A backend named in ``--asyncreplica-backends`` whose
  ``check_available()`` fails skips its tests with the reason; a device backend with fewer
  devices than replicas skips too. Test ids end in ``[numpy-2]``, ``[numpy-4]``, ...
* ``asyncreplica_strategy_factory``: ``factory(replicas=2, *, backend=None, **kwargs)``
  makes strategies with other counts or arguments, honouring the schedule options below.

The marker ``@pytest.mark.asyncreplica(replicas=[1, 3], backends=["numpy"])`` overrides
the counts and backends of the ``strategy`` fixture for one test.

Schedule fuzzing: with ``--asyncreplica-schedule=random`` every strategy is created with
``MirroredStrategy(..., schedule="random", seed=S)``, which varies (reproducibly) the order
in which replicas start and resume after each collective, so that order-dependent bugs in
the code under test show up. ``S`` is ``--asyncreplica-seed`` when given, else a number
derived from the test's node id (stable from run to run); the k-th strategy a test
creates gets ``S + k``. The report header says which mode is on, and a failing test's
report has an ``asyncreplica`` section with its seed and the option that replays it::

    pytest "tests/test_step.py::test_sum[numpy-4]" --asyncreplica-schedule=random --asyncreplica-seed=1234567

Every option can also go in ``addopts`` of the pytest configuration. The fixtures are plain
(synchronous) fixtures, so they work with any async test runner: pytest-asyncio (strict
or auto mode), anyio's pytest plugin, or a test that calls ``asyncio.run`` itself.
"""

from __future__ import annotations

import dataclasses
import shlex
import zlib
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import asyncreplica

__all__ = [
    "StrategyFactory",
    "asyncreplica_strategy_factory",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_report_header",
    "pytest_runtest_makereport",
    "strategy",
]

SCHEDULES = ("fifo", "random")
DEFAULT_REPLICAS = "2,4"
MARKER = "asyncreplica"
_CREATED = pytest.StashKey[list["_Created"]]()
_USABLE = pytest.StashKey[tuple[tuple[str, ...], tuple[str, ...]]]()


@dataclasses.dataclass(frozen=True)
class _Created:
    """A strategy made for a test, as its failure report describes it."""

    replicas: int
    backend: str
    schedule: str
    seed: int | None


def _replica_counts(text: str) -> list[int]:
    """Parse ``--asyncreplica-replicas``: a comma-separated list of positive integers."""
    counts = []
    for part in text.split(","):
        try:
            count = int(part.strip())
        except ValueError:
            raise pytest.UsageError(
                f"--asyncreplica-replicas must be a comma-separated list of positive integers"
                f" such as 1,2,4, got {text!r}"
            ) from None
        if count < 1:
            raise pytest.UsageError(
                f"--asyncreplica-replicas: a replica count must be at least 1, got {count}"
            )
        if count not in counts:
            counts.append(count)
    return counts


def _names(text: str | None) -> list[str] | None:
    """Parse ``--asyncreplica-backends``: comma-separated names, ``None`` when not given."""
    if text is None:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--asyncreplica-*`` options (pytest hook)."""
    group = parser.getgroup("asyncreplica", "asyncreplica strategy fixture and schedule fuzzing")
    group.addoption(
        "--asyncreplica-replicas",
        default=DEFAULT_REPLICAS,
        metavar="N,N,...",
        help=f"replica counts of the `strategy` fixture (default: {DEFAULT_REPLICAS})",
    )
    group.addoption(
        "--asyncreplica-backends",
        default=None,
        metavar="NAME,...",
        help=(
            "backends of the `strategy` fixture (default: every installed backend that can"
            " run here)"
        ),
    )
    group.addoption(
        "--asyncreplica-schedule",
        default="fifo",
        choices=SCHEDULES,
        help=(
            "fifo: replicas run in a fixed order; random: a seeded random interleaving of"
            " replicas between collectives (default: fifo)"
        ),
    )
    group.addoption(
        "--asyncreplica-seed",
        default=None,
        type=int,
        metavar="N",
        help=(
            "seed of --asyncreplica-schedule=random (default: derived from each test's node"
            " id); a failing test's report prints the seed that replays it"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marker and check the options early (pytest hook)."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(replicas=None, backends=None): replica counts and backend names of the"
        " `strategy` fixture for this test (default: the --asyncreplica-replicas and"
        " --asyncreplica-backends options)",
    )
    _replica_counts(config.getoption("asyncreplica_replicas"))


def pytest_report_header(config: pytest.Config) -> str:
    """Say how the plugin makes strategies (pytest hook)."""
    counts = ",".join(str(n) for n in _replica_counts(config.getoption("asyncreplica_replicas")))
    backends = _names(config.getoption("asyncreplica_backends"))
    if backends:
        which = ",".join(backends)
    else:
        usable, unusable = _default_backends(config)
        which = ",".join(usable) or "none"
        if unusable:
            which += f" ({', '.join(unusable)} cannot run here: 'asyncreplica doctor' says why)"
    line = f"asyncreplica: replicas {counts}; backends {which}"
    schedule: str = config.getoption("asyncreplica_schedule")
    if schedule == "random":
        seed: int | None = config.getoption("asyncreplica_seed")
        which = "derived from each test's id" if seed is None else str(seed)
        line += f"; schedule random, seed {which}"
    else:
        line += "; schedule fifo"
    return line


def _installed_backends() -> tuple[str, ...]:
    from asyncreplica._registry import available_backends

    return available_backends()


def _can_run(name: str) -> bool:
    """Whether backend ``name`` loads and passes its ``check_available()`` here."""
    import asyncreplica as ar
    from asyncreplica._registry import load_backend_class

    try:
        load_backend_class(name).check_available()
    except (ar.BackendNotFoundError, ar.BackendError):
        return False
    return True


def _default_backends(config: pytest.Config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The installed backends that can run here, and those that cannot (checked once)."""
    if _USABLE not in config.stash:
        installed = _installed_backends()
        usable = tuple(name for name in installed if _can_run(name))
        config.stash[_USABLE] = (usable, tuple(n for n in installed if n not in usable))
    return config.stash[_USABLE]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise the ``strategy`` fixture over replica counts and backends (pytest hook)."""
    if "strategy" not in metafunc.fixturenames:
        return
    # Only our fixture: a project that defines its own `strategy` fixture keeps it as it is.
    definitions = getattr(metafunc, "_arg2fixturedefs", {}).get("strategy", ())
    if not definitions or getattr(definitions[-1].func, "__module__", None) != __name__:
        return
    config = metafunc.config
    counts = _replica_counts(config.getoption("asyncreplica_replicas"))
    backends = _names(config.getoption("asyncreplica_backends")) or list(
        _default_backends(config)[0]
    )
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is not None:
        if marker.args:
            raise pytest.UsageError(
                f"{metafunc.definition.nodeid}: use @pytest.mark.{MARKER}(replicas=[...],"
                " backends=[...]) with keyword arguments"
            )
        counts = list(marker.kwargs.get("replicas", counts))
        backends = list(marker.kwargs.get("backends", backends))
    params = [
        pytest.param((backend, count), id=f"{backend}-{count}")
        for backend in backends
        for count in counts
    ]
    metafunc.parametrize("strategy", params, indirect=True)


def _seed(item: pytest.Item) -> int:
    """The seed of the first strategy of ``item``: the option, or one from its node id."""
    given: int | None = item.config.getoption("asyncreplica_seed")
    if given is not None:
        return given
    return zlib.crc32(item.nodeid.encode("utf-8"))


def _devices(backend_cls: type[Any], backend: str, replicas: int) -> list[str]:
    """``replicas`` devices on ``backend``: CPU:0..N-1, or the first N of its devices."""
    from asyncreplica._core._devices import device_type

    defaults = list(backend_cls.default_devices())
    if not defaults or all(device_type(d) == "CPU" for d in defaults):
        return [f"CPU:{i}" for i in range(replicas)]
    if len(defaults) < replicas:
        pytest.skip(
            f"backend {backend!r} has {len(defaults)} device(s) ({', '.join(defaults)}),"
            f" fewer than the {replicas} replicas this test asks for"
        )
    return defaults[:replicas]


class StrategyFactory:
    """Make :class:`~asyncreplica.MirroredStrategy` objects for one test.

    The ``asyncreplica_strategy_factory`` fixture returns one. Each strategy gets the
    plugin's schedule (``--asyncreplica-schedule``) and seed, unless ``schedule=`` or
    ``seed=`` is passed; the k-th strategy of a test gets seed ``S + k``.

    Args:
        item: The test being run.
    """

    def __init__(self, item: pytest.Item) -> None:
        self._item = item
        self._created = item.stash.setdefault(_CREATED, [])

    def __call__(
        self, replicas: int = 2, *, backend: str | None = None, **kwargs: Any
    ) -> asyncreplica.MirroredStrategy:
        """Make a strategy of ``replicas`` replicas.

        Args:
            replicas: How many replicas (devices ``CPU:0`` ..; a device backend uses its
                first ``replicas`` devices and skips the test if it has fewer).
            backend: A backend name; ``"numpy"`` when ``None``. A backend that fails
                ``check_available()`` skips the test with the reason.
            **kwargs: More keyword arguments of ``MirroredStrategy`` (``schedule`` and
                ``seed`` override the plugin's options).

        Returns:
            The strategy.

        Raises:
            ValueError: ``replicas`` is less than 1.
        """
        import asyncreplica as ar
        from asyncreplica._registry import load_backend_class

        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"replicas must be a positive integer, got {replicas!r}")
        name = "numpy" if backend is None else backend
        try:
            cls = load_backend_class(name)
            cls.check_available()
        except (ar.BackendNotFoundError, ar.BackendError) as exc:
            pytest.skip(f"backend {name!r} is not available: {' '.join(str(exc).split())}")
        devices = _devices(cls, name, replicas)
        config = self._item.config
        schedule: str = kwargs.pop("schedule", config.getoption("asyncreplica_schedule"))
        if "seed" in kwargs:
            seed: int | None = kwargs.pop("seed")
        elif schedule == "random":
            seed = (_seed(self._item) + len(self._created)) % 2**32
        else:
            seed = None
        made = ar.MirroredStrategy(devices, backend=name, schedule=schedule, seed=seed, **kwargs)
        self._created.append(_Created(replicas, name, *made.schedule))
        return made


@pytest.fixture
def asyncreplica_strategy_factory(request: pytest.FixtureRequest) -> StrategyFactory:
    """A factory of strategies for counts or arguments the ``strategy`` fixture lacks.

    Call it as ``factory(3)``, ``factory(2, backend="numpy", check_call_sites=False)``; it
    applies ``--asyncreplica-schedule`` and the seed like the ``strategy`` fixture.
    """
    return StrategyFactory(request.node)


@pytest.fixture
def strategy(
    request: pytest.FixtureRequest, asyncreplica_strategy_factory: StrategyFactory
) -> asyncreplica.MirroredStrategy:
    """A fresh ``MirroredStrategy``; the test runs once per replica count and backend.

    The counts come from ``--asyncreplica-replicas`` (default ``2,4``), the backends from
    ``--asyncreplica-backends`` (default: every installed one that can run here), both
    overridable with ``@pytest.mark.asyncreplica(replicas=..., backends=...)``. With
    ``--asyncreplica-schedule=random`` the strategy interleaves replicas in a seeded
    random order.
    """
    param = getattr(request, "param", None)
    backend, replicas = param if param is not None else ("numpy", 2)
    return asyncreplica_strategy_factory(replicas, backend=backend)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Add the seeds of a failed test's strategies to its report (pytest hook)."""
    report = yield
    created = item.stash.get(_CREATED, [])
    if report.failed and created:
        report.sections.append(("asyncreplica", _describe_created(item, created)))
    return report


def _describe_created(item: pytest.Item, created: Sequence[_Created]) -> str:
    lines = []
    for index, made in enumerate(created):
        seed = "" if made.seed is None else f", seed {made.seed}"
        lines.append(
            f"strategy {index}: {made.replicas} replicas, backend {made.backend},"
            f" schedule {made.schedule}{seed}"
        )
    randoms = [made for made in created if made.schedule == "random" and made.seed is not None]
    if randoms:
        first = (randoms[0].seed or 0) - created.index(randoms[0])
        lines.append(
            f"replay: pytest {shlex.quote(item.nodeid)} --asyncreplica-schedule=random"
            f" --asyncreplica-seed={first % 2**32}"
        )
    return "\n".join(lines)
