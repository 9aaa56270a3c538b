"""GPU devices: several replicas may share one GPU; without a usable GPU you get CPU:0."""

from asyncreplica_cupy import CupyBackend, visible_gpu_count

import asyncreplica as ar

gpus = visible_gpu_count()  # 0 without CuPy, a driver or a GPU
strategy = ar.MirroredStrategy()  # no devices: every visible GPU, else CPU:0
if gpus:
    assert strategy.extended.worker_devices == tuple(f"GPU:{i}" for i in range(gpus))
    shared = ar.MirroredStrategy(["GPU:0", "GPU:0"])  # two replicas on GPU 0
    assert shared.num_replicas_in_sync == 2
    assert isinstance(shared.backend, CupyBackend)
    print(f"{gpus} GPU(s): MirroredStrategy() uses", strategy.extended.worker_devices)
else:
    assert strategy.extended.worker_devices == ("CPU:0",)
    assert type(strategy.backend).name == "numpy"
    try:
        ar.MirroredStrategy(["GPU:0", "GPU:0"])
    except (ar.BackendError, ar.BackendNotFoundError) as exc:
        message = str(exc)
        # The error says what is missing and how to fix it.
        assert 'pip install "asyncreplica[gpu]"' in message or "nvidia-smi" in message
        print("no GPU here:", message)
    else:
        raise AssertionError("GPU devices without a GPU must raise")
