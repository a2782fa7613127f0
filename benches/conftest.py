"""Shared helpers for the benchmarks.

``STATESTORE_BENCH_SCALE`` (default 1.0) shrinks every data set, so CI can run
the same benchmarks quickly; ratios at small scale are indicative only.
"""

from __future__ import annotations

import os


def bench_scale() -> float:
    """The data-size factor for this run."""
    return float(os.environ.get("STATESTORE_BENCH_SCALE", "1.0"))


def scaled(n: int, minimum: int = 1000) -> int:
    """``n`` scaled by :func:`bench_scale`, never below ``minimum``."""
    return max(minimum, int(n * bench_scale()))
