"""A backend name that no installed backend has: BackendNotFoundError."""

import asyncreplica as ar

try:
    ar.MirroredStrategy(["CPU:0", "CPU:1"], backend="nunpy")  # BUG: a typo
except ar.BackendNotFoundError as exc:
    error = exc
else:
    raise SystemExit("expected BackendNotFoundError")

print(error)
print("name:", error.name, "available:", error.available)
assert type(error) is ar.BackendNotFoundError
assert isinstance(error, LookupError)
assert error.name == "nunpy"
assert "numpy" in error.available
