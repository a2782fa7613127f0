"""``statestore restore --kafka`` and ``inspect --kafka``, driven in a subprocess against a real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from statestore import SegmentLog, TopicPartition, restore_store
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "statestore.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_restore_and_inspect_from_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    app = f"cli{uuid.uuid4().hex[:8]}"
    seg = SegmentLog(tmp_path / "log", sync=False)
    with kafka.KafkaChangelog(kafka_bootstrap) as changelog:
        kafka.ensure_changelog_topics(changelog, app, ["counts"], 2)
        topic = f"{app}-counts-changelog"
        kp, sp = changelog.producer("cli"), seg.producer("cli")
        for txn in range(4):
            kp.begin()
            sp.begin()
            for i in range(300):
                p, k, v = i % 2, b"k%d" % (i % 97), b"%d-%d" % (txn, i)
                kp.send(topic, p, k, v)
                sp.send(topic, p, k, v)
            kp.commit()
            sp.commit()
        kp.close()
    state = tmp_path / "state"
    bootstrap = ["--kafka", kafka_bootstrap, "--kafka-config", "client.id=statestore-cli"]
    out = run("restore", *bootstrap, "--state-dir", str(state), "--app-id", app, "--threads", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 ok, 0 failed" in out.stdout
    for p in range(2):
        tp = TopicPartition(topic, p)
        expected = tmp_path / f"expected-{p}"
        restore_store(expected, seg, tp)
        diff = store_difference(expected, state / app / f"0_{p}" / "rocksdb" / "counts")
        assert diff is None, f"partition {p}: {diff}"

    out = run("inspect", *bootstrap, "--state-dir", str(state), "--app-id", app, "--json")
    assert out.returncode == 0, out.stderr
    stores = json.loads(out.stdout)["stores"]
    assert [(s["task_id"], s["log_end"], s["lag"], s["offset_lag"]) for s in stores] == [
        ("0_0", 604, 0, 1),
        ("0_1", 604, 0, 1),
    ], (
        "each partition: 4 x 150 records + 4 markers; the store holds every record and stops before the last marker"
    )

    out = run("restore", *bootstrap, "--state-dir", str(state), "--app-id", "no-such-app")
    assert out.returncode == 2 and "no changelog topic" in out.stderr
    out = run("restore", *bootstrap, "--log-dir", str(tmp_path), "--state-dir", str(state), "--app-id", app)
    assert out.returncode == 2 and "either --log-dir DIR or --kafka" in out.stderr
