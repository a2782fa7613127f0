"""Crash safety of the segment log: a child process appending transactions is SIGKILLed at random points.

After every kill the log is reopened (torn tails repaired, the killed
producer's transaction finished by the coordinator) and checked against the
child's journal: every transaction whose commit returned is there in full,
every transaction present is complete across both partitions, and nothing
aborted or partial is ever yielded by read_committed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from statestore import SegmentLog, TopicPartition

TOPIC = "crash"
PARTITIONS = (0, 1)
TXN_ID = "crash-writer"
SEGMENT_BYTES = 64 * 1024


def child(log_dir: str, journal: str, gen: int) -> None:
    """Append transactions forever (until killed), journaling each outcome after it returned."""
    rng = random.Random(gen)
    log = SegmentLog(log_dir, segment_bytes=SEGMENT_BYTES)
    p = log.producer(TXN_ID)
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    print("ready", flush=True)
    txn = 0
    while True:
        p.begin()
        n = rng.randint(1, 60)
        for i in range(n):
            part = rng.choice(PARTITIONS)
            p.send(
                TOPIC,
                part,
                b"%d:%d" % (gen, txn),
                b"%d:%d:%d:%d:" % (gen, txn, i, n) + b"x" * rng.randint(0, 1500),
            )
        if rng.random() < 0.25:
            p.abort()
            os.write(fd, b"A %d %d\n" % (gen, txn))
        else:
            p.commit()
            os.write(fd, b"C %d %d %d\n" % (gen, txn, n))
        txn += 1


def journal_entries(journal: Path) -> tuple[dict[tuple[int, int], int], set[tuple[int, int]]]:
    committed: dict[tuple[int, int], int] = {}
    aborted: set[tuple[int, int]] = set()
    if not journal.exists():
        return committed, aborted
    for line in journal.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            continue  # killed while journaling
        f = line.split()
        if f[0] == "C":
            committed[(int(f[1]), int(f[2]))] = int(f[3])
        else:
            aborted.add((int(f[1]), int(f[2])))
    return committed, aborted


def check(log_dir: Path, journal: Path) -> int:
    """Reopen, finish what the dead producer left, and check read_committed. Returns records seen."""
    log = SegmentLog(log_dir, segment_bytes=SEGMENT_BYTES)
    try:
        # The coordinator's housekeeping: the killed producer's transaction is
        # aborted (or its interrupted commit finished).
        log.abort_expired_transactions(0)
        committed, aborted = journal_entries(journal)
        seen: dict[tuple[int, int], list[int]] = defaultdict(list)
        total = 0
        for part in PARTITIONS:
            tp = TopicPartition(TOPIC, part)
            start, end, lso = log.offsets(tp)
            assert lso == end, f"{tp}: an open transaction survived recovery (lso {lso}, end {end})"
            r = log.reader(tp, start)
            last = -1
            for rec in r:
                assert rec.offset > last
                last = rec.offset
                assert rec.value is not None
                g, t, i, n = (int(x) for x in rec.value.split(b":")[:4])
                assert rec.key == b"%d:%d" % (g, t)
                assert (g, t) not in aborted, f"aborted transaction {(g, t)} yielded at offset {rec.offset}"
                seen[(g, t)].append(i)
                total += 1
            assert r.position == end
        for g, t in committed:
            assert (g, t) in seen, f"committed transaction {(g, t)} lost"
        for (g, t), idx in seen.items():
            n = committed.get((g, t))
            if n is None:
                # The transaction in flight at the kill, committed by recovery:
                # it must still be whole.
                assert sorted(idx) == list(range(len(idx))), f"partial transaction {(g, t)}"
            else:
                assert sorted(idx) == list(range(n)), f"transaction {(g, t)} incomplete: {len(idx)} of {n}"
        # Reopening for write repairs any torn tail and works every time.
        for part in PARTITIONS:
            tp = TopicPartition(TOPIC, part)
            assert log.recover(tp) == log.end_offset(tp)
            batches = log.dump(tp)
            for seg in {b.segment for b in batches}:
                size = sum(b.size for b in batches if b.segment == seg)
                assert (log_dir / str(tp) / seg).stat().st_size == size, (
                    f"{tp}/{seg}: bytes left after the last batch"
                )
        return total
    finally:
        log.close()


def run_kills(tmp_path: Path, kills: int, max_delay: float) -> None:
    log_dir = tmp_path / "log"
    journal = tmp_path / "journal"
    rng = random.Random(1234)
    total = 0
    for gen in range(kills):
        proc = subprocess.Popen(
            [sys.executable, __file__, "child", str(log_dir), str(journal), str(gen)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"child {gen} failed to reopen the log: {err.decode(errors='replace')}")
        time.sleep(rng.uniform(0, max_delay))
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err.decode(errors="replace")
        total = check(log_dir, journal)
    committed, _ = journal_entries(journal)
    assert committed, "the children committed something"
    assert total >= sum(committed.values())


@pytest.mark.slow
def test_sigkill_while_appending_transactions(tmp_path: Path) -> None:
    run_kills(tmp_path, kills=50, max_delay=0.12)


@pytest.mark.torture
def test_sigkill_while_appending_transactions_torture(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if "torture" not in str(request.config.getoption("markexpr")):
        pytest.skip("500 kills: run with -m torture (make torture)")
    run_kills(tmp_path, kills=500, max_delay=0.4)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "child":
    child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
