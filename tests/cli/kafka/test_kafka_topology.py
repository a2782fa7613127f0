"""``statestore restore --kafka --topology``: the changelog topics' configs give each store its kind."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

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
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert out.returncode == 1, out.stdout + out.stderr  # three stores of kinds statestore does not write
    assert "4 ok, 0 failed, 3 stores not restored" in out.stdout, out.stdout
    for store in ("tumbling", "sessions"):
        assert f"not restored: store {store} (sub-topology 0): it is a window or session store" in out.stdout
    assert "not restored: store latest (sub-topology 0): it is a versioned store" in out.stdout
    for p in (0, 1):
        assert store_contents(state / app / f"1_{p}" / "rocksdb" / GROUPED).offsets == {
            f"{app}-{GROUPED}-changelog-{p}": 14
        }
        assert store_contents(state / app / f"0_{p}" / "rocksdb" / "counts").data
    for store in ("tumbling", "sessions", "latest"):
        assert not any(state.glob(f"{app}/*/rocksdb/{store}")), "never opened for writing"
        assert not any(state.glob(f"{app}/*/{store}"))
