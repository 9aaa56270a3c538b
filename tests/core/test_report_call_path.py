"""How messages show call paths: shared frames elided, columns only where lines collide."""

from __future__ import annotations

from asyncreplica import CollectiveMismatchError
from asyncreplica._core._signature import CallSite, CollectiveKind, LeafSpec, ReduceOp, Signature


def _sig(path: tuple[CallSite, ...]) -> Signature:
    return Signature(
        CollectiveKind.ALL_REDUCE,
        op=ReduceOp.SUM,
        leaves=(LeafSpec((3,), "float64"),),
        call_path=path,
    )


def _helpers(depth: int, caller_line: int) -> tuple[CallSite, ...]:
    inner = tuple(CallSite("/p/helpers.py", 9, "through", 12) for _ in range(depth))
    return (*inner, CallSite("/p/train.py", caller_line, "step", 5))


def _message(signatures: dict[int, Signature]) -> str:
    return str(CollectiveMismatchError(0, signatures, ("call site",), num_replicas=len(signatures)))


def test_a_deep_path_shows_the_call_site_and_the_frames_that_differ() -> None:
    text = _message({0: _sig(_helpers(20, 16)), 1: _sig(_helpers(20, 17))})
    assert (
        "replica 0 called all_reduce(SUM) on float64[3] at "
        "p/helpers.py:9 <- ... (19 frames in common) <- p/train.py:16\n"
    ) in text
    assert "replica 1 called all_reduce(SUM) on float64[3] at p/helpers.py:9 <- ... " in text
    assert "<- p/train.py:17\n" in text
    # The first differing frames are in one function: which replica is ahead.
    assert "replica 0 is at an earlier line (p/train.py:16) than replica 1 (p/train.py:17)" in text


def test_a_short_path_is_shown_whole() -> None:
    text = _message({0: _sig(_helpers(3, 16)), 1: _sig(_helpers(3, 17))})
    assert "at p/helpers.py:9 <- p/helpers.py:9 <- p/helpers.py:9 <- p/train.py:16\n" in text


def test_frames_after_the_difference_are_counted_not_listed() -> None:
    tail = tuple(CallSite("/p/loop.py", 100 + i, f"outer{i}") for i in range(30))
    a = (CallSite("/p/train.py", 16, "step"), *tail)
    b = (CallSite("/p/train.py", 17, "step"), *tail)
    text = _message({0: _sig(a), 1: _sig(b)})
    assert "at p/train.py:16 <- p/loop.py:100 <- " in text
    assert "<- ... (23 more frames)\n" in text


def test_columns_are_shown_only_where_two_calls_share_a_line() -> None:
    a = (CallSite("/p/train.py", 16, "step", 9), CallSite("/p/main.py", 3, "main", 5))
    b = (CallSite("/p/train.py", 16, "step", 27), CallSite("/p/main.py", 3, "main", 5))
    text = _message({0: _sig(a), 1: _sig(b)})
    assert "at p/train.py:16:9 <- p/main.py:3\n" in text
    assert "at p/train.py:16:27 <- p/main.py:3\n" in text


def test_paths_that_would_read_alike_when_elided_are_shown_whole() -> None:
    # Three behaviours: 0 and 1 differ at frame 9, 0 and 2 only at frame 18, so the
    # window after frame 9 cannot tell 0 from 2: every frame is shown instead.
    def path(line_9: int, line_18: int) -> tuple[CallSite, ...]:
        frames = [CallSite("/p/h.py", i, f"h{i}") for i in range(20)]
        frames[9] = CallSite("/p/h.py", line_9, "h9")
        frames[18] = CallSite("/p/h.py", line_18, "h18")
        return tuple(frames)

    text = _message({0: _sig(path(9, 18)), 1: _sig(path(90, 18)), 2: _sig(path(9, 180))})
    bullets = [line for line in text.splitlines() if line.startswith("  * ")]
    assert len(bullets) == 3
    assert len(set(bullets)) == 3
    assert any("p/h.py:180" in b for b in bullets)
