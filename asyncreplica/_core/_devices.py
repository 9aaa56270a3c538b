"""Device names: the spellings we accept and the canonical form we keep.

A device is where a replica's values live. We keep the short canonical spelling
``"CPU:0"`` / ``"GPU:1"``; TensorFlow's spellings (``"/cpu:0"``, ``"/device:GPU:1"``,
``"/job:localhost/replica:0/task:0/device:CPU:1"``) are accepted and folded onto it.
"""

from __future__ import annotations

import re

__all__ = ["DEVICE_TYPES", "device_type", "parse_device"]

DEVICE_TYPES = ("CPU", "GPU")

# The part after an optional "/job:.../replica:.../task:.../device:" or "/device:" or "/".
_DEVICE_RE = re.compile(
    r"^(?:/job:[^/]+)?(?:/replica:\d+)?(?:/task:\d+)?(?:/device:|/)?(?P<type>[A-Za-z]+):(?P<index>\d+)$"
)


def parse_device(spec: object) -> str:
    """Return the canonical spelling of a device name.

    Args:
        spec: A device name such as ``"CPU:0"``, ``"/gpu:1"`` or
            ``"/job:localhost/replica:0/task:0/device:CPU:1"``.

    Returns:
        The canonical form, for example ``"CPU:0"``.

    Raises:
        TypeError: ``spec`` is not a string.
        ValueError: ``spec`` is not a device name we understand.
    """
    if not isinstance(spec, str):
        raise TypeError(
            f"a device must be a string such as 'CPU:0' or 'GPU:1', not {type(spec).__name__} {spec!r}"
        )
    match = _DEVICE_RE.match(spec.strip())
    if match is None or match["type"].upper() not in DEVICE_TYPES:
        raise ValueError(
            f"unknown device {spec!r}: a device must be spelled 'CPU:<index>' or 'GPU:<index>' "
            "(TensorFlow spellings such as '/cpu:0' or "
            "'/job:localhost/replica:0/task:0/device:GPU:1' are accepted too)"
        )
    return f"{match['type'].upper()}:{int(match['index'])}"


def device_type(device: str) -> str:
    """Return ``"CPU"`` or ``"GPU"`` for a canonical device name."""
    return device.partition(":")[0]
