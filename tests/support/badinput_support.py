"""The small world every bad-input and disk-full case starts from, and its model.

A world is a directory with

* ``log/`` -- a segment log holding the changelog ``app-kv-changelog-0`` of
  store ``kv`` of task ``0_0``: :data:`TXNS` transactions of
  :data:`TXN_RECORDS` records each (overwrites and tombstones), every third
  aborted, written by a transactional producer in small segments so there are
  several ``.log`` files with non-empty ``.index`` files and a
  ``transactions.state``;
* ``state/app/`` -- the state directory of a task manager that restored the
  task from that changelog and closed cleanly: process lock file, process
  metadata, task lock, the RocksDB store with its offsets column family, and
  (in checkpoint mode) a ``.checkpoint`` file.

The model is computed here from what was sent, never by reading the log back,
so a reader that makes things up cannot make the model agree with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statestore import SegmentLog, TaskId, TopicPartition
from statestore.processing.task_manager import TaskManager
from statestore.state.directory import StateDirectory

APP = "app"
STORE = "kv"
TASK = TaskId(0, 0)
TP = TopicPartition(f"{APP}-{STORE}-changelog", 0)
#: Small segments: several segment files, each with index entries.
SEGMENT_BYTES = 16 * 1024
TXNS = 9
TXN_RECORDS = 24
KEYS = 40
VALUE_BYTES = 200
#: A short transaction timeout, so a transaction left open by damage is aborted quickly.
TXN_TIMEOUT_MS = 500


@dataclass
class Model:
    """What the changelog holds: the committed state after each committed transaction."""

    #: ``(last offset of the transaction's records, state after it)`` per committed transaction.
    commits: list[tuple[int, dict[bytes, bytes]]] = field(default_factory=list)
    #: Offset of every record sent, committed or not, with its key and value.
    records: list[tuple[int, bytes, bytes | None, bool]] = field(default_factory=list)
    end_offset: int = 0

    @property
    def final(self) -> dict[bytes, bytes]:
        """The state after the last committed transaction."""
        return self.commits[-1][1] if self.commits else {}

    def states(self) -> list[dict[bytes, bytes]]:
        """Every state the committed changelog passes through at a transaction boundary (empty first)."""
        return [{}, *(state for _, state in self.commits)]

    def at(self, offset: int | None) -> dict[bytes, bytes]:
        """The committed state up to and including ``offset`` (None: nothing applied)."""
        state: dict[bytes, bytes] = {}
        if offset is None:
            return state
        for off, key, value, committed in self.records:
            if off > offset:
                break
            if not committed:
                continue
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        return state

    def to_json(self) -> str:
        """Serialise (hex) for a child process."""
        return json.dumps(
            {
                "records": [[o, k.hex(), None if v is None else v.hex(), c] for o, k, v, c in self.records],
                "commits": [[o, {k.hex(): v.hex() for k, v in s.items()}] for o, s in self.commits],
                "end": self.end_offset,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Model:
        """Inverse of :meth:`to_json`."""
        d = json.loads(text)
        m = cls()
        m.records = [
            (o, bytes.fromhex(k), None if v is None else bytes.fromhex(v), c) for o, k, v, c in d["records"]
        ]
        m.commits = [(o, {bytes.fromhex(k): bytes.fromhex(v) for k, v in s.items()}) for o, s in d["commits"]]
        m.end_offset = d["end"]
        return m


def value_of(txn: int, i: int) -> bytes:
    """A recognisable value of ``VALUE_BYTES`` bytes."""
    head = f"t{txn:02d}r{i:03d}-".encode()
    return (head * (VALUE_BYTES // len(head) + 1))[:VALUE_BYTES]


def write_changelog(
    log_dir: Path,
    *,
    txns: int = TXNS,
    txn_records: int = TXN_RECORDS,
    keys: int = KEYS,
    segment_bytes: int = SEGMENT_BYTES,
) -> Model:
    """Write the changelog and return its model."""
    model = Model()
    state: dict[bytes, bytes] = {}
    log = SegmentLog(log_dir, segment_bytes=segment_bytes, sync=False)
    try:
        producer = log.producer("generator")
        for txn in range(txns):
            committed = txn % 3 != 2
            producer.begin()
            pending: list[tuple[int, bytes, bytes | None]] = []
            for i in range(txn_records):
                key = f"k{(txn * 7 + i * 3) % keys:03d}".encode()
                value = None if (txn + i) % 5 == 4 else value_of(txn, i)
                offset = producer.send(TP.topic, TP.partition, key, value)
                pending.append((offset, key, value))
            if committed:
                producer.commit()
            else:
                producer.abort()
            for offset, key, value in pending:
                model.records.append((offset, key, value, committed))
                if committed:
                    if value is None:
                        state.pop(key, None)
                    else:
                        state[key] = value
            if committed:
                model.commits.append((pending[-1][0], dict(state)))
        log.flush()
        model.end_offset = log.end_offset(TP)
    finally:
        log.close()
    return model


def manager(root: Path, guarantee: str, offsets: str, **kw: Any) -> TaskManager:
    """A task manager over ``root/state`` and ``root/log`` with the one store ``kv``."""
    return TaskManager(
        StateDirectory(root / "state", APP),
        SegmentLog(root / "log", segment_bytes=SEGMENT_BYTES, sync=False),
        [STORE],
        guarantee=guarantee,
        offsets=offsets,
        transaction_timeout_ms=TXN_TIMEOUT_MS,
        commit_interval_ms=3_600_000,
        **kw,
    )


def build_world(root: Path, guarantee: str, offsets: str, **size: int) -> Model:
    """Write the changelog (``size``: see :func:`write_changelog`), restore task 0_0 from it and
    close cleanly; return the model."""
    root.mkdir(parents=True, exist_ok=True)
    model = write_changelog(root / "log", **size)
    tm = manager(root, guarantee, offsets)
    try:
        tm.start()
        tm.assign([TASK], [])
        if not tm.restore(timeout=60):
            raise RuntimeError("the world's task did not restore")
        got = dict(tm.active_task(TASK).store(STORE).range())
        if got != model.final:
            raise RuntimeError("the world's store does not equal its model")
    finally:
        tm.close()
        tm.directory.close()
    return model


def task_dir(root: Path) -> Path:
    """The task directory of task 0_0."""
    return root / "state" / APP / str(TASK)


def store_dir(root: Path) -> Path:
    """The RocksDB directory of store ``kv``."""
    return task_dir(root) / "rocksdb" / STORE


def partition_dir(root: Path) -> Path:
    """The segment directory of the changelog partition."""
    return root / "log" / str(TP)


def build_worlds(make_dir: Any, flavours: dict[str, tuple[str, str]]) -> dict[str, tuple[Path, Model]]:
    """One clean world per flavour ``name -> (guarantee, offsets)``, each in ``make_dir(name)``."""
    out = {}
    for name, (guarantee, offsets) in flavours.items():
        root = make_dir(f"world-{name}")
        out[name] = (root, build_world(root, guarantee, offsets))
    return out
