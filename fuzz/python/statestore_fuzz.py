"""Fuzz targets for statestore's Python parsers of bytes found on disk.

Each target takes arbitrary bytes and checks the rule of its boundary: the
input either parses to a valid value, or raises the documented
``StateStoreError`` subclass naming the file -- never any other exception.
``fuzz_python.py`` runs them under atheris (``make fuzz``); the pytest files
``tests/test_fuzz_*.py`` run them under hypothesis (``make test``).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path

from statestore import CheckpointError, OffsetCheckpoint, StoreError, TopicPartition
from statestore.ids import OFFSET_UNKNOWN, TaskId
from statestore.state.directory import describe_lock_holder, parse_process_file
from statestore.state.store import STATUS_KEY, decode_offset_entry

_scratch: Path | None = None


def scratch_dir() -> Path:
    """One directory per process for the files the targets write (in /dev/shm when present)."""
    global _scratch
    if _scratch is None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        _scratch = Path(tempfile.mkdtemp(prefix="statestore-fuzz-", dir=base))
        atexit.register(shutil.rmtree, _scratch, True)
    return _scratch


def checkpoint(data: bytes) -> None:
    """A ``.checkpoint`` file holding ``data``: offsets that round-trip, or ``CheckpointError``."""
    path = scratch_dir() / ".checkpoint"
    path.write_bytes(data)
    ckpt = OffsetCheckpoint(path)
    try:
        offsets = ckpt.read()
    except CheckpointError as e:
        assert str(path) in str(e), f"error does not name the file: {e}"
        assert e.path == str(path)
        return
    for tp, offset in offsets.items():
        assert isinstance(tp, TopicPartition) and isinstance(tp.topic, str) and tp.topic
        assert not re.search(r"\s", tp.topic), f"topic with whitespace: {tp.topic!r}"
        assert -(2**31) <= tp.partition < 2**31
        assert isinstance(offset, int) and (0 <= offset < 2**63 or offset == OFFSET_UNKNOWN), offset
    # Nothing made up: what was read writes back and reads the same.
    ckpt.write(offsets)
    assert ckpt.read() == offsets


def process_metadata(data: bytes) -> None:
    """The process id file and the process lock file: a UUID or ``ValueError``; a description, always."""
    try:
        pid = parse_process_file(data)
    except ValueError:
        pass
    else:
        assert isinstance(pid, uuid.UUID)
    holder = describe_lock_holder(data)
    assert isinstance(holder, str) and len(holder) < 400


def offsets_entry(data: bytes) -> None:
    """One entry of a store's offsets column family (first byte: key length): a decoded offset or ``StoreError``."""
    if not data:
        return
    n = min(data[0], len(data) - 1)
    key, value = data[1 : 1 + n], data[1 + n :]
    if key == STATUS_KEY:
        return
    path = scratch_dir() / "store"
    try:
        tp, offset = decode_offset_entry(key, value, path=path, who="fuzz", task_id=TaskId(0, 0))
    except StoreError as e:
        assert str(path) in str(e) and e.path == str(path), f"error does not name the store: {e}"
        return
    # Nothing made up: the entry is exactly what the store writes for (tp, offset).
    assert str(tp).encode() == key, f"{key!r} decoded as {tp}"
    assert offset.to_bytes(8, "big", signed=True) == value


def task_dir_name(data: bytes) -> None:
    """A directory name under the state directory: a task id that names it exactly, or ``ValueError``."""
    name = data.decode("utf-8", "replace")
    try:
        tid = TaskId.parse(name)
    except ValueError:
        return
    assert str(tid) == name, f"{name!r} parsed as {tid}"


TARGETS = {
    "checkpoint": checkpoint,
    "process_metadata": process_metadata,
    "offsets_entry": offsets_entry,
    "task_dir_name": task_dir_name,
}
