"""The state updater keeps a task's stores open, unflushed, between rounds: a crash must never leave an offset that vouches for data the stores lost.

A child process updates a standby task in rounds of 500 offsets, records its
offsets once (the policy flushes the stores it lent to the engine first),
applies two more rounds, which stay in RocksDB's memtables, and is SIGKILLed.
On disk the store must then be a committed prefix of the changelog with its
own offset; a checkpoint, where the policy writes one, no further than that
offset; and the next updater must converge to the whole changelog from there.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from statestore import OffsetCheckpoint, SegmentLog, TaskId
from statestore.processing.task import StandbyTask, build_state_manager
from statestore.processing.updater import StateUpdater
from statestore.state.directory import StateDirectory
from statestore.state.policy import Policy
from support.killer import kill_after_first_line
from support.model import expected_store, store_contents
from support.tasks import STORE, changelog_tp, produce

T = TaskId(0, 0)
TP = changelog_tp(T)
RECORDS = 3_000
ROUND = 500

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from statestore import SegmentLog, TaskId
    from statestore.processing.task import StandbyTask, build_state_manager
    from statestore.processing.updater import StateUpdater
    from statestore.state.directory import StateDirectory
    from statestore.state.policy import Policy

    root, offsets, chunk = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    log = SegmentLog(root / "log", sync=False)
    sd = StateDirectory(root / "state", "app")
    t = TaskId(0, 0)
    policy = Policy.of("at_least_once", offsets, checkpoint_delta=0)
    sb = StandbyTask(t, build_state_manager(sd, t, policy, ["s"], standby=True), log)
    sb.initialize()
    updater = StateUpdater(log, chunk_offsets=chunk, commit_interval_ms=10**9, time_slice_ms=0)
    updater.add(sb)
    updater.poll()
    updater.poll()
    updater.record_offsets()
    recorded = dict(sb.offsets())
    updater.poll()
    updater.poll()
    print(json.dumps({"recorded": list(recorded.values())[0], "applied": list(sb.offsets().values())[0]}), flush=True)
    time.sleep(60)
    """
)


def crash_after_unflushed_rounds(root: Path, offsets: str) -> dict[str, int]:
    """Run the child until two rounds sit unflushed, SIGKILL it; what it had recorded and applied."""
    line = kill_after_first_line([sys.executable, "-c", CHILD, str(root), offsets, str(ROUND)])
    out: dict[str, int] = json.loads(line)
    return out


@pytest.mark.parametrize("offsets", ["checkpoint", "store"])
def test_a_crash_loses_only_unflushed_rounds_and_no_offset_vouches_for_them(
    tmp_path: Path, offsets: str
) -> None:
    (tmp_path / "log").mkdir()
    log = SegmentLog(tmp_path / "log", sync=False)
    produce(log, TP, [(b"k%d" % (i % 300), b"v%d" % i) for i in range(RECORDS)])

    seen = crash_after_unflushed_rounds(tmp_path, offsets)
    assert seen["applied"] == 4 * ROUND - 1, seen

    sd = StateDirectory(tmp_path / "state", "app")
    try:
        path = sd.store_dir(T, STORE)
        on_disk = store_contents(path)
        in_store = on_disk.offsets[str(TP)]
        # Two rounds were never flushed: the store kept open between rounds lost them, with their offset.
        assert in_store < seen["applied"], "the last rounds stayed in memtables, unflushed"
        data, last = expected_store(log, TP, in_store + 1)
        assert last == in_store
        assert on_disk.data == data, "the store on disk is the changelog's prefix up to its own offset"
        if offsets == "checkpoint":
            checkpoint = OffsetCheckpoint(sd.checkpoint_path(T)).read()
            assert checkpoint == {TP: seen["recorded"]}
            assert in_store >= seen["recorded"], "the store was flushed before its offset was checkpointed"

        # The next owner resumes from what is on disk and converges.
        policy = Policy.of("at_least_once", offsets, checkpoint_delta=0)
        sb = StandbyTask(T, build_state_manager(sd, T, policy, [STORE], standby=True), log)
        sb.initialize()
        updater = StateUpdater(log, time_slice_ms=0)
        updater.add(sb)
        for _ in range(10):
            updater.poll()
        assert sb.offsets() == {TP: RECORDS - 1}
        updater.remove(T)
        sb.close()
        assert store_contents(path).data == expected_store(log, TP)[0]
    finally:
        sd.close()
