"""The state directory of one application: layout, process lock, task locks, cleaner.

Layout (identical to Kafka Streams, so tools and habits carry over)::

    <root>/<application_id>/
      .lock                            process lock (flock, and a lock of the kind Kafka Streams takes)
      kafka-streams-process-metadata   {"processId": "<uuid>"}
      <sub>_<part>/                    task directory
        .lock                          task lock (OS file lock; Kafka's pre-3.0 layout)
        .checkpoint                    offsets="checkpoint" mode only
        rocksdb/<store>/               one RocksDB per store

Why task locks are OS file locks *and* an owner-thread table: Kafka Streams keeps
task locks only in memory, which excludes threads of one JVM but not other
processes. statestore's restorations also run in separate Python worker
processes (PySpark), so a task lock is an ``flock`` on ``<task>/.lock`` (excludes
processes) plus an entry in a table of owner threads (excludes threads of this
process, which share the file lock).

Why lock tokens: a lock is *held* by a thread, but offsets may be written on the
holder's behalf by another thread (a restoration thread). Every writer of
offsets carries the :class:`TaskLock` token it got when it locked, and checks it
with :meth:`StateDirectory.ensure_held` right before writing. A token whose lock
was released, taken over, or whose directory was deleted fails with
``LockError`` -- so a stale writer can never re-create a directory the cleaner
deleted (KAFKA-8187; guarantee 4 of docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from statestore import _native
from statestore.errors import IllegalStateError, LockError, StateStoreError
from statestore.ids import TaskId
from statestore.state.checkpoint import CHECKPOINT_FILE_NAME

logger = logging.getLogger(__name__)

#: Name of the process lock file in the application directory, and of each task lock file.
LOCK_FILE_NAME = ".lock"
#: Name of the file that keeps this application's process id across restarts.
PROCESS_FILE_NAME = "kafka-streams-process-metadata"
#: Directory of the RocksDB stores inside a task directory.
STORES_DIR_NAME = "rocksdb"
#: Prefix of a task directory the cleaner renamed away and is deleting (never a task id).
_DOOMED_PREFIX = ".deleting-"
#: Kafka's default ``state.cleanup.delay.ms``.
DEFAULT_CLEANUP_DELAY_MS = 600_000


def parse_process_file(raw: bytes) -> uuid.UUID:
    """The process id in the bytes of a ``kafka-streams-process-metadata`` file.

    The file is JSON ``{"processId": "<uuid>"}``. Anything else -- not UTF-8,
    not JSON, nested too deep for the parser, no such key, not a UUID --
    raises ``ValueError`` (the caller then generates a new id), never another
    exception.
    """
    try:
        doc = json.loads(raw.decode("utf-8"))
    except RecursionError as e:  # "[[[[..." deeper than the interpreter's stack
        raise ValueError("process metadata is nested too deeply to be a process id file") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("processId"), str):
        raise ValueError('process metadata is not {"processId": "<uuid>"}')
    return uuid.UUID(doc["processId"])


def describe_lock_holder(raw: bytes) -> str:
    """Who holds the process lock, from the bytes of the lock file (``{"pid": .., "host": ..}``)."""
    try:
        info = json.loads(raw.decode("utf-8") or "null")
        if isinstance(info, dict) and "pid" in info and "host" in info:
            return f"process {str(info['pid'])[:64]} on host {str(info['host'])[:255]}"
    except (ValueError, RecursionError):
        pass
    return "another process (opened shared, or its id is unknown)"


def flock_holders(kind: str = "FLOCK") -> dict[tuple[int, int], int]:
    """``(device, inode) -> pid`` of every flock held on this machine (empty where /proc/locks is absent).

    ``kind="POSIX"`` gives the holders of POSIX record locks instead: Java's
    ``FileChannel.lock``, which Kafka Streams takes on ``<app>/.lock`` and
    which ``flock`` does not see.
    """
    holders: dict[tuple[int, int], int] = {}
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return holders
    for line in text.splitlines():
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
        if len(parts) < 6 or parts[1] != kind or parts[4] == "->":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            dev = os.makedev(int(major, 16), int(minor, 16))
            holders[(dev, int(inode))] = int(parts[4])
        except ValueError:
            continue
    return holders


def lock_holder(lock_file: Path, holders: dict[tuple[int, int], int] | None = None) -> int | None:
    """Pid of the process holding an flock on ``lock_file``, or None."""
    try:
        st = lock_file.stat()
    except OSError:
        return None
    table = flock_holders() if holders is None else holders
    return table.get((st.st_dev, st.st_ino))


def _posix_lock(fd: int, kind: int) -> None:
    """Lock (``F_RDLCK``, ``F_WRLCK``) or unlock (``F_UNLCK``) the whole file at ``fd`` without
    waiting, with a lock of the kind Java's ``FileChannel.lock`` takes (they conflict). An open file
    description lock where the system has them: it belongs to this descriptor and goes only with
    it, where a classic POSIX lock goes with any close of the file anywhere in the process (a
    second opener here that fails its flock would drop it). ``OSError`` (``EAGAIN``/``EACCES``)
    when another holds a conflicting one."""
    ofd = getattr(fcntl, "F_OFD_SETLK", None)
    if ofd is None or sys.platform != "linux":
        op = {fcntl.F_RDLCK: fcntl.LOCK_SH, fcntl.F_WRLCK: fcntl.LOCK_EX}.get(kind, fcntl.LOCK_UN)
        fcntl.lockf(fd, op | (fcntl.LOCK_NB if op != fcntl.LOCK_UN else 0))
        return
    # struct flock: l_type, l_whence (short); l_start, l_len (off_t); l_pid (0 for these locks)
    fcntl.fcntl(fd, ofd, struct.pack("hhqqi", kind, os.SEEK_SET, 0, 0, 0))


@dataclass(frozen=True)
class TaskLock:
    """Proof that a task lock was taken: the task and the generation of that acquisition.

    Each successful acquisition gets a new generation, so a token from an earlier
    acquisition (released, or lost to the cleaner) no longer validates even if the
    same thread locks the task again later.
    """

    task_id: TaskId
    generation: int


@dataclass(frozen=True)
class LockEvent:
    """One step of a task lock's life, reported to the ``audit`` hook of :class:`StateDirectory`.

    ``event`` is one of:

    * ``"locked"`` / ``"unlocking"`` -- a task lock of generation ``generation``
      was taken (``inode``: of the task directory now locked), or is about to
      be released (by unlock, release or close);
    * ``"clean-locked"`` / ``"clean-unlocking"`` -- the cleaner took, or is about
      to release, the lock of a directory it examines (``generation`` 0);
    * ``"deleting"`` -- the cleaner is about to delete the directory, under its lock.

    Every event is reported while the lock it speaks of is held, so an audit
    log written by the hook orders lock holders exactly as they held the lock.
    """

    event: str
    task_id: TaskId
    generation: int = 0
    inode: int = 0


#: The ``audit`` hook: called with every :class:`LockEvent`, under the directory's mutex.
AuditHook = Callable[[LockEvent], None]


@dataclass
class _Held:
    owner: threading.Thread
    fd: int
    inode: tuple[int, int]
    generation: int


def _inode(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


class StateDirectory:
    """All local state of one application under ``<root>/<application_id>/``.

    Opening takes the process lock on ``<app>/.lock`` (``LockError`` naming the
    holder if another process has it) and reads or creates the process id. With
    ``shared=True`` the process lock is taken shared: several worker processes
    (e.g. PySpark executors) may then use one application directory at once,
    coordinated by task locks alone, while an exclusive opener is still refused.

    ``cleanup_delay_ms`` is how long an unlocked task directory must stay
    unmodified before :meth:`clean_removed_tasks` deletes it.

    ``audit``, if given, is called with a :class:`LockEvent` for every task
    lock taken and released, and every directory the cleaner examines and
    deletes. It exists so race tests can prove that no lock ever
    had two holders; it must be quick and must not call back into this object.
    """

    def __init__(
        self,
        root: str | Path,
        application_id: str,
        *,
        cleanup_delay_ms: int = DEFAULT_CLEANUP_DELAY_MS,
        shared: bool = False,
        audit: AuditHook | None = None,
    ) -> None:
        if not application_id or "/" in application_id or application_id in (".", ".."):
            raise ValueError(f"application id {application_id!r} cannot name a directory")
        if cleanup_delay_ms < 0:
            raise ValueError(f"cleanup_delay_ms must be >= 0, got {cleanup_delay_ms}")
        self.root = Path(root)
        self.application_id = application_id
        self.app_dir = self.root / application_id
        self.cleanup_delay_ms = cleanup_delay_ms
        self.shared = shared
        self._audit = audit
        self._mutex = threading.RLock()
        self._held: dict[TaskId, _Held] = {}
        self._generation = 0
        self._closed = False
        if self.app_dir.exists() and not self.app_dir.is_dir():
            raise StateStoreError(
                f"state directory {self.app_dir} exists but is not a directory; "
                "move the file away or choose another state directory",
                path=self.app_dir,
            )
        try:
            self.app_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StateStoreError(
                f"cannot create state directory {self.app_dir}: {e}", path=self.app_dir
            ) from e
        with contextlib.suppress(OSError):  # as Kafka: rwxr-x---, best effort
            self.app_dir.chmod(0o750)
        self._process_fd = self._lock_process()
        try:
            self.process_id = self._load_process_id()
        except BaseException:
            self._release_process_lock()
            raise

    # -- process lock and id ------------------------------------------------------

    def _lock_process(self) -> int:
        path = self.app_dir / LOCK_FILE_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:  # e.g. permission denied: the lock file belongs to another user
            raise StateStoreError(
                f"cannot open the process lock file {path}: {e.strerror}; check the owner and permissions "
                "of the state directory",
                path=path,
            ) from e
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._describe_holder(fd)
            os.close(fd)
            raise LockError(
                f"state directory {self.app_dir} is in use by {holder}; only one process may use it "
                "(or several, all opened with shared=True). Stop the other process or give this one "
                "its own state directory",
                path=path,
            ) from None
        self._lock_out_kafka_streams(fd, path)
        if not self.shared:
            me = {"pid": os.getpid(), "host": socket.gethostname()}
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
            except OSError as e:  # e.g. the disk is full
                os.close(fd)
                raise StateStoreError(
                    f"cannot write the process lock file {path}: {e.strerror}; free space on the disk of the "
                    "state directory",
                    path=path,
                ) from e
        return fd

    def _lock_out_kafka_streams(self, fd: int, path: Path) -> None:
        """Take a POSIX-kind lock on the process lock file too (a read lock when opened shared).

        Kafka Streams locks the same file with Java's ``FileChannel.lock``, a POSIX lock, which an
        flock neither sees nor excludes: holding both keeps a Kafka Streams instance from starting
        on a state directory statestore uses, and statestore from using one Kafka Streams holds,
        with no window between a check and the work. Best effort where the file system has no
        such locks."""
        try:
            _posix_lock(fd, fcntl.F_RDLCK if self.shared else fcntl.F_WRLCK)
        except OSError as e:
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                logger.debug("no POSIX lock on %s (%s): Kafka Streams is not locked out", path, e)
                return
            holder = lock_holder(path, flock_holders("POSIX"))
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            who = f"process {holder}" if holder is not None else "another process"
            raise LockError(
                f"state directory {self.app_dir} is in use by {who}, which holds a POSIX lock on {path} "
                "(a Kafka Streams instance?): stop it, or give this one its own state directory",
                path=path,
            ) from None

    @staticmethod
    def _describe_holder(fd: int) -> str:
        try:
            raw = os.pread(fd, 4096, 0)
        except OSError:
            raw = b""
        return describe_lock_holder(raw)

    def _load_process_id(self) -> uuid.UUID:
        path = self.app_dir / PROCESS_FILE_NAME
        try:
            return parse_process_file(path.read_bytes())
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            logger.warning("process id file %s is unreadable (%s); generating a new process id", path, e)
        pid = uuid.uuid4()
        try:
            _native.atomic_write(str(path), json.dumps({"processId": str(pid)}).encode())
        except OSError as e:  # e.g. the disk is full, or the directory is not writable
            raise StateStoreError(
                f"cannot write the process id file {path}: {e}; free space on the disk of the state directory "
                "or fix its permissions",
                path=path,
            ) from e
        if self.shared:  # a concurrent shared opener may have won the race: use what is on disk
            with contextlib.suppress(OSError, ValueError):
                return parse_process_file(path.read_bytes())
        return pid

    def _release_process_lock(self) -> None:
        if self._process_fd >= 0:
            with contextlib.suppress(OSError):
                if not self.shared:
                    os.ftruncate(self._process_fd, 0)
                _posix_lock(self._process_fd, fcntl.F_UNLCK)  # first: the flock still excludes statestore
                fcntl.flock(self._process_fd, fcntl.LOCK_UN)
            os.close(self._process_fd)
            self._process_fd = -1

    def close(self) -> None:
        """Release every task lock this object holds, then the process lock. Idempotent."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            for task_id, held in self._held.items():
                self._report("unlocking", task_id, held.generation)
                self._release_os_lock(held.fd)
            self._held.clear()
            self._release_process_lock()

    def __enter__(self) -> StateDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StateDirectory({str(self.app_dir)!r})"

    # -- layout -------------------------------------------------------------------

    def task_dir(self, task_id: TaskId) -> Path:
        """Path of the task's directory (not created here: :meth:`lock` creates it)."""
        return self.app_dir / str(task_id)

    def stores_dir(self, task_id: TaskId) -> Path:
        """Path of ``<task dir>/rocksdb``, the parent of the task's stores."""
        return self.task_dir(task_id) / STORES_DIR_NAME

    def store_dir(self, task_id: TaskId, store: str) -> Path:
        """Path of one store: ``<task dir>/rocksdb/<store>``."""
        return self.stores_dir(task_id) / store

    def checkpoint_path(self, task_id: TaskId) -> Path:
        """Path of the task's ``.checkpoint`` file."""
        return self.task_dir(task_id) / CHECKPOINT_FILE_NAME

    def task_dirs(self) -> list[TaskId]:
        """Every task directory present, sorted; other entries are ignored."""
        out = []
        try:
            entries = list(os.scandir(self.app_dir))
        except FileNotFoundError:
            return []
        for entry in entries:
            try:
                tid = TaskId.parse(entry.name)
            except ValueError:
                continue
            if entry.is_dir(follow_symlinks=False):
                out.append(tid)
        return sorted(out)

    def is_empty(self, task_id: TaskId) -> bool:
        """Whether the task directory holds no state: only ``.checkpoint`` and ``*.lock`` count as nothing.

        A directory holding only a checkpoint is empty (Kafka's rule): offsets
        without data vouch for nothing. A missing directory is empty too.
        """
        try:
            names = os.listdir(self.task_dir(task_id))
        except (FileNotFoundError, NotADirectoryError):
            return True
        return all(n == CHECKPOINT_FILE_NAME or n.endswith(".lock") for n in names)

    def non_empty_task_dirs(self) -> list[TaskId]:
        """Task directories that hold state (see :meth:`is_empty`), sorted."""
        return [t for t in self.task_dirs() if not self.is_empty(t)]

    # -- task locks -----------------------------------------------------------------

    def _report(self, event: str, task_id: TaskId, generation: int = 0, inode: int = 0) -> None:
        if self._audit is not None:
            self._audit(LockEvent(event, task_id, generation, inode))

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError(f"{self!r} is closed; open a new StateDirectory")
        if not self.app_dir.is_dir():
            raise IllegalStateError(
                f"the state directory {self.app_dir} has been deleted; restart the application",
                path=self.app_dir,
            )

    def _take_os_lock(self, task_id: TaskId, *, create: bool) -> tuple[int, tuple[int, int]] | None:
        """flock ``<task>/.lock``; None if another process holds it (or, without create, the dir is gone)."""
        task_dir = self.task_dir(task_id)
        path = task_dir / LOCK_FILE_NAME
        for _ in range(10):
            if create:
                try:
                    # Not Path.mkdir(exist_ok=True): it raises FileExistsError when the directory
                    # is deleted (by another process's cleaner) between its mkdir and is_dir.
                    os.mkdir(task_dir)
                except FileExistsError:
                    pass  # if it vanished since, opening the lock file below finds out
                except FileNotFoundError as e:
                    raise IllegalStateError(
                        f"the state directory {self.app_dir} has been deleted; restart the application",
                        path=self.app_dir,
                        task_id=task_id,
                    ) from e
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:
                if not create:
                    return None
                continue  # the directory vanished between mkdir and open: try again
            except OSError as e:  # e.g. permission denied: not a lock held elsewhere, so never retried
                raise StateStoreError(
                    f"task {task_id}: cannot open the task lock file {path}: {e.strerror}; check the owner "
                    "and permissions of the state directory",
                    path=path,
                    task_id=task_id,
                ) from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            # The file we locked may have been deleted (with its directory) by the
            # holder we waited for; a lock on a dead inode excludes nobody.
            mine = _inode(os.fstat(fd))
            try:
                current = _inode(os.stat(path))
            except FileNotFoundError:
                current = None
            if current == mine:
                return fd, mine
            self._release_os_lock(fd)
            if not create:
                return None
        raise LockError(
            f"task {task_id}: could not lock {path}: its directory keeps being deleted and re-created; "
            "check for another cleaner working on this state directory",
            path=path,
            task_id=task_id,
        )

    @staticmethod
    def _release_os_lock(fd: int) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(fd)

    def acquire(self, task_id: TaskId) -> TaskLock | None:
        """Lock the task for the calling thread and return the token, or None if someone else holds it.

        Creates the task directory if needed. Re-entrant: the owner gets its
        current token back. Raises ``IllegalStateError`` if the application
        directory has been deleted.
        """
        me = threading.current_thread()
        with self._mutex:
            self._check_open()
            held = self._held.get(task_id)
            if held is not None:
                return TaskLock(task_id, held.generation) if held.owner is me else None
            got = self._take_os_lock(task_id, create=True)
            if got is None:
                return None
            self._generation += 1
            self._held[task_id] = _Held(me, got[0], got[1], self._generation)
            if self._audit is not None:
                ino = 0
                with contextlib.suppress(OSError):
                    ino = os.stat(self.task_dir(task_id)).st_ino
                self._report("locked", task_id, self._generation, ino)
            return TaskLock(task_id, self._generation)

    def lock(self, task_id: TaskId) -> bool:
        """Lock the task for the calling thread; False if another thread or process holds it.

        True if the caller already holds it (re-entrant, not counted: one
        :meth:`unlock` releases it, as in Kafka Streams).
        """
        return self.acquire(task_id) is not None

    def unlock(self, task_id: TaskId) -> None:
        """Release the task lock if the calling thread owns it; a call by anyone else is ignored."""
        with self._mutex:
            held = self._held.get(task_id)
            if held is None or held.owner is not threading.current_thread():
                if held is not None:
                    logger.debug(
                        "task %s: unlock by %s ignored (owner is %s)",
                        task_id,
                        threading.current_thread().name,
                        held.owner.name,
                    )
                return
            del self._held[task_id]
            self._report("unlocking", task_id, held.generation)
            self._release_os_lock(held.fd)

    def release(self, token: TaskLock) -> bool:
        """Release the lock ``token`` proves, whichever thread owns it; a stale token is ignored.

        For state managers whose lock is owned by a thread other than the one
        closing them. Returns whether a lock was released.
        """
        with self._mutex:
            held = self._held.get(token.task_id)
            if held is None or held.generation != token.generation:
                return False
            del self._held[token.task_id]
            self._report("unlocking", token.task_id, held.generation)
            self._release_os_lock(held.fd)
            return True

    def owner(self, task_id: TaskId) -> threading.Thread | None:
        """The thread of this process that holds the task lock, if any."""
        with self._mutex:
            held = self._held.get(task_id)
            return held.owner if held else None

    def transfer_lock(self, task_id: TaskId, new_owner: threading.Thread) -> None:
        """Hand a task lock held by the calling thread to ``new_owner`` (e.g. startup task -> stream thread).

        Tokens stay valid: the lock was never released. Raises ``LockError`` if
        the caller does not hold the lock.
        """
        with self._mutex:
            held = self._held.get(task_id)
            if held is None or held.owner is not threading.current_thread():
                raise LockError(
                    f"task {task_id}: cannot transfer a lock the calling thread does not hold",
                    path=self.task_dir(task_id),
                    task_id=task_id,
                )
            held.owner = new_owner

    def ensure_held(self, token: TaskLock | None, *, what: str = "write offsets") -> None:
        """Raise ``LockError`` unless ``token``'s lock is still held and its directory still exists.

        Called right before every write of offsets. It does not check the
        calling thread: a thread acting for the holder may write. It does
        check that this very acquisition is current, and that the lock file on
        disk is the one locked -- so a deleted or re-created task directory is
        detected, and nothing is written into it.
        """
        if token is None:
            raise LockError(
                f"refusing to {what}: the task lock was never acquired; lock the task first "
                "(offsets may only be read and written under the task lock)",
            )
        task_id = token.task_id
        path = self.task_dir(task_id) / LOCK_FILE_NAME
        with self._mutex:
            held = self._held.get(task_id)
            if self._closed or held is None or held.generation != token.generation:
                raise LockError(
                    f"task {task_id}: refusing to {what} in {self.task_dir(task_id)}: the task lock was "
                    "released or taken over since this state manager acquired it; close the task dirty "
                    "and let it be assigned again",
                    path=self.task_dir(task_id),
                    task_id=task_id,
                )
            try:
                current = _inode(os.stat(path))
            except FileNotFoundError:
                current = None
            if current != held.inode:
                raise LockError(
                    f"task {task_id}: refusing to {what}: task directory {self.task_dir(task_id)} was "
                    "deleted while locked (state directory cleaned by hand?); close the task dirty and "
                    "let it be assigned again -- it will be restored from its changelog",
                    path=self.task_dir(task_id),
                    task_id=task_id,
                )

    # -- cleaning -------------------------------------------------------------------

    def _delete_contents(self, task_dir: Path, *, keep_lock: bool) -> None:
        # The checkpoint vouches for what the stores hold, so it goes first, and its removal is on disk
        # before any store file goes: a wipe that fails halfway (an I/O error, a full disk) or is
        # killed never leaves a checkpoint over stores it no longer describes -- the next restore
        # would start from its offset into a store missing what came before it.
        entries = sorted(os.scandir(task_dir), key=lambda e: e.name != CHECKPOINT_FILE_NAME)
        for entry in entries:
            if keep_lock and entry.name == LOCK_FILE_NAME:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
                if entry.name == CHECKPOINT_FILE_NAME:
                    _native.fsync_dir(task_dir)

    def wipe(self, task_id: TaskId, token: TaskLock | None = None) -> None:
        """Delete the task's local state (stores, checkpoint) so it is rebuilt from the changelog.

        The caller must own the task lock, or pass the current ``token`` of it
        (``LockError`` otherwise), and must have closed the task's stores. The
        directory and its lock file stay, so the lock is still held afterwards.
        """
        with self._mutex:
            held = self._held.get(task_id)
            owns = held is not None and held.owner is threading.current_thread()
            if held is None or not (owns or token == TaskLock(task_id, held.generation)):
                raise LockError(
                    f"task {task_id}: refusing to wipe {self.task_dir(task_id)} without holding its lock; "
                    "lock the task first",
                    path=self.task_dir(task_id),
                    task_id=task_id,
                )
            self.ensure_held(TaskLock(task_id, held.generation), what="wipe the task")
            try:
                self._delete_contents(self.task_dir(task_id), keep_lock=True)
            except OSError as e:  # e.g. permission denied: part of the state is left on disk
                raise StateStoreError(
                    f"task {task_id}: cannot wipe {self.task_dir(task_id)}: {e.strerror} ({e.filename}); fix "
                    "the owner and permissions of the task directory and what is in it, then start again",
                    path=self.task_dir(task_id),
                    task_id=task_id,
                ) from e
            logger.info("task %s: wiped local state in %s", task_id, self.task_dir(task_id))

    def clean_removed_tasks(self, now_ms: int | None = None) -> list[TaskId]:
        """Delete unlocked task directories not modified for ``cleanup_delay_ms``; return the deleted ones.

        A directory locked by any thread of this process or by another process
        is never touched, nor is anything that is not a task directory. Each
        deleted directory goes whole, checkpoint included, while the cleaner
        holds its lock: it is first renamed to ``.deleting-<task>-<random>`` (one
        atomic step, so nobody can lock a half-deleted directory), then deleted;
        such leftovers of a crashed cleaner are deleted by the next call.
        ``now_ms`` defaults to the wall clock (tests pass it).
        """
        now = int(time.time() * 1000) if now_ms is None else now_ms
        removed = []
        self._delete_doomed()
        for task_id in self.task_dirs():
            with self._mutex:
                self._check_open()
                if task_id in self._held:
                    continue
                task_dir = self.task_dir(task_id)
                try:  # before locking: creating a missing lock file would touch the directory
                    modified_ms = int(os.stat(task_dir).st_mtime * 1000)
                except FileNotFoundError:
                    continue
                got = self._take_os_lock(task_id, create=False)
                if got is None:
                    continue
                fd = got[0]
                self._report("clean-locked", task_id)
                holds = True
                try:
                    if now - self.cleanup_delay_ms > modified_ms:
                        logger.info(
                            "task %s: deleting obsolete state directory %s (last modified %d ms ago)",
                            task_id,
                            task_dir,
                            now - modified_ms,
                        )
                        self._report("deleting", task_id)
                        # Renamed away first, in one step: deleting in place would unlink .lock
                        # midway, and another process could then lock a new .lock in the
                        # half-deleted directory while this cleaner is still deleting it.
                        doomed = self.app_dir / f"{_DOOMED_PREFIX}{task_id}-{uuid.uuid4().hex}"
                        # Once renamed, the task has no directory: its lock is free for the
                        # next owner, who creates a new one (the lock kept here is on the doomed
                        # copy). Reported before the rename, while nobody else can lock it.
                        self._report("clean-unlocking", task_id)
                        holds = False
                        os.rename(task_dir, doomed)
                        removed.append(task_id)
                        shutil.rmtree(doomed, ignore_errors=True)
                except OSError as e:
                    if e.errno != errno.ENOENT:
                        logger.warning("task %s: could not clean %s: %s", task_id, self.task_dir(task_id), e)
                finally:
                    if holds:
                        self._report("clean-unlocking", task_id)
                    self._release_os_lock(fd)
        return removed

    def _delete_doomed(self) -> None:
        """Finish deletions a crashed cleaner left behind (directories renamed away, not yet deleted)."""
        try:
            entries = list(os.scandir(self.app_dir))
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.name.startswith(_DOOMED_PREFIX) and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)

    def locked_tasks(self) -> list[TaskId]:
        """Tasks locked by some thread of this process (a snapshot)."""
        with self._mutex:
            return sorted(self._held)


__all__ = [
    "DEFAULT_CLEANUP_DELAY_MS",
    "LOCK_FILE_NAME",
    "PROCESS_FILE_NAME",
    "STORES_DIR_NAME",
    "AuditHook",
    "LockEvent",
    "StateDirectory",
    "TaskLock",
    "flock_holders",
    "lock_holder",
]
