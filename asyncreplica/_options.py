"""``CommunicationOptions`` and ``CommunicationImplementation``, with TensorFlow's rules."""

from __future__ import annotations

import contextlib
import copy
import enum
import math
from typing import final

__all__ = ["CommunicationImplementation", "CommunicationOptions"]


class CommunicationImplementation(enum.Enum):
    """Which collective implementation to prefer (a hint, as in TensorFlow).

    Strings are accepted in any case: ``"ring"``, ``"NCCL"``.
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


@final
class CommunicationOptions:
    """Hints for collectives, per call or strategy-wide.

    Per-call options override the strategy's ``communication_options`` field by field
    (see :meth:`merge`).

    Args:
        bytes_per_pack: Pack size for batched values; 0 puts everything in one pack.
            Packing never changes results.
        timeout_seconds: Raise ``CollectiveTimeoutError`` when a rendezvous waits
            longer than this; ``None``, ``0`` or ``math.inf`` waits for ever (a replica
            that exits or disagrees is reported at once, without any timeout). ``inf``
            differs from ``None`` in :meth:`merge` only: it overrides a finite default.
        implementation: A :class:`CommunicationImplementation` or its name.

    Raises:
        ValueError: ``bytes_per_pack`` is negative, ``timeout_seconds`` is negative or
            NaN, or ``implementation`` unknown.
        TypeError: An argument has the wrong type.
    """

    __slots__ = ("bytes_per_pack", "implementation", "timeout_seconds")

    def __init__(
        self,
        bytes_per_pack: int = 0,
        timeout_seconds: float | None = None,
        implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO,
    ) -> None:
        if isinstance(bytes_per_pack, bool) or not isinstance(bytes_per_pack, int):
            raise TypeError(f"bytes_per_pack must be an int, got {bytes_per_pack!r}")
        if bytes_per_pack < 0:
            raise ValueError(f"Argument `bytes_per_pack` must be >=0, Received {bytes_per_pack}.")
        if timeout_seconds is not None:
            if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, int | float):
                raise TypeError(
                    f"timeout_seconds must be a number of seconds or None, got {timeout_seconds!r}"
                )
            if math.isnan(timeout_seconds):
                raise ValueError(
                    "Argument `timeout_seconds` must be a number of seconds >= 0, None, 0 or "
                    f"math.inf (wait for ever), Received {timeout_seconds}."
                )
            if timeout_seconds < 0:
                raise ValueError(f"timeout_seconds must be >= 0 (or None), got {timeout_seconds}")
        if isinstance(implementation, str):
            with contextlib.suppress(ValueError):
                implementation = CommunicationImplementation(implementation.upper())
        if not isinstance(implementation, CommunicationImplementation):
            names = ", ".join(m.value for m in CommunicationImplementation)
            raise ValueError(
                "Argument `implementation` must be instance of CommunicationImplementation "
                f"or one of the strings {names}, got {implementation!r}."
            )
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = implementation

    def merge(self, options: CommunicationOptions | None) -> CommunicationOptions:
        """Return a copy of these options with ``options``' non-default fields on top.

        A field of ``options`` overrides when it is not at its default
        (``bytes_per_pack != 0``, ``timeout_seconds is not None``,
        ``implementation != AUTO``); ``timeout_seconds=0`` therefore overrides.

        Args:
            options: The options to merge in, or None.

        Returns:
            A new ``CommunicationOptions``; neither input is modified.
        """
        merged = copy.copy(self)
        if options is None:
            return merged
        if not isinstance(options, CommunicationOptions):
            raise TypeError(f"options must be CommunicationOptions or None, got {options!r}")
        if options.bytes_per_pack != 0:
            merged.bytes_per_pack = options.bytes_per_pack
        if options.timeout_seconds is not None:
            merged.timeout_seconds = options.timeout_seconds
        if options.implementation is not CommunicationImplementation.AUTO:
            merged.implementation = options.implementation
        return merged

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CommunicationOptions):
            return NotImplemented
        return (self.bytes_per_pack, self.timeout_seconds, self.implementation) == (
            other.bytes_per_pack,
            other.timeout_seconds,
            other.implementation,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, "
            f"timeout_seconds={self.timeout_seconds}, implementation={self.implementation})"
        )
