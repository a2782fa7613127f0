"""``statestore restore --kafka --topology``: the changelog topics' configs give each store its kind."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from statestore import _native
from support.model import store_contents

kafka = pytest.importorskip("statestore.changelog.kafka")

GROUPED = "KSTREAM-AGGREGATE-STATE-STORE-0000000004"
#: What Kafka Streams sets on each kind's changelog (the *ChangelogTopicConfig classes).
CONFIGS = {
    "counts": {},
    GROUPED: {},
    "latest": {"min.compaction.lag.ms": "86460000"},
    "tumbling": {"cleanup.policy": "compact,delete", "retention.ms": "86700000"},
    "sessions": {"cleanup.policy": "compact,delete", "retention.ms": "86700000"},
}
TOPOLOGY = """Topologies:
   Sub-topology: 0
    Source: KSTREAM-SOURCE-0000000000 (topics: [input])
      --> KSTREAM-AGGREGATE-0000000002, KSTREAM-PROCESSOR-0000000001, KSTREAM-AGGREGATE-0000000009
    Processor: KSTREAM-AGGREGATE-0000000002 (stores: [counts])
      --> none
      <-- KSTREAM-SOURCE-0000000000
    Processor: KSTREAM-AGGREGATE-0000000009 (stores: [tumbling, sessions])
      --> none
      <-- KSTREAM-SOURCE-0000000000
    Processor: KSTREAM-PROCESSOR-0000000001 (stores: [latest])
      --> none
      <-- KSTREAM-SOURCE-0000000000

  Sub-topology: 1
    Source: KSTREAM-SOURCE-0000000008 (topics: [KSTREAM-AGGREGATE-STATE-STORE-0000000004-repartition])
      --> KSTREAM-AGGREGATE-0000000005
    Processor: KSTREAM-AGGREGATE-0000000005 (stores: [KSTREAM-AGGREGATE-STATE-STORE-0000000004])
      --> none
      <-- KSTREAM-SOURCE-0000000008
"""


def test_kinds_come_from_the_changelog_configs(kafka_bootstrap: str, tmp_path: Path) -> None:
    app = f"topo{uuid.uuid4().hex[:8]}"
    with kafka.KafkaChangelog(kafka_bootstrap) as changelog:
        for store, config in CONFIGS.items():
            changelog.create_topics({f"{app}-{store}-changelog": 2}, config=config)
        producer = changelog.producer("topo")
        producer.begin()
        for store in ("counts", GROUPED):
            for i in range(30):
                producer.send(f"{app}-{store}-changelog", i % 2, b"k%d" % (i % 5), b"%d" % i)
        now = int(time.time() * 1000) // 60_000 * 60_000  # the topic's retention.ms deletes older records
        for i in range(10):  # window keys: key, window start, seqnum
            start = now - 60_000 * i
            key = b"k%d" % (i % 3) + struct.pack(">qi", start, 0)
            producer.send(f"{app}-tumbling-changelog", i % 2, key, b"%d" % i, timestamp=start)
        for i in range(12):  # a versioned store: raw key and value, the version's timestamp (out of order)
            producer.send(
                f"{app}-latest-changelog", i % 2, b"k%d" % (i % 3), b"%d" % i, timestamp=now - 1000 * (i % 4)
            )
        producer.commit()
        producer.close()
        configs = changelog.topic_configs([f"{app}-tumbling-changelog", f"{app}-missing-changelog"])
        assert set(configs) == {f"{app}-tumbling-changelog"}, "a missing topic is left out"
        assert configs[f"{app}-tumbling-changelog"]["cleanup.policy"] == "compact,delete"
    (tmp_path / "topology.txt").write_text(TOPOLOGY)
    state = tmp_path / "state"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "statestore.cli",
            "restore",
            "--kafka",
            kafka_bootstrap,
            "--state-dir",
            str(state),
            "--app-id",
            app,
            "--topology",
            str(tmp_path / "topology.txt"),
            "--store-format",
            "counts=timestamped",
            "--store-format",
            f"{GROUPED}=plain",
            "--store-format",
            "tumbling=timestamped-window",
            "--retention",
            "tumbling=600000",
            "--store-format",
            "sessions=session",
            "--retention",
            "sessions=86700001",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert out.returncode == 1, out.stdout + out.stderr  # a retention the topic contradicts
    assert "8 ok, 0 failed, 1 stores not restored" in out.stdout, out.stdout
    assert (
        f"not restored: store sessions (sub-topology 0): --retention sessions=86700001 contradicts its "
        f"changelog {app}-sessions-changelog: retention.ms=86700000" in out.stdout
    )
    # the versioned store, its history retention min.compaction.lag.ms - 1 day = 60 s: latest values
    # under the reserved segment -1 (FF x 8), older versions under their segment's id
    for p in (0, 1):
        rows = store_contents(state / app / f"0_{p}" / "rocksdb" / "latest").data
        latest = {k[8:] for k in rows if k[:8] == b"\xff" * 8}
        assert latest and any(k[:8] != b"\xff" * 8 for k in rows), rows
    for p in (0, 1):
        assert store_contents(state / app / f"1_{p}" / "rocksdb" / GROUPED).offsets == {
            f"{app}-{GROUPED}-changelog-{p}": 14
        }
        assert store_contents(state / app / f"0_{p}" / "rocksdb" / "counts").data
    for p in (0, 1):
        segments = sorted((state / app / f"0_{p}" / "tumbling").iterdir())
        assert segments and all(s.name.startswith("tumbling.") for s in segments), out.stdout
        assert sum(len(_native.store_dump(s).entries) for s in segments) == 5
    for store in ("sessions",):
        assert not any(state.glob(f"{app}/*/rocksdb/{store}")), "never opened for writing"
        assert not any(state.glob(f"{app}/*/{store}"))


def test_without_a_topology_the_changelogs_retention_ms_still_contradicts_a_retention(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """``--store-format`` and ``--retention`` alone, from Kafka: the topic's ``retention.ms`` is read all
    the same, and a retention larger than it is reported before anything is written."""
    app = f"nota{uuid.uuid4().hex[:8]}"
    with kafka.KafkaChangelog(kafka_bootstrap) as changelog:
        changelog.create_topics({f"{app}-sessions-changelog": 2}, config=CONFIGS["sessions"])
    state = tmp_path / "state"
    args = [sys.executable, "-m", "statestore.cli", "restore", "--kafka", kafka_bootstrap]
    args += [
        "--state-dir",
        str(state),
        "--app-id",
        app,
        "--store",
        "sessions",
        "--store-format",
        "sessions=session",
    ]

    def restore(retention: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*args, "--retention", f"sessions={retention}"],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "COLUMNS": "250"},
        )

    out = restore(86_700_001)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (
        f"not restored: store sessions (sub-topology 0): --retention sessions=86700001 contradicts its "
        f"changelog {app}-sessions-changelog: retention.ms=86700000" in out.stdout
    ), out.stdout
    assert not any(state.glob(f"{app}/*/sessions")), "never opened for writing"
    out = restore(300_000)  # within the topic's retention: restored (an empty changelog, no segment)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 ok, 0 failed, 0 stores not restored" in out.stdout, out.stdout
