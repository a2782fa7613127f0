"""Child process of the bad-input and disk-full suites: runs one user-facing path on a world.

Usage: ``badinput_child.py '<json spec>'``. The spec names the world root,
the ``action`` and its options, and optionally

* ``user``: drop to this user (``nobody``) before acting, so a file the parent
  made unreadable really is unreadable (tests run as root);
* ``fsize``: an ``RLIMIT_FSIZE`` in bytes (``SIGXFSZ`` ignored, so a write that
  would grow a file past it fails with ``EFBIG``, as on a full disk), set
  before acting or, with ``limit_after_commits``, only after that many
  successful commits.

The last stdout line is ``RESULT <json>``: ``{"ok": true, ...}`` with what was
read, or ``{"ok": false, "cls", "statestore", "msg", "path"}`` for the
exception that ended the action. A crash leaves no result and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import pickle  # noqa: F401  (rocksdict imports it lazily: load it while the interpreter's files are readable)
import pwd
import resource
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from statestore import SegmentLog
from statestore.errors import StateStoreError, TaskCorruptedError
from statestore.restore.engine import restore_store
from statestore.state.directory import StateDirectory
from statestore.state.store import Store
from support.badinput_support import STORE, TASK, TP, manager, store_dir


def _hex(d: dict[bytes, bytes]) -> dict[str, str]:
    return {k.hex(): v.hex() for k, v in d.items()}


def set_fsize(limit: int) -> None:
    """Writes past ``limit`` bytes fail with EFBIG (the signal that would kill us is ignored)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def drop_to(user: str) -> None:
    """Become ``user`` for good (real and effective ids), with no supplementary groups."""
    pw = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def _limit(root: Path, spec: dict[str, Any]) -> int:
    """The file size limit to set mid-run."""
    return int(spec["fsize"])


def act_manager(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Start, assign, restore; read the store; then process and commit ``commits`` transactions."""
    tm = manager(root, spec["guarantee"], spec["offsets"], **spec.get("manager_options", {}))
    out: dict[str, Any] = {"committed": []}
    try:
        tm.start()
        tm.assign([TASK], [])
        if not tm.restore(timeout=spec.get("restore_timeout", 15)):
            return {
                "ok": False,
                "cls": "Hang",
                "statestore": False,
                "msg": "restore did not finish",
                "path": None,
            }
        task = tm.active_task(TASK)
        view = task.store(STORE)
        try:
            out["store"] = _hex(dict(view.range()))
        except TaskCorruptedError as e:
            # Damaged store files found by a read: handled as Kafka's stream thread does.
            out["corrupted"] = str(e)
            tm.handle_corruption(e.task_ids)
            if not tm.restore(timeout=spec.get("restore_timeout", 15)):
                return {
                    "ok": False,
                    "cls": "Hang",
                    "statestore": False,
                    "msg": "restore did not finish",
                    "path": None,
                }
            task = tm.active_task(TASK)
            view = task.store(STORE)
            out["store"] = _hex(dict(view.range()))
        out["offsets"] = {str(tp): off for tp, off in task.offsets().items()}
        after = spec.get("limit_after_commits")
        for n in range(spec.get("commits", 1)):
            if after is not None and n == after:
                if spec.get("drop_to"):
                    drop_to(spec["drop_to"])  # files it cannot write from now on: an I/O error mid-run
                else:
                    set_fsize(_limit(root, spec))
            for i in range(spec.get("writes", 8)):
                key = f"new{n:03d}-{i:03d}".encode()
                view.put(key, key * spec.get("value_repeat", 4))
            if n % 2 == 1:
                view.delete(f"new{n - 1:03d}-000".encode())
            tm.commit()
            out["committed"].append(n)
            print(f"committed {n}", flush=True)
        out["after"] = _hex(dict(view.range()))
        out["after_offsets"] = {str(tp): off for tp, off in task.offsets().items()}
    except Exception as e:
        # Close as a user would after the error; a second error must be one of ours too.
        try:
            tm.close(clean=False)
            tm.directory.close()
        except Exception as second:
            e.add_note(f"closing afterwards failed too: {type(second).__name__}: {second}")
            if not isinstance(second, StateStoreError):
                raise second from e
        raise
    tm.close()
    tm.directory.close()
    return {"ok": True, **out}


def act_restore(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """restore_store into the task's store (no task manager), then read it back."""
    path = store_dir(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    result = restore_store(
        path, root / "log", TP, mode=spec.get("mode", "auto"), end_offset=spec.get("end_offset")
    )
    with Store(path) as s:
        return {"ok": True, "mode": result.mode, "store": _hex(dict(s.range())), "offset": s.offset(TP)}


def act_read_store(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Open the store with Store (as processing does) and read everything in it."""
    with Store(store_dir(root)) as s:
        return {"ok": True, "store": _hex(dict(s.range())), "offset": s.offset(TP)}


def act_read_log(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Read the changelog read_committed from the start and fold it into a state."""
    log = SegmentLog(root / "log")
    state: dict[bytes, bytes] = {}
    start, end, lso = log.offsets(TP)
    for rec in log.read(TP):
        assert rec.key is not None
        if rec.value is None:
            state.pop(rec.key, None)
        else:
            state[rec.key] = rec.value
    return {"ok": True, "store": _hex(state), "offsets": [start, end, lso]}


def act_produce(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """A transactional producer with the generator's id appends and commits one transaction."""
    log = SegmentLog(root / "log", segment_bytes=16 * 1024, sync=False)
    try:
        producer = log.producer("generator")
        producer.begin()
        off = producer.send(TP.topic, TP.partition, b"produced", b"value")
        producer.commit()
    finally:
        log.close()
    return {"ok": True, "offset": off}


def act_directory(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Open and close the state directory (process lock, process metadata)."""
    d = StateDirectory(root / "state", "app")
    try:
        return {"ok": True, "process_id": str(d.process_id)}
    finally:
        d.close()


def act_consistency(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Read the store as it is on disk (no restore) and the changelog up to the offset it records.

    Data and offset must agree: the store holds exactly the committed
    changelog up to its offset (nothing if it records none).
    """
    path = store_dir(root)
    store: dict[bytes, bytes] = {}
    offset = None
    if (path / "CURRENT").exists():
        with Store(path) as s:
            store = dict(s.range())
            offset = s.offset(TP)
    log = SegmentLog(root / "log")
    expected: dict[bytes, bytes] = {}
    if offset is not None:
        for rec in log.read(TP):
            if rec.offset > offset:
                break
            assert rec.key is not None
            if rec.value is None:
                expected.pop(rec.key, None)
            else:
                expected[rec.key] = rec.value
    start, end, lso = log.offsets(TP)
    return {
        "ok": True,
        "store": _hex(store),
        "offset": offset,
        "log_upto_offset": _hex(expected),
        "log_offsets": [start, end, lso],
    }


def act_offset_sums(root: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """TaskManager.task_offset_sums() over the state directory, nothing started (what an assignor asks)."""
    tm = manager(root, spec["guarantee"], spec["offsets"])
    try:
        return {"ok": True, "sums": {str(t): s for t, s in tm.task_offset_sums().items()}}
    finally:
        tm.close()
        tm.directory.close()


ACTIONS = {
    "offset_sums": act_offset_sums,
    "consistency": act_consistency,
    "manager": act_manager,
    "restore": act_restore,
    "read_store": act_read_store,
    "read_log": act_read_log,
    "produce": act_produce,
    "directory": act_directory,
}


def main() -> None:
    spec = json.loads(sys.argv[1])
    root = Path(spec["root"])
    if spec.get("user"):
        drop_to(spec["user"])
    if spec.get("fsize") is not None and spec.get("limit_after_commits") is None:
        set_fsize(spec["fsize"])
    try:
        result = ACTIONS[spec["action"]](root, spec)
    except Exception as e:
        result = {
            "ok": False,
            "cls": type(e).__name__,
            "statestore": isinstance(e, StateStoreError),
            "msg": str(e),
            "path": getattr(e, "path", None),
            "trace": traceback.format_exc(),
        }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
