"""Kafka Streams 4.4, 4.2 and 3.9 start on versioned stores statestore restored, restore nothing, and answer
the same.

The application (``interop/kafka-streams``, ``stores="versioned"``,
``VersionedTopology.java``) puts every input record into a Processor API
versioned key-value store (``vtable``: history retention 30 s, Kafka's
default segment interval for it, 10 s) with the record's timestamp, and
turns the same input into a DSL versioned table (``toTable`` into ``vdsl``,
a store of the same kind); input
record ``seq`` has the timestamp ``first + seq * STEP``, every 5th 20 steps
late (out of order within the history retention), every 23rd 200 steps late
(older than the history retention: dropped), every 7th a tombstone. 3,000
records span 750 s: about 75 segments, most of them expired and dropped along
the way.

Run to completion under exactly_once_v2, then statestore restores the stores
from the changelog topics into an empty state directory (4.4: ``restore_many``,
asked for bulk; 3.9 and 4.2: ``statestore restore --kafka-streams-version``,
the ``.checkpoint`` layout): each RocksDB holds exactly Kafka Streams' own
rows, key for key and byte for byte (latest values and segment values), in
that version's layout (4.4: CLOSED; before: each task's ``.checkpoint`` equal
to Kafka Streams' own), and ``statestore verify --kafka`` finds both
directories exact. Kafka Streams started there
restores nothing (its StateRestoreListener says so), and its interactive
queries (``VersionedKeyQuery``: each key's latest version and its versions as
of 7 times) answer as they do on Kafka Streams' own state directory. Kafka
Streams' own restore of the changelog into an empty directory writes the same
rows too, and answers every query as the instance that processed the input.

An instance started on an existing versioned store (its own or statestore's)
answers history queries only from segments it created since it started
(Kafka Streams keeps the set of segments in memory only): the comparison of
answers after a restart is between two such instances.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from statestore import TopicPartition, _native
from statestore.restore.engine import RestoreSpec, restore_many
from support import kstreams_app
from support.cli import run_cli
from support.kstreams_checks import check_layout
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")

PARTITIONS = 2
KEYS = 40
STEP = 250  # ms between input records
RECORDS = 3000

#: The timestamp of input record 0: an hour ago, on a minute.
FIRST = (int(time.time() * 1000) // 60_000 - 60) * 60_000


def run(bootstrap: str, app: str, state: Path, version: str, **kw: Any) -> kstreams_app.AppRun:
    return kstreams_app.run_app(
        bootstrap,
        app,
        state,
        version,
        guarantee="exactly_once_v2",
        stores="versioned",
        keys=KEYS,
        partitions=PARTITIONS,
        time_step_ms=STEP,
        first_timestamp_ms=FIRST,
        config={"commit.interval.ms": "500"},
        **kw,
    )


def store_dir(state: Path, app: str, partition: int, name: str) -> Path:
    return state / app / f"0_{partition}" / "rocksdb" / name


@pytest.mark.parametrize("version", [kstreams_app.NEWEST, *kstreams_app.CHECKPOINT_LAYOUT_VERSIONS])
def test_kafka_streams_starts_on_a_versioned_store_statestore_restored(
    kafka_broker: Any, tmp_path: Path, version: str
) -> None:
    kstreams_app.built(version)
    legacy = kstreams_app.layout_of(version) == "checkpoint"
    stores = kstreams_app.VERSIONED_STORES
    bootstrap = str(kafka_broker.bootstrap)
    app = f"ksv{version.replace('.', '')}{uuid.uuid4().hex[:8]}"
    first = tmp_path / "first"
    ran = run(bootstrap, app, first, version, produce=RECORDS, print_results=True)
    assert ran.closed_clean
    assert ran.results.keys() == stores.keys()
    for name in stores:
        answers = ran.results[name]
        assert sum(v != "none" for k, v in answers.items() if not k.endswith("@latest")) > KEYS, (
            f"history answered by {name}"
        )
    # the DSL table and the Processor API store hold the same versions of the same input
    assert ran.results["vtable"] == ran.results["vdsl"]

    # statestore rebuilds the stores into an empty state directory, by replaying Kafka's put logic
    restored = tmp_path / "restored"
    if legacy:
        printed = kstreams_app.restore_with_cli(bootstrap, app, restored, stores, version)
        assert f"{len(stores) * PARTITIONS} ok, 0 failed" in printed, printed
    else:
        specs = []
        with kafka.KafkaChangelog(bootstrap) as changelog:
            for p in range(PARTITIONS):
                for name, (fmt, history) in stores.items():
                    path = store_dir(restored, app, p, name)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    tp = TopicPartition(f"{app}-{name}-changelog", p)
                    specs.append(
                        RestoreSpec(path, changelog, tp, format=fmt, retention_ms=history, mode="bulk")
                    )
            results = restore_many(specs, threads=2)
        assert all(r.ok for r in results), [r.error for r in results]
        assert all(r.records_applied > 0 and r.mode == "replay" for r in results), results

    # Kafka Streams' own rows, key for key and byte for byte, in that version's layout
    check_layout(first, restored, app, version)
    for p in range(PARTITIONS):
        for name in stores:
            theirs, ours = store_dir(first, app, p, name), store_dir(restored, app, p, name)
            assert store_difference(theirs, ours) is None
            if not legacy:
                assert _native.store_info(ours).status == _native.STATUS_CLOSED
            assert len(_native.store_dump(ours).entries) > KEYS // PARTITIONS, "latest values and history"

    # statestore verify --kafka tells the versioned store from its changelog's configs and rebuilds it
    for state in (first, restored):
        out = run_cli("verify", "--state-dir", str(state), "--app-id", app, "--kafka", bootstrap)
        assert out.returncode == 0, out.stdout + out.stderr
        n = len(stores) * PARTITIONS
        assert out.stdout.count("versioned") == n and out.stdout.count("exact") == n, out.stdout

    # statestore inspect --kafka shows it as versioned (its bytes alone read as a plain store's)
    out = run_cli("inspect", "--state-dir", str(first), "--app-id", app, "--kafka", bootstrap, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    reports = json.loads(out.stdout)["stores"]
    assert len(reports) == len(stores) * PARTITIONS and all(
        r["format"] == "versioned"
        and r["kind"] == "versioned"
        and r["problem"] is None
        and r["lag"] == 0
        and r["layout"] == kstreams_app.layout_of(version)
        for r in reports
    ), reports

    # Kafka Streams on it: nothing restored, and the same answers as on its own state directory
    on_ours = run(bootstrap, app, restored, version, print_results=True)
    assert on_ours.restored_records == 0, on_ours.restores
    assert all(r.start == r.end or r.restored == 0 for r in on_ours.restores.values()), on_ours.restores
    on_theirs = run(bootstrap, app, first, version, print_results=True)
    assert on_theirs.restored_records == 0, on_theirs.restores
    assert on_ours.results == on_theirs.results
    assert on_ours.stores == on_theirs.stores
    for name in stores:
        latest = {k: v for k, v in ran.results[name].items() if k.endswith("@latest")}
        assert {k: v for k, v in on_ours.results[name].items() if k.endswith("@latest")} == latest

    # Kafka Streams' own restore into an empty state directory writes the same rows, and answers every
    # query (the history too) as the instance that processed the input did
    own = run(bootstrap, app, tmp_path / "own-restore", version, print_results=True)
    assert own.restored_records == RECORDS * len(stores), own.restores
    for p in range(PARTITIONS):
        for name in stores:
            assert (
                store_difference(
                    store_dir(tmp_path / "own-restore", app, p, name), store_dir(restored, app, p, name)
                )
                is None
            )
    assert own.results == ran.results
