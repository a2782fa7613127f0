"""Kafka Streams 4.4's "no offset yet" (-4) as statestore meets it in a real state directory.

The application of ``interop/kafka-streams`` runs with a single input key,
so every record goes to one partition: the stores of the other task never
see a changelog record, and Kafka Streams records ``OFFSET_UNKNOWN`` (-4)
for them. ``inspect`` must show "no offset yet", ``verify`` must not call
them mismatched, and a restore into that directory must leave Kafka Streams
nothing to restore -- nor take that task for corrupted.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from statestore import OFFSET_UNKNOWN
from statestore._native import store_info
from support import kstreams_app
from support.cli import run_cli

kafka = pytest.importorskip("statestore.changelog.kafka")

PARTITIONS = 2


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=300)


def test_a_task_that_never_committed_a_changelog_record(
    app_built: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    app = f"ksn{uuid.uuid4().hex[:8]}"
    state = tmp_path / "state"
    common = {"keys": 1, "value_size": 20, "partitions": PARTITIONS, "guarantee": "exactly_once_v2"}
    run = kstreams_app.run_app(kafka_bootstrap, app, state, mode="process", produce=300, **common)  # type: ignore[arg-type]
    assert run.closed_clean
    recorded = {
        (task.name, store.name): store_info(store).offsets.get(
            f"{app}-{store.name}-changelog-{task.name[-1]}"
        )
        for task in sorted((state / app).glob("0_*"))
        for store in sorted((task / "rocksdb").iterdir())
    }
    idle = sorted(k for k, v in recorded.items() if v == OFFSET_UNKNOWN)
    assert len(idle) == 2 and idle[0][0] == idle[1][0], recorded  # both stores of the task without input

    args = ["--kafka", kafka_bootstrap, "--state-dir", str(state), "--app-id", app]
    stores = json.loads(cli("inspect", *args, "--json").stdout)["stores"]
    for s in stores:
        if (s["task_id"], s["store"]) in idle:
            assert s["store_offset"] is None and s["offset_note"] == "no offset yet" and s["lag"] == 0, s
        else:
            assert (
                isinstance(s["store_offset"], int) and s["store_offset"] >= 0 and s["offset_note"] is None
            ), s
    out = cli("verify", *args)
    assert out.returncode == 0, out.stdout + out.stderr
    # "no offset yet" in the offset column and as the verdict of each idle store
    assert out.stdout.count("no offset yet") == 4 and out.stdout.count("exact") == 2, out.stdout
    assert "claims offset -4" not in out.stderr

    # statestore restores into that directory and into an empty one: the stores of the task without a
    # changelog record get -4 again, so Kafka Streams neither restores anything nor takes the task for
    # corrupted (a store without any offset in a non-empty task directory, under exactly_once_v2)
    formats = ["--store-format", "latest=plain", "--store-format", "counts=timestamped"]
    for target in (state, tmp_path / "empty"):
        where = ["--kafka", kafka_bootstrap, "--state-dir", str(target), "--app-id", app]
        out = cli("restore", *where, *formats)
        assert out.returncode == 0, out.stdout + out.stderr
        for task, store in idle:
            assert store_info(target / app / task / "rocksdb" / store).offsets == {
                f"{app}-{store}-changelog-{task[-1]}": OFFSET_UNKNOWN
            }
        only = kstreams_app.run_app(kafka_bootstrap, app, target, mode="restore", **common)  # type: ignore[arg-type]
        assert only.restored_records == 0, only.restores
        assert "TaskCorruptedException" not in only.stderr, only.stderr[-3000:]
