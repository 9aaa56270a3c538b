"""What docs/migration.md says about behaviour, checked against the code."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import asyncreplica as ar

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
TEXT = " ".join(PAGE.read_text(encoding="utf-8").split())


def test_a_list_of_numbers_as_a_global_batch_is_sliced_as_a_list() -> None:
    claim = "`[1.0, 2.0, 3.0]` over two replicas gives `[1.0, 2.0]` and `[3.0]`"
    assert claim in TEXT
    strategy = ar.MirroredStrategy(["CPU:0", "CPU:1"])
    [batch] = list(strategy.experimental_distribute_dataset([[1.0, 2.0, 3.0]]))
    assert strategy.experimental_local_results(batch) == ([1.0, 2.0], [3.0])
    # the advice: an array gives array slices
    [batch] = list(strategy.experimental_distribute_dataset([np.asarray([1.0, 2.0, 3.0])]))
    first, second = strategy.experimental_local_results(batch)
    assert isinstance(first, np.ndarray)
    assert first.tolist() == [1.0, 2.0]
    assert second.tolist() == [3.0]


def test_the_experimental_namespace_claim_holds() -> None:
    assert "There is no `ar.experimental` module" in TEXT
    assert not hasattr(ar, "experimental")
    assert ar.CommunicationOptions.__name__ == "CommunicationOptions"
    assert ar.CommunicationImplementation.__name__ == "CommunicationImplementation"
