"""A restore into Kafka Streams' ``.checkpoint`` layout (3.6 - 4.2) killed midway (SIGKILL).

A task's ``.checkpoint`` vouches for its stores as they are on disk; Kafka Streams resumes each
store's restoration from the offset it names. Under exactly-once a store of that layout holds no
offset of its own, so a new restore deletes it and restores it from nothing: its entry must be
gone before the store changes, or a restore that dies leaves an offset over a store that does
not hold it -- and Kafka Streams would resume from there, never reading what lies before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from statestore import OffsetCheckpoint, SegmentLog, TaskId, TopicPartition, changelog_topic
from statestore.state.layout import CHECKPOINT, store_layout
from support.model import store_contents

APP, STORE = "ckpt", "counts"
TP = TopicPartition(changelog_topic(APP, STORE), 0)

CHILD = """
import sys, time
from pathlib import Path
from statestore.cli.restore import restore_local
from statestore.restore.planning import plan
from statestore.state.layout import CHECKPOINT
from statestore.state.policy import Guarantee

log_dir, state_dir, app, store, started, block = sys.argv[1:7]

class Blocks:
    def on_restore_start(self, tp, store_name, start, end):
        pass
    def on_batch_restored(self, tp, store_name, end, n):
        Path(started).touch()
        if block == "1":
            time.sleep(120)  # killed here, the store half restored
    def on_restore_end(self, tp, store_name, total):
        pass

rows = restore_local(
    plan(Path(log_dir), app, [store], None),
    log_dir=Path(log_dir),
    state_dir=Path(state_dir),
    application_id=app,
    mode="replay",
    guarantee=Guarantee.EXACTLY_ONCE_V2,
    memory_budget_bytes=16 << 20,
    threads=1,
    listener_for=lambda w: Blocks(),
    layout=CHECKPOINT,
)
assert all(r.ok for r in rows), [r.error for r in rows]
"""


def _restore(log: Path, state: Path, started: Path, *, block: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(log), str(state), APP, STORE, str(started), "1" if block else "0"]
    )


def test_a_restore_killed_midway_leaves_no_checkpoint_offset_over_a_store_that_lacks_it(
    tmp_path: Path,
) -> None:
    log_dir, state = tmp_path / "log", tmp_path / "state"
    log = SegmentLog(log_dir, sync=False)
    producer = log.producer()
    for i in range(20_000):
        producer.send(TP.topic, TP.partition, b"k%d" % (i % 5000), b"v%d" % i)
    producer.flush()
    started = tmp_path / "started"
    assert _restore(log_dir, state, started, block=False).wait(timeout=120) == 0
    task = state / APP / str(TaskId(0, 0))
    store = task / "rocksdb" / STORE
    checkpoint = OffsetCheckpoint(task / ".checkpoint")
    assert store_layout(store) is CHECKPOINT and checkpoint.read() == {TP: 19_999}
    # More records; then a restore (deletes the store: no offset of its own under exactly-once)
    # killed once it has applied a batch.
    for i in range(20_000, 60_000):
        producer.send(TP.topic, TP.partition, b"k%d" % (i % 5000), b"v%d" % i)
    producer.flush()
    started.unlink()
    child = _restore(log_dir, state, started, block=True)
    deadline = time.monotonic() + 120
    while not started.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the restore never applied a batch"
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    # On disk: no offset in the .checkpoint, or one the store holds every record up to.
    vouched = checkpoint.read().get(TP)
    if vouched is not None:
        data = store_contents(store).data if store.exists() else {}
        latest = {b"k%d" % (i % 5000): b"v%d" % i for i in range(vouched + 1)}
        assert data == latest, (
            f".checkpoint vouches for offset {vouched} over a store holding {len(data)} of {len(latest)} keys"
        )
    # A restore run again to the end records the offset again.
    started.unlink()
    assert _restore(log_dir, state, started, block=False).wait(timeout=120) == 0
    assert checkpoint.read() == {TP: 59_999}
    assert store_contents(store).data == {b"k%d" % (i % 5000): b"v%d" % i for i in range(55_000, 60_000)}
