"""Find a collective that only some replicas reach, without running anything."""

from asyncreplica.lint import lint_source

broken = """\
import asyncreplica as ar

async def step(batch):
    ctx = ar.get_replica_context()
    loss = sum(batch) if batch else None
    if loss is None:
        return None  # an empty shard: this replica leaves early ...
    return await ctx.all_reduce("sum", loss)  # ... and the others wait here
"""

(finding,) = lint_source(broken, "train.py")
print(finding)
assert (finding.line, finding.col, finding.condition_line) == (8, 18, 6)
assert str(finding) == (
    "train.py:8:18: all_reduce at line 8 is skipped when `loss is None` (line 6) is true "
    "(the replica returns at line 7); a collective every replica must reach cannot depend "
    "on per-replica data (`batch`)"
)

# The fix: every replica reaches the all_reduce; an empty shard contributes zero.
fixed = broken.replace(
    "    if loss is None:\n        return None  # an empty shard: this replica leaves early ...\n",
    "",
).replace('all_reduce("sum", loss)', 'all_reduce("sum", 0.0 if loss is None else loss)')
assert lint_source(fixed, "train.py") == []

# A finding you have checked by hand is silenced by a comment on either line.
silenced = broken.replace("if loss is None:", "if loss is None:  # asyncreplica: ignore")
assert lint_source(silenced, "train.py") == []
