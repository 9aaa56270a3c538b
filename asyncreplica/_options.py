"""``CommunicationOptions`` and ``CommunicationImplementation``, with TensorFlow's rules."""

from __future__ import annotations

import contextlib
import copy
import enum
import math
import numbers
import reprlib
from typing import SupportsFloat, cast, final

__all__ = ["CommunicationImplementation", "CommunicationOptions"]


class CommunicationImplementation(enum.Enum):
    """Which collective implementation to prefer (a hint, as in TensorFlow).

    Strings are accepted in any case: ``"ring"``, ``"NCCL"``.
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


def seconds_option(value: object, option: str, *, zero_allowed: bool) -> float | None:
    """Check a "number of seconds" option (``value`` as given) and return it as a float.

    The one rule for every option that counts seconds (``timeout_seconds``,
    ``stall_warning_seconds``), in constructors and assignments alike. Any real number
    is accepted: int, float, ``fractions.Fraction`` and numpy's integer and floating
    scalars (all :class:`numbers.Real`); an int too large for a float (``10**400``)
    is ``math.inf``, which it is for every wait. A bool, NaN, a negative number, a
    string, a complex number or an array is refused with the option's name.

    Args:
        value: The value given, or None (returned as it is).
        option: The option's name, for the message.
        zero_allowed: Whether 0 is accepted (``timeout_seconds``: it waits for ever);
            otherwise the number must be positive.

    Returns:
        ``value`` as a plain float (``-0.0`` as ``0.0``), or None.

    Raises:
        TypeError: ``value`` is not a real number (a bool, a string, a complex, ...).
        ValueError: ``value`` is NaN, negative, or 0 where 0 is not allowed.
    """
    if value is None:
        return None
    wanted = (
        "a number of seconds >= 0 (0 or math.inf: wait for ever) or None"
        if zero_allowed
        else "a positive number of seconds (math.inf: never) or None"
    )
    advice = f"pass an int or a float such as {option}=30.0, or None"
    given = reprlib.repr(value)  # 10**400 in 30 characters
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{option} must be {wanted}, got {given} ({type(value).__name__}); {advice}"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int (or a Fraction) beyond a float's range
        seconds = -math.inf if cast("float", value) < 0 else math.inf
    if math.isnan(seconds) or seconds < 0 or (seconds == 0 and not zero_allowed):
        raise ValueError(f"{option} must be {wanted}, got {given}; {advice}")
    return seconds + 0.0  # -0.0 as 0.0


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
            Any real number is accepted (numpy's integer and floating scalars too) and
            kept as a float; an int too large for a float is ``math.inf``.
        implementation: A :class:`CommunicationImplementation` or its name.

    The fields can be set after creation, as TensorFlow's can; each value is checked
    as the constructor checks it.

    Raises:
        ValueError: ``bytes_per_pack`` is negative, ``timeout_seconds`` is negative or
            NaN, or ``implementation`` unknown (given or set later).
        TypeError: An argument has the wrong type (``timeout_seconds`` a bool, a
            string, a complex: anything but a real number or None).
    """

    # The fields are properties that check every value they are given, in __init__ and
    # after it alike (TensorFlow's options are plain attributes, set after creation too):
    # an options object never holds a value that the constructor would refuse.
    __slots__ = ("_bytes_per_pack", "_implementation", "_timeout_seconds")

    def __init__(
        self,
        bytes_per_pack: int = 0,
        timeout_seconds: SupportsFloat | None = None,
        implementation: CommunicationImplementation | str = CommunicationImplementation.AUTO,
    ) -> None:
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = implementation

    @property
    def bytes_per_pack(self) -> int:
        """Pack size for batched values; 0 puts everything in one pack.

        Raises:
            ValueError: Set to a negative number.
            TypeError: Set to something other than an int.
        """
        return self._bytes_per_pack

    @bytes_per_pack.setter
    def bytes_per_pack(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"bytes_per_pack must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"Argument `bytes_per_pack` must be >=0, Received {value}.")
        self._bytes_per_pack = value

    @property
    def timeout_seconds(self) -> float | None:
        """Seconds a rendezvous may wait (a float); ``None``, ``0`` or ``math.inf``: for ever.

        Raises:
            ValueError: Set to a negative number or NaN.
            TypeError: Set to something other than a real number or None.
        """
        return self._timeout_seconds

    @timeout_seconds.setter
    def timeout_seconds(self, value: SupportsFloat | None) -> None:
        self._timeout_seconds = seconds_option(value, "timeout_seconds", zero_allowed=True)

    @property
    def implementation(self) -> CommunicationImplementation:
        """The preferred :class:`CommunicationImplementation` (a name is accepted when set).

        Raises:
            ValueError: Set to an unknown implementation.
        """
        return self._implementation

    @implementation.setter
    def implementation(self, value: CommunicationImplementation | str) -> None:
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                value = CommunicationImplementation(value.upper())
        if not isinstance(value, CommunicationImplementation):
            names = ", ".join(m.value for m in CommunicationImplementation)
            raise ValueError(
                "Argument `implementation` must be instance of CommunicationImplementation "
                f"or one of the strings {names}, got {value!r}."
            )
        self._implementation = value

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
