"""Exactly-once against Apache Kafka with real crashes: a counting processor SIGKILLed and restarted.

``support/kafka_counting_child.py`` runs a TaskManager whose changelog is a
Kafka topic (transactional producer, restore from the broker), again and
again over one state directory, and every run is SIGKILLed -- by itself at a
random step (restore batches, both sides of the Kafka commit, store commits
and flushes, closes) or by this process at a random moment.

Checked after every kill, on disk: the store is exactly the broker's
committed view at the offset it records. Checked by every next child (it
exits with status 3 otherwise) and once more here: no committed update is
lost, and the restored store equals the committed changelog.

The broker is Apache Kafka 4.4, so the committed view excludes aborted
records: a store equal to it holds nothing of a killed transaction.
"""

from __future__ import annotations

import random
import sys
import uuid
from pathlib import Path

import pytest

from statestore import TaskId, TopicPartition
from statestore.processing.task_manager import TaskManager
from statestore.state.directory import StateDirectory
from support import SUPPORT
from support.kafka_counting_child import STORE, check, last_committed, model_from_broker
from support.killer import kill_counting_children
from support.model import store_contents

kafka = pytest.importorskip("statestore.changelog.kafka")


CHILD = SUPPORT / "kafka_counting_child.py"
TASK = TaskId(0, 0)


def _changelog(bootstrap: str) -> kafka.KafkaChangelog:
    return kafka.KafkaChangelog(bootstrap, request_timeout=20.0, restore_stall_timeout=20.0)


def check_store_on_disk(root: Path, app: str, changelog: kafka.KafkaChangelog) -> None:
    """What a kill left is exactly the broker's committed view at the offset the store records."""
    store_dir = root / "state" / app / str(TASK) / "rocksdb" / STORE
    if not (store_dir / "CURRENT").exists():
        return
    contents = store_contents(store_dir)
    data, offsets = contents.data, contents.offsets
    topic = f"{app}-{STORE}-changelog"
    offset = offsets.get(str(TopicPartition(topic, 0)))
    if offset is None:
        assert not data, f"store holds {len(data)} keys but records no offset"
        return
    assert data == model_from_broker(changelog, topic, offset), (
        f"store on disk is not the committed state at offset {offset}"
    )


def run_kills(root: Path, bootstrap: str, app: str, kills_wanted: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    with _changelog(bootstrap) as changelog:
        return kill_counting_children(
            rng,
            kills_wanted,
            lambda kill_at: [
                sys.executable,
                str(CHILD),
                str(root),
                bootstrap,
                app,
                str(rng.randrange(2**31)),
                str(kill_at),
                str(rng.choice([1, 7, 25])),
            ],
            lambda: check_store_on_disk(root, app, changelog),
            max_kill_at=80,
            startup=(0.2, 1.5),
            processing=(0, 0.3),
            timeout=30,
        )


def final_check(root: Path, bootstrap: str, app: str) -> dict[bytes, bytes]:
    """Restart in this process, restore from the broker, and check against the broker's committed view."""
    with _changelog(bootstrap) as changelog, StateDirectory(root / "state", app) as sd:
        tm = TaskManager(sd, changelog, [STORE], guarantee="exactly_once_v2")
        tm.start()
        tm.assign([TASK], [])
        assert tm.restore(timeout=60)
        store = dict(tm.active_task(TASK).store(STORE))
        problem = check(store, model_from_broker(changelog, f"{app}-{STORE}-changelog"), last_committed(root))
        assert problem is None, problem
        tm.close()
    return store


def _run(tmp_path: Path, bootstrap: str, kills: int, seed: int) -> None:
    app = f"crash{uuid.uuid4().hex[:8]}"
    with _changelog(bootstrap) as changelog:
        kafka.ensure_changelog_topics(changelog, app, [STORE], 1)
    stats = run_kills(tmp_path, bootstrap, app, kills, seed)
    assert stats["verified"] >= 1, f"no child got as far as verifying its restored store: {stats}"
    store = final_check(tmp_path, bootstrap, app)
    assert last_committed(tmp_path) > 0, "no child committed anything"
    assert int(store[b"__pos"]) >= last_committed(tmp_path)


def test_exactly_once_on_kafka_loses_no_committed_update_across_sigkills(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    _run(tmp_path, kafka_bootstrap, kills=6, seed=1)


@pytest.mark.torture
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_exactly_once_on_kafka_torture(tmp_path: Path, kafka_bootstrap: str, seed: int) -> None:
    _run(tmp_path, kafka_bootstrap, kills=40, seed=seed)
