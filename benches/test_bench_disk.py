"""Restores against the physical limit: the disk's own sequential bandwidth, measured in the same run.

- Write side: a restore's output -- the bytes of the SST files in the store
  when it ends (for bulk: what was written and ingested; for replay: what its
  flushes left, a lower bound on what it wrote) -- per second of restore,
  divided by the sequential write bandwidth of the same file system
  (``dd oflag=direct conv=fdatasync``, 1 MiB blocks). Goal for bulk: >= 0.5.
- Read side: the changelog bytes a bulk restore reads per second with the page
  cache dropped first, divided by the sequential read bandwidth
  (``dd iflag=direct``) of a file of the same size. Without the right to drop
  the page cache (not root) the row says so and the read is warm.

Records: 100-byte values, unique keys (the most output per record), no
compression in the log or the SST files, WAL off, no fsync per batch (the
restore syncs its files once when done).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import scaled
from statestore import TopicPartition
from statestore.restore.engine import restore_store
from support.restore_data import write_changelog

N = scaled(2_000_000, minimum=20_000)
TOPIC = "bench-disk"
ROUNDS = 3
MiB = 2**20


def dd_rate(args: list[str]) -> float:
    """Bytes per second ``dd`` reports."""
    out = subprocess.run(["dd", *args], capture_output=True, text=True, check=True).stderr
    m = re.search(r"^(\d+) bytes .* copied, ([\d.]+) s", out, re.M)
    assert m, out
    return int(m.group(1)) / float(m.group(2))


def write_bandwidth(d: Path, size_mib: int) -> float:
    f = d / "dd-write"
    try:
        return dd_rate(
            ["if=/dev/zero", f"of={f}", "bs=1M", f"count={size_mib}", "oflag=direct", "conv=fdatasync"]
        )
    finally:
        f.unlink(missing_ok=True)


def read_bandwidth(d: Path, size_mib: int) -> float:
    f = d / "dd-read"
    dd_rate(["if=/dev/urandom", f"of={f}", "bs=1M", f"count={size_mib}", "conv=fdatasync"])
    try:
        return dd_rate([f"if={f}", "of=/dev/null", "bs=1M", "iflag=direct"])
    finally:
        f.unlink(missing_ok=True)


def drop_page_cache() -> bool:
    """Drop the page cache if this process may (root on Linux)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def sst_bytes(store: Path) -> int:
    return sum(f.stat().st_size for f in store.rglob("*.sst"))


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("disk-bench") / "log"
    write_changelog(d, TOPIC, 1, N, N)
    os.sync()
    return d


def log_bytes(log: Path) -> int:
    return sum(f.stat().st_size for f in log.rglob("*.log"))


@pytest.mark.parametrize("mode", ["bulk", "replay"])
def test_restore_output_vs_disk_write_bandwidth(benchmark: Any, log: Path, tmp_path: Path, mode: str) -> None:
    tp = TopicPartition(TOPIC, 0)
    store = tmp_path / "s" / "store"
    size_mib = max(64, log_bytes(log) // MiB)
    disk = statistics.median(write_bandwidth(tmp_path, size_mib) for _ in range(ROUNDS))
    rates: list[float] = []
    outputs: list[int] = []

    def reset() -> None:
        shutil.rmtree(store.parent, ignore_errors=True)
        store.parent.mkdir(parents=True)

    def run() -> None:
        t0 = time.perf_counter()
        r = restore_store(store, log, tp, mode=mode)
        seconds = time.perf_counter() - t0
        assert r.records_applied == N
        outputs.append(sst_bytes(store))
        rates.append(outputs[-1] / seconds)

    benchmark.pedantic(run, setup=reset, rounds=ROUNDS, iterations=1)
    out_rate = statistics.median(rates)
    ratio = out_rate / disk
    benchmark.extra_info.update(
        {
            "baseline": "dd sequential write, O_DIRECT + fdatasync, same file system",
            "candidate": f"{mode} restore: SST bytes out per second",
            "ratio": ratio,
            "goal": 0.5 if mode == "bulk" else None,
            "records": N,
            "sst_MiB": outputs[-1] / MiB,
            "restore_out_MiB_per_s": out_rate / MiB,
            "disk_write_MiB_per_s": disk / MiB,
            "load_avg_1min": os.getloadavg()[0],
        }
    )
    if mode != "bulk":
        del benchmark.extra_info["goal"]
    print(f"\n{mode} output {out_rate / MiB:,.0f} MiB/s vs disk write {disk / MiB:,.0f} MiB/s: {ratio:.3f}")


def test_restore_log_read_vs_disk_read_bandwidth(benchmark: Any, log: Path, tmp_path: Path) -> None:
    tp = TopicPartition(TOPIC, 0)
    store = tmp_path / "s" / "store"
    size = log_bytes(log)
    disk = statistics.median(read_bandwidth(tmp_path, max(64, size // MiB)) for _ in range(ROUNDS))
    cold = True
    rates: list[float] = []

    def reset() -> None:
        nonlocal cold
        shutil.rmtree(store.parent, ignore_errors=True)
        store.parent.mkdir(parents=True)
        cold = drop_page_cache() and cold

    def run() -> None:
        t0 = time.perf_counter()
        r = restore_store(store, log, tp, mode="bulk")
        rates.append(r.bytes_read / (time.perf_counter() - t0))

    benchmark.pedantic(run, setup=reset, rounds=ROUNDS, iterations=1)
    rate = statistics.median(rates)
    benchmark.extra_info.update(
        {
            "baseline": "dd sequential read, O_DIRECT, same file system",
            "candidate": "bulk restore: changelog bytes read per second"
            + (", page cache dropped" if cold else ", page cache NOT dropped (no permission)"),
            "ratio": rate / disk,
            "records": N,
            "log_MiB": size / MiB,
            "restore_read_MiB_per_s": rate / MiB,
            "disk_read_MiB_per_s": disk / MiB,
            "page_cache_dropped": cold,
            "load_avg_1min": os.getloadavg()[0],
        }
    )
    print(f"\nbulk restore reads {rate / MiB:,.0f} MiB/s vs disk read {disk / MiB:,.0f} MiB/s (cold={cold})")
