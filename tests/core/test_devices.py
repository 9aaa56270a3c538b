"""Device names: accepted spellings and errors."""

from __future__ import annotations

import pytest

from asyncreplica._core._devices import parse_device


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [
        ("CPU:0", "CPU:0"),
        ("cpu:1", "CPU:1"),
        ("/cpu:0", "CPU:0"),
        ("/device:GPU:1", "GPU:1"),
        ("/job:localhost/replica:0/task:0/device:CPU:1", "CPU:1"),
        (" GPU:02 ", "GPU:2"),
    ],
)
def test_accepted_spellings(spec: str, canonical: str) -> None:
    assert parse_device(spec) == canonical


@pytest.mark.parametrize("spec", ["", "CPU", "TPU:0", "CPU:x", "CPU:-1", "/job:x/CPU:0/extra"])
def test_unknown_spellings_raise_value_error(spec: str) -> None:
    with pytest.raises(
        ValueError,
        match=r"^unknown device .*: a device must be spelled 'CPU:<index>' or 'GPU:<index>'",
    ):
        parse_device(spec)


def test_non_string_raises_type_error() -> None:
    with pytest.raises(TypeError, match="a device must be a string"):
        parse_device(0)
