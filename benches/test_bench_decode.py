"""Decode throughput of the segment log (issue 3): ours vs kafka-python's v2 decoder, same run.

A segment of >= 1M transactional records (16-byte keys, 64-byte values,
a commit every 10,000 records) is decoded by

- baseline: kafka-python 3.0.12's pure-Python ``DefaultRecordBatch``, batch by
  batch over the segment bytes (CRC validated, every record's key and value
  touched), and
- candidate: our read_committed source (``open_committed_source``, the path
  the restore engine consumes), which also verifies CRCs and resolves every
  transaction.

Goal: >= 20x. The Python-facing reader (records materialised as Python
objects, a chunk per call) is reported alongside for information.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatch

from conftest import scaled
from statestore import SegmentLog, TopicPartition, _native

N = scaled(1_000_000, minimum=20_000)
TXN = 10_000
TP = TopicPartition("decode-bench", 0)
ROUNDS = 5


@pytest.fixture(scope="module")
def segment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("decode-bench")
    log = SegmentLog(d, sync=False)
    p = log.producer("bench")
    t0 = time.perf_counter()
    for lo in range(0, N, TXN):
        p.begin()
        p.send_many(
            TP.topic,
            TP.partition,
            [(b"key-%012d" % i, b"v" * 56 + b"%08d" % i) for i in range(lo, min(N, lo + TXN))],
        )
        p.commit()
    log.close()
    print(f"\ndecode benchmark: {N:,} records written in {time.perf_counter() - t0:.1f}s")
    return d


def kafka_python_decode(seg_files: list[Path]) -> tuple[int, int]:
    records = 0
    payload = 0
    for f in seg_files:
        data = memoryview(f.read_bytes())
        pos = 0
        while pos + 12 <= len(data):
            length = struct.unpack_from(">i", data, pos + 8)[0]
            batch = DefaultRecordBatch(bytearray(data[pos : pos + 12 + length]))
            assert batch.validate_crc()
            if not batch.is_control_batch:
                for r in batch:
                    records += 1
                    payload += len(r.key or b"") + len(r.value or b"")
            pos += 12 + length
    return records, payload


def test_decode_vs_kafka_python(benchmark: Any, segment: Path) -> None:
    files = sorted((segment / str(TP)).glob("*.log"))
    log_bytes = sum(f.stat().st_size for f in files)
    _, end, lso = SegmentLog(segment).offsets(TP)
    assert end == lso

    t0 = time.perf_counter()
    base_records, base_payload = kafka_python_decode(files)
    base = time.perf_counter() - t0

    result: dict[str, Any] = {}

    def ours() -> None:
        result["r"] = _native.log_committed_stats(str(segment), TP.topic, TP.partition, 0, end)

    benchmark.pedantic(ours, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    cand = float(benchmark.stats.stats.mean)
    stats = result["r"]
    records, payload, position = stats.records, stats.bytes, stats.position
    assert (records, payload) == (base_records, base_payload) == (N, payload)
    assert position == end

    t0 = time.perf_counter()
    py_records = sum(1 for _ in SegmentLog(segment).read(TP))
    py_read = time.perf_counter() - t0
    assert py_records == N

    ratio = base / cand
    benchmark.extra_info.update(
        {
            "baseline": "kafka-python 3.0.12 DefaultRecordBatch",
            "candidate": "rust read_committed source",
            "ratio": ratio,
            "goal": 20.0,
            "records": N,
            "log_MB": log_bytes / 1e6,
            "candidate_records_per_s": N / cand,
            "candidate_MB_per_s": log_bytes / 1e6 / cand,
            "baseline_records_per_s": N / base,
            "baseline_MB_per_s": log_bytes / 1e6 / base,
            "python_read_records_per_s": N / py_read,
        }
    )
    print(
        f"\ndecode {N:,} records ({log_bytes / 1e6:.1f} MB): rust {N / cand / 1e6:.2f} M records/s "
        f"({log_bytes / 1e6 / cand:.0f} MB/s), kafka-python {N / base / 1e6:.3f} M records/s "
        f"({log_bytes / 1e6 / base:.1f} MB/s), SegmentLog.read {N / py_read / 1e6:.2f} M records/s; "
        f"ratio {ratio:.1f}x (goal >= 20)"
    )
