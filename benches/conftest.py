"""Shared helpers for the benchmarks.

``STATESTORE_BENCH_SCALE`` (default 1.0) shrinks every data set, so CI can run
the same benchmarks quickly; ratios at small scale are indicative only.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def bench_scale() -> float:
    """The data-size factor for this run."""
    return float(os.environ.get("STATESTORE_BENCH_SCALE", "1.0"))


def scaled(n: int, minimum: int = 1000) -> int:
    """``n`` scaled by :func:`bench_scale`, never below ``minimum``."""
    return max(minimum, int(n * bench_scale()))


def run_times(fn: Callable[[], Any], reset: Callable[[], None], rounds: int) -> list[float]:
    """Wall seconds of ``rounds`` calls of ``fn``, each after ``reset`` (which is not timed)."""
    times = []
    for _ in range(rounds):
        reset()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def median_time(fn: Callable[[], Any], reset: Callable[[], None], rounds: int) -> float:
    """The median of :func:`run_times`: one slow round (a page-cache miss, a GC) does not move it."""
    return statistics.median(run_times(fn, reset, rounds))


def median_times_alternating(
    baseline: Callable[[], Any], candidate: Callable[[], Any], reset: Callable[[], None], rounds: int
) -> tuple[float, float]:
    """The median wall seconds of ``rounds`` calls of each of ``baseline`` and ``candidate``, called in
    turn (each after ``reset``, not timed): a change of the shared machine's speed during the
    measurement falls on both sides alike, not on whichever ran last."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for side, fn in zip(times, (baseline, candidate), strict=True):
            side.extend(run_times(fn, reset, 1))
    return statistics.median(times[0]), statistics.median(times[1])
