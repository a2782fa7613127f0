"""statestore against what Python users would pick instead: Quix Streams' and Faust's state recovery, on one broker.

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

Faust (faust-streaming 0.15.3 with its RocksDB store, ``benches/peers/faust_app.py``,
in a virtual environment of its own) runs the same way: its agent sets
``table[key] = value`` for every message, its table's changelog topic gets
one record per update; its data directory is deleted and a fresh worker
started. **Faust's recovery time** is from its log line "Restoring state from
changelog topics..." (right after the assignment's changelog offsets are
sought) to "Done reading from changelog topics", both timestamped by Faust's
own logger (millisecond resolution).

Held equal: the broker, the records, 4 partitions, value size, no
compression, each side's default fetch settings; Quix and Faust write their
state with their own RocksDB options, statestore with its own (WAL off).
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
from peer_envs import PEER_APPS, PEERS, QUIX_VERSION, broker_or_skip, quix_python
from statestore import TopicPartition
from statestore.restore.engine import RestoreSpec, restore_many
from support.kafka_broker import Broker

kafka = pytest.importorskip("statestore.changelog.kafka")

N = scaled(1_000_000, minimum=20_000)
KEYS = max(1, N // 10)
PARTITIONS = 4
QUIX_APP = PEER_APPS / "quix_app.py"
FAUST_VERSION = "0.15.3"
FAUST_APP_DIR = PEER_APPS


def quix(py: Path, command: str, broker: Broker, **args: Any) -> dict[str, Any]:
    argv = [str(py), str(QUIX_APP), command, "--bootstrap", broker.bootstrap]
    for k, v in args.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, f"quix {command} failed:\n{out.stderr[-3000:]}"
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Broker, Path, float, list[TopicPartition]]]:
    py = quix_python()
    broker = broker_or_skip(tmp_path_factory, "peers-broker")
    work = tmp_path_factory.mktemp("peers")
    try:
        common = {
            "topic": "quix-input",
            "records": N,
            "keys": KEYS,
            "partitions": PARTITIONS,
            "app_id": "quix-bench",
        }
        quix(py, "produce", broker, **common)
        processed = quix(
            py, "process", broker, state_dir=work / "state1", commit_every=max(50, KEYS // 100), **common
        )
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


def restore_all(
    broker: Broker, root: Path, tps: list[TopicPartition], mode: str, threads: int
) -> tuple[float, int]:
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
    benchmark.extra_info.update(
        {
            "baseline": f"Quix Streams {QUIX_VERSION} recovery (assignment to recovered)",
            "candidate": f"statestore {mode} from the same changelog topics, 1 thread (native Kafka fetch)",
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
        }
    )
    print(
        f"\nstatestore {mode} vs Quix recovery: {ratio:.2f}x (goal >= {goal}); 2 threads {quix_s / two['s']:.2f}x"
    )


# -- Faust -----------------------------------------------------------------------------------------------------


def faust_bin() -> Path:
    """The ``faust`` command of faust-streaming's own virtual environment, made on first use."""
    venv = PEERS / f"faust-{FAUST_VERSION}"
    exe = venv / "bin" / "faust"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        out = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                f"faust-streaming[rocksdict]=={FAUST_VERSION}",
            ],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"faust-streaming {FAUST_VERSION} does not install here: {out.stderr[-500:]}")
    return exe


def faust_worker(exe: Path, broker: Broker, datadir: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FAUST_BROKER": broker.bootstrap, "FAUST_DATADIR": str(datadir)}
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(exe), "-A", "faust_app", "worker", "-l", "info"],
            cwd=FAUST_APP_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


def log_time(log: Path, text: str) -> float | None:
    """Seconds of the day of Faust's first log line containing ``text`` ("[2026-11-24 22:39:14,604] ...")."""
    import datetime as dt

    for line in log.read_text(errors="replace").splitlines():
        if text in line and line.startswith("["):
            stamp = dt.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


@pytest.fixture(scope="module")
def faust_setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Broker, float, list[TopicPartition]]]:
    exe = faust_bin()
    broker = broker_or_skip(tmp_path_factory, "faust-broker")
    work = tmp_path_factory.mktemp("faust")
    changelog_topic = "faust-bench-last-changelog"
    try:
        with kafka.KafkaChangelog(broker.bootstrap, request_timeout=60.0) as c:
            c.create_topics({"faust-input": PARTITIONS}, config={"cleanup.policy": "delete"})
            import random

            rng = random.Random(1)
            order = [i % KEYS for i in range(N)]
            rng.shuffle(order)
            p = c.producer()
            value = b"x" * 100
            for k in order:
                p.send("faust-input", k % PARTITIONS, b"key-%08d" % k, value)
            p.close()
            worker = faust_worker(exe, broker, work / "data1", work / "process.log")
            deadline = time.monotonic() + 1800
            try:
                while time.monotonic() < deadline:
                    time.sleep(2)
                    assert worker.poll() is None, (work / "process.log").read_text()[-3000:]
                    if (
                        changelog_topic in c.topics()
                        and sum(c.end_offset(TopicPartition(changelog_topic, q)) for q in range(PARTITIONS))
                        >= N
                    ):
                        break
                else:
                    raise AssertionError("Faust did not process the input in time")
            finally:
                stop(worker)
            tps = [TopicPartition(changelog_topic, q) for q in range(PARTITIONS)]
        worker = faust_worker(exe, broker, work / "data2", work / "recover.log")
        try:
            deadline = time.monotonic() + 1800
            while (
                time.monotonic() < deadline
                and log_time(work / "recover.log", "Done reading from changelog") is None
            ):
                assert worker.poll() is None, (work / "recover.log").read_text()[-3000:]
                time.sleep(1)
        finally:
            stop(worker)
        start = log_time(work / "recover.log", "Restoring state from changelog topics")
        end = log_time(work / "recover.log", "Done reading from changelog topics")
        assert start is not None and end is not None, (work / "recover.log").read_text()[-3000:]
        yield broker, end - start, tps
    finally:
        broker.stop()


@pytest.mark.parametrize("mode,goal", [("replay", 5.0), ("bulk", 20.0)])
def test_statestore_vs_faust_recovery(
    benchmark: Any,
    faust_setup: tuple[Broker, float, list[TopicPartition]],
    tmp_path: Path,
    mode: str,
    goal: float,
) -> None:
    broker, faust_s, tps = faust_setup
    one: dict[str, float] = {}

    def run() -> None:
        one["s"], one["n"] = restore_all(broker, tmp_path / f"ss-{mode}", tps, mode, 1)

    benchmark.pedantic(run, rounds=1, iterations=1)
    ratio = faust_s / one["s"]
    benchmark.extra_info.update(
        {
            "baseline": f"Faust {FAUST_VERSION} recovery (Restoring state... to Done reading)",
            "candidate": f"statestore {mode} from the same changelog topic, 1 thread (native Kafka fetch)",
            "ratio": ratio,
            "goal": goal,
            "records": one["n"],
            "faust_s": faust_s,
            "statestore_s": one["s"],
            "faust_records_per_s": one["n"] / faust_s,
        }
    )
    print(f"\nstatestore {mode} vs Faust recovery: {ratio:.2f}x (goal >= {goal})")
