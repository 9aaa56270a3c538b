"""Types of the C single pass over a batch (``_cpass.c``); documented there."""

from typing import Any

import numpy as np
import numpy.typing as npt

from asyncreplica.abc import LeafSpec

def describe(
    values: object, by_dtype: dict[np.dtype[Any], dict[tuple[int, ...], LeafSpec]], /
) -> tuple[tuple[LeafSpec, ...], np.dtype[Any], tuple[int, ...] | list[tuple[int, ...]]] | None: ...
def pack(
    row: object,
    lo: int,
    hi: int,
    dtype: np.dtype[Any],
    shapes: tuple[int, ...] | list[tuple[int, ...]],
    out: npt.NDArray[Any],
    /,
) -> int: ...
def views(
    flat: npt.NDArray[Any],
    n: int,
    shapes: tuple[int, ...] | list[tuple[int, ...]],
    lo: int,
    hi: int,
    /,
) -> list[list[npt.NDArray[Any]]]: ...
def freeze(array: npt.NDArray[Any], /) -> npt.NDArray[Any]: ...
