"""Metrics must not slow a restore: the same replay restore with the Prometheus exporter on and off.

With the exporter on, the restore records into ``RestoreMetrics`` through
its listener (progress every 0.1 s, the default) and a thread scrapes the
HTTP endpoint ten times a second, far more often than Prometheus would.
Rounds alternate between off and on so load drifting on the shared machine
weighs on both alike; each side's median is compared. Goal: on ÷ off speed
>= 0.97 (i.e. at most 3% slower).
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from conftest import scaled
from statestore import RestoreMetrics, TaskId, TopicPartition
from statestore.restore.engine import restore_store
from support.restore_data import write_changelog

N = scaled(1_000_000, minimum=20_000)
ROUNDS = 9
TOPIC = "bench-metrics"


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("metrics-bench") / "log"
    write_changelog(d, TOPIC, 1, N, N // 10)
    os.sync()
    return d


def test_restore_with_exporter_on_vs_off(benchmark: Any, log: Path, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from statestore.ops.exporter import start_exporter

    tp = TopicPartition(TOPIC, 0)
    metrics = RestoreMetrics("bench")
    port, _ = start_exporter(metrics)
    stop = threading.Event()
    scrapes = 0

    def scraper() -> None:
        nonlocal scrapes
        while not stop.wait(0.1):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            scrapes += 1

    def restore(listener: Any) -> float:
        store = tmp_path / "s" / "store"
        shutil.rmtree(store.parent, ignore_errors=True)
        store.parent.mkdir(parents=True)
        t0 = time.perf_counter()
        r = restore_store(store, log, tp, mode="replay", listener=listener)
        assert r.records_applied == N
        return time.perf_counter() - t0

    off: list[float] = []
    on: list[float] = []
    t = threading.Thread(target=scraper, daemon=True)
    t.start()
    try:
        restore(None)  # warm the page cache and the allocator for both sides alike

        def round_() -> None:
            off.append(restore(None))
            on.append(restore(metrics.listener(TaskId(0, 0))))

        benchmark.pedantic(round_, rounds=ROUNDS, iterations=1)
    finally:
        stop.set()
        t.join()
    base, cand = statistics.median(off), statistics.median(on)
    (s,) = metrics.snapshot().stores
    assert s.records_restored == N and s.done
    ratio = base / cand
    benchmark.extra_info.update(
        {
            "baseline": "replay restore, no metrics",
            "candidate": "replay restore, metrics + exporter scraped 10x/s",
            "ratio": ratio,
            "goal": 0.97,
            "records": N,
            "rounds": ROUNDS,
            "scrapes": scrapes,
            "off_rounds_s": " ".join(f"{x:.3f}" for x in off),
            "on_rounds_s": " ".join(f"{x:.3f}" for x in on),
            "load_avg_1min": os.getloadavg()[0],
        }
    )
    print(
        f"\nexporter on vs off: {ratio:.3f} (goal >= 0.97), off {base:.3f}s, on {cand:.3f}s, {scrapes} scrapes"
    )
