"""An Apache Kafka 4.4 broker for the tests and benchmarks, started by ``scripts/kafka-broker.sh``.

:func:`start_broker` starts a single-node KRaft broker in a directory of its
own on 127.0.0.1 and returns a :class:`Broker` (bootstrap address, log
directory, pid); :meth:`Broker.stop` stops it (SIGTERM, then SIGKILL),
:meth:`Broker.kill` SIGKILLs it, :meth:`Broker.restart` starts it again on
the same log directory and ports. It raises :class:`BrokerUnavailable` with
the script's output when no broker can start (no Java or Maven, the jars
cannot be resolved, the broker does not come up), so fixtures can skip --
or fail, under ``CI=true``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka-broker.sh"


class BrokerUnavailable(Exception):
    """No Kafka broker could start; the message says why."""


@dataclass
class Broker:
    """A broker started by ``scripts/kafka-broker.sh`` in ``dir``."""

    dir: Path
    bootstrap: str
    log_dir: Path
    pid: int

    def stop(self) -> None:
        """Stop it cleanly (SIGTERM; SIGKILL after the script's timeout)."""
        subprocess.run(
            ["bash", str(SCRIPT), "stop", str(self.dir)], check=False, capture_output=True, timeout=120
        )

    def kill(self) -> None:
        """SIGKILL it, as a crash would; its log directory stays as it was."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{self.pid}").exists():
            try:
                if Path(f"/proc/{self.pid}/stat").read_text().split()[2] == "Z":
                    break
            except OSError:
                break
            time.sleep(0.05)

    def restart(self) -> None:
        """Start it again on the same log directory and ports (after :meth:`stop` or :meth:`kill`)."""
        fresh = _run_start(self.dir, [])
        self.bootstrap, self.log_dir, self.pid = fresh.bootstrap, fresh.log_dir, fresh.pid

    def alive(self) -> bool:
        """Whether the broker process is running."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True


def _run_start(d: Path, properties: list[str]) -> Broker:
    try:
        out = subprocess.run(
            ["bash", str(SCRIPT), "start", str(d), *properties], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BrokerUnavailable(f"{SCRIPT} start {d}: {e}") from e
    if out.returncode != 0:
        raise BrokerUnavailable(f"{SCRIPT} start {d} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    line = out.stdout.strip().splitlines()[-1]
    fields = dict(kv.split("=", 1) for kv in line.split())
    try:
        return Broker(d, fields["bootstrap"], Path(fields["log_dir"]), int(fields["pid"]))
    except (KeyError, ValueError) as e:
        raise BrokerUnavailable(f"{SCRIPT} start printed {line!r}") from e


def start_broker(directory: Path | None = None, properties: list[str] | None = None) -> Broker:
    """Start a broker in ``directory`` (a fresh temporary one by default) with extra broker ``properties``."""
    d = Path(tempfile.mkdtemp(prefix="statestore-kafka-")) if directory is None else directory
    return _run_start(d, properties or [])


def broker_or_skip_reason(directory: Path | None = None) -> tuple[Broker | None, str | None]:
    """A started broker, or the reason none could start (raised again under ``CI=true``)."""
    try:
        return start_broker(directory), None
    except BrokerUnavailable as e:
        if os.environ.get("CI") == "true":
            raise
        return None, str(e)
