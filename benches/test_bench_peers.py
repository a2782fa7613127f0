"""statestore against what Python users would pick instead: Quix Streams' state recovery, on one real broker.

A Quix Streams 3.28 application (``benches/peers/quix_app.py``, run in its
own virtual environment under ``~/.cache/statestore/peers/`` because Quix pins
an older confluent-kafka) keeps the last value per message key in its RocksDB
state store while it processes ~1M input messages over 4 partitions with ~10
updates a key and 100-byte values: every message is one state update and one
record of its changelog topics. Its local state is then deleted and a fresh
instance restarted; **Quix's recovery time** is from its first partition
assignment (``RecoveryManager.assign_partition``) to the end of recovery
(``RecoveryManager.do_recovery`` returning with nothing left recovering,
right after it logs "Recovery process complete!").

statestore restores stores from **the same changelog topics** (the same
records, keys, values and headers, on the same broker), with the Kafka path
the library uses (``KafkaChangelog``), replay and bulk, on one thread and on
two (``restore_many`` over the 4 partitions). Goals: statestore ÷ Quix
>= 5x (replay) and >= 20x (bulk), each at one thread as Quix recovers on one.

Held equal: the broker, the records, 4 partitions, value size, no
compression, each side's default fetch settings; Quix writes its state with
its own RocksDB options, statestore with its own (WAL off).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import scaled
from statestore import TopicPartition
from statestore.restore import RestoreSpec, restore_many

kafka = pytest.importorskip("statestore.kafka")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "procs"))
from kafka_broker import Broker, BrokerUnavailable, start_broker  # noqa: E402

N = scaled(1_000_000, minimum=20_000)
KEYS = max(1, N // 10)
PARTITIONS = 4
QUIX_VERSION = "3.28.1"
PEERS = Path(os.environ.get("STATESTORE_CACHE", Path.home() / ".cache" / "statestore")) / "peers"
QUIX_APP = Path(__file__).resolve().parent / "peers" / "quix_app.py"


def quix_python() -> Path:
    """The interpreter of Quix Streams' own virtual environment, made on first use."""
    venv = PEERS / f"quix-{QUIX_VERSION}"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        out = subprocess.run([str(py), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"quixstreams {QUIX_VERSION} does not install here: {out.stderr[-500:]}")
    return py


def quix(py: Path, command: str, broker: Broker, **args: Any) -> dict[str, Any]:
    argv = [str(py), str(QUIX_APP), command, "--bootstrap", broker.bootstrap]
    for k, v in args.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, f"quix {command} failed:\n{out.stderr[-3000:]}"
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, Path, float, list[TopicPartition]]]:
    py = quix_python()
    try:
        broker = start_broker(tmp_path_factory.mktemp("peers-broker"))
    except BrokerUnavailable as e:
        pytest.skip(f"no Kafka broker could start: {e}")
    work = tmp_path_factory.mktemp("peers")
    try:
        common = {"topic": "quix-input", "records": N, "keys": KEYS, "partitions": PARTITIONS, "app_id": "quix-bench"}
        quix(py, "produce", broker, **common)
        processed = quix(py, "process", broker, state_dir=work / "state1", commit_every=max(50, KEYS // 100), **common)
        assert processed["processed"] >= N
        recovered = quix(py, "recover", broker, state_dir=work / "state2", **common)
        assert recovered["changelog_records"] >= 0.9 * N, recovered
        with kafka.KafkaChangelog(broker.bootstrap) as c:
            topics = [t for t in c.topics() if t.startswith("changelog__")]
            assert len(topics) == 1, topics
            tps = [TopicPartition(topics[0], p) for p in range(PARTITIONS)]
        yield broker, work, float(recovered["assign_to_recovered_s"]), tps
    finally:
        broker.stop()


def restore_all(broker: Broker, root: Path, tps: list[TopicPartition], mode: str, threads: int) -> tuple[float, int]:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    with kafka.KafkaChangelog(broker.bootstrap, request_timeout=60.0) as c:
        specs = [RestoreSpec(root / f"p{tp.partition}", c, tp, mode=mode) for tp in tps]
        t0 = time.perf_counter()
        results = restore_many(specs, threads=threads)
        seconds = time.perf_counter() - t0
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return seconds, sum(r.records_applied for r in results)


@pytest.mark.parametrize("mode,goal", [("replay", 5.0), ("bulk", 20.0)])
def test_statestore_vs_quix_streams_recovery(
    benchmark: Any, setup: tuple[Broker, Path, float, list[TopicPartition]], mode: str, goal: float
) -> None:
    broker, work, quix_s, tps = setup
    two: dict[str, float] = {}

    def run() -> None:
        two["s"], two["n"] = restore_all(broker, work / f"ss-{mode}-2", tps, mode, 2)

    one_s, n = restore_all(broker, work / f"ss-{mode}-1", tps, mode, 1)
    benchmark.pedantic(run, rounds=1, iterations=1)
    assert n == two["n"]
    ratio = quix_s / one_s
    benchmark.extra_info.update({
        "baseline": f"Quix Streams {QUIX_VERSION} recovery (assignment to recovered)",
        "candidate": f"statestore {mode} from the same changelog topics, 1 thread (Kafka path: confluent-kafka)",
        "ratio": ratio,
        "goal": goal,
        "records": n,
        "partitions": PARTITIONS,
        "quix_s": quix_s,
        "statestore_1_thread_s": one_s,
        "statestore_2_threads_s": two["s"],
        "ratio_2_threads": quix_s / two["s"],
        "quix_records_per_s": n / quix_s,
        "statestore_records_per_s": n / one_s,
    })
    print(f"\nstatestore {mode} vs Quix recovery: {ratio:.2f}x (goal >= {goal}); 2 threads {quix_s / two['s']:.2f}x")
