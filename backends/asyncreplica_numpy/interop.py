"""What the other backends share with the numpy backend: the one module meant for it.

The cupy and MPI backends give results back in their inputs' array types, on their
inputs' devices, and reduce partial results by the numpy backend's rules. They import
those rules from here, never from the numpy backend's private modules (``_devices``,
``_foreign``, ``_combine``), so that each rule exists once and the private modules can
change without breaking a backend; tests/test_layering.py holds every backend to it.

Arrays of other libraries (``_foreign``):
    :class:`Library`, :func:`library_of`, :func:`to_host`, :func:`from_host_shared`,
    :func:`takes_ownership`.
Devices (``_devices``):
    :func:`place_like`, :func:`restore_host`, :func:`several_devices`,
    :func:`unserved_device_error`.
Reduction rules (``_combine``):
    :func:`combine` (one leaf of every replica, in replica order, by the one dtype rule),
    :func:`divide_mean` (the MEAN's one division of a float or complex sum, complex part
    by part) and :func:`mean_of_integers` (the exact integer MEAN: the float64 nearest
    the true mean).
"""

from __future__ import annotations

from ._combine import _combine as combine
from ._combine import _divide as divide_mean
from ._combine import _mean_of_ints as mean_of_integers
from ._devices import place_like, restore_host, several_devices, unserved_device_error
from ._foreign import Library, from_host_shared, library_of, takes_ownership, to_host

__all__ = [
    "Library",
    "combine",
    "divide_mean",
    "from_host_shared",
    "library_of",
    "mean_of_integers",
    "place_like",
    "restore_host",
    "several_devices",
    "takes_ownership",
    "to_host",
    "unserved_device_error",
]
