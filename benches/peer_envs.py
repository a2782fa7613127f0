"""Where the peer frameworks the benchmarks compare with live: one virtual environment each.

Quix Streams pins an older confluent-kafka than statestore, so it runs in a
virtual environment of its own under ``~/.cache/statestore/peers/`` (or
``$STATESTORE_CACHE/peers``), made on first use; a benchmark that needs it
skips, saying why, when it cannot be installed here. Its applications
(``benches/peers/*.py``) talk to the benchmarks only through their command
line and JSON lines on stdout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.kafka_broker import Broker, BrokerUnavailable, start_broker

#: The Quix Streams release every benchmark compares with.
QUIX_VERSION = "3.28.1"
PEERS = Path(os.environ.get("STATESTORE_CACHE", Path.home() / ".cache" / "statestore")) / "peers"
PEER_APPS = Path(__file__).resolve().parent / "peers"


def quix_python() -> Path:
    """The interpreter of Quix Streams' own virtual environment, made on first use (skips if it cannot)."""
    venv = PEERS / f"quix-{QUIX_VERSION}"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        out = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.skip(f"quixstreams {QUIX_VERSION} does not install here: {out.stderr[-500:]}")
    return py


def broker_or_skip(tmp_path_factory: pytest.TempPathFactory, name: str) -> Broker:
    """A broker of the benchmark's own, or a skip saying why none could start."""
    try:
        return start_broker(tmp_path_factory.mktemp(name))
    except BrokerUnavailable as e:
        pytest.skip(f"no Kafka broker could start: {e}")
