"""Crash safety of checkpoint writes, for real: SIGKILL a writer at random moments.

A child process rewrites one checkpoint file in a tight loop with growing
offsets; each version has a different number of entries, so a file mixing two
versions would be caught. After every kill the file must read as one complete
version no older than the last one seen, and temp files left by killed writers
must never make a later read or write fail.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from statestore import OffsetCheckpoint, TopicPartition

KILLS = 200

WRITER = r"""
import sys
from statestore import OffsetCheckpoint, TopicPartition
path, v = sys.argv[1], int(sys.argv[2])
ckpt = OffsetCheckpoint(path)
ckpt.read()  # a leftover temp file must not disturb reading ...
first = True
while True:
    v += 1
    ckpt.write({TopicPartition("t", p): v for p in range(1 + v % 5)})  # ... nor writing
    if first:
        sys.stdout.write("ready\n"); sys.stdout.flush(); first = False
"""


def _check_version(offsets: dict[TopicPartition, int]) -> int:
    values = set(offsets.values())
    assert len(values) == 1, f"file mixes versions: {offsets}"
    (v,) = values
    assert set(offsets) == {TopicPartition("t", p) for p in range(1 + v % 5)}, f"torn file: {offsets}"
    return v


@pytest.mark.slow
def test_sigkilled_writer_never_leaves_a_torn_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    ckpt = OffsetCheckpoint(path)
    rng = random.Random(20685)
    last = 0
    advanced = 0
    for _ in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(last)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == b"ready\n", child.stderr.read() if child.stderr else b""
        # kill at a random moment of the write loop
        time.sleep(rng.random() * 0.004)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        if child.stderr:
            child.stderr.close()
        assert child.returncode == -signal.SIGKILL
        v = _check_version(ckpt.read())
        assert v >= last, f"checkpoint went back in time: {v} < {last}"
        advanced += v > last
        last = v
        leftovers = [p for p in tmp_path.iterdir() if p.name != ".checkpoint"]
        # only the writer killed last can have left a temp file; older ones were swept
        assert len(leftovers) <= 1, leftovers
    assert advanced > KILLS // 2, "the writer should have made progress between most kills"
    ckpt.write({TopicPartition("t", 0): last + 1})
    assert ckpt.read() == {TopicPartition("t", 0): last + 1}
    assert [p.name for p in tmp_path.iterdir()] == [".checkpoint"], "temp files of dead writers are swept"
