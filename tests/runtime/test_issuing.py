"""Issuing an all_reduce (``_runtime/_issuing``, compiled where the build compiles).

One-leaf signatures are interned under ``id(spec) ^ id(path)``: two different pairs can
share that key, so an entry is used only for its own spec and path. A signature with
another call path would pair swapped collectives silently, or report a wrong site.
"""

from __future__ import annotations

import asyncio
import inspect

import numpy as np

import asyncreplica as ar
from asyncreplica._core._signature import CallSite, Signature
from asyncreplica._runtime import _issuing


def test_an_interned_signature_is_used_only_for_its_own_spec_and_path() -> None:
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    x = np.ones(2, dtype=np.float32)
    signatures: list[Signature] = []
    line = 0

    async def step() -> float:
        nonlocal line
        ctx = ar.get_replica_context()
        assert ctx is not None
        total = 0.0
        for _ in range(3):
            line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
            call = ctx.all_reduce("sum", x)
            signature = call.signature
            signatures.append(signature)
            # Another pair's signature under this pair's key (as a collision would
            # leave it): it must not be taken for this call.
            key = id(signature.leaves[0]) ^ id(signature.call_path)
            elsewhere = (CallSite("elsewhere.py", 1, "other", 1),)
            _issuing._SIGNATURES[key] = signature._replace(call_path=elsewhere)
            total += float((await call)[0])
        return total

    result = asyncio.run(strategy.run(step))
    assert strategy.experimental_local_results(result) == (6.0, 6.0)
    assert len(signatures) == 6
    for signature in signatures:
        assert signature.call_path[0].filename == __file__
        assert signature.call_path[0].lineno == line
        assert str(signature.leaves[0]) == "float32[2]"
