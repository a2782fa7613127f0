"""``scripts/kafka-broker.sh``: what it does with a broken jar cache and a stopped broker.

The jars are resolved through a temporary directory renamed into place only
when complete; a cache whose jar is truncated, or whose listing names a jar
that is gone, is resolved again instead of being half-used. Maven's own local
repository (``~/.m2``) makes the second resolution quick and offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from support import ROOT

SCRIPT = ROOT / "scripts" / "kafka-broker.sh"
CACHE = Path(os.environ.get("STATESTORE_CACHE", Path.home() / ".cache" / "statestore"))


def classpath(cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "classpath"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "STATESTORE_CACHE": str(cache)},
    )


@pytest.fixture
def cache_copy(tmp_path: Path, kafka_bootstrap: str) -> Path:
    """A copy of the resolved jar cache (the session's broker resolved it)."""
    libs = CACHE / "kafka-4.4.0" / "libs"
    assert (libs / ".complete").exists()
    shutil.copytree(libs, tmp_path / "kafka-4.4.0" / "libs")
    return tmp_path


@pytest.mark.parametrize("damage", ["truncated jar", "missing jar"])
def test_a_damaged_jar_cache_is_resolved_again(cache_copy: Path, damage: str) -> None:
    libs = cache_copy / "kafka-4.4.0" / "libs"
    victim = next(p for p in sorted(libs.glob("kafka-clients-*.jar")))
    if damage == "truncated jar":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        assert not zipfile.is_zipfile(victim)
    else:
        victim.unlink()
    out = classpath(cache_copy)
    assert out.returncode == 0, out.stderr
    assert "resolving kafka-broker jars" in out.stderr, "the damaged cache was used as it was"
    assert zipfile.is_zipfile(victim), f"{victim.name} was not restored"
    again = classpath(cache_copy)
    assert again.returncode == 0 and "resolving" not in again.stderr, (
        "a sound cache must not be resolved again"
    )


def test_stop_of_a_directory_without_a_broker_is_a_no_op(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", str(SCRIPT), "stop", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
