"""statestore: local RocksDB state stores kept consistent with their changelogs.

What is public is what this module exports (``__all__``), plus three modules
for optional extras: :mod:`statestore.kafka` (``KafkaChangelog`` and friends),
:mod:`statestore.spark` (``restore_on_spark``) and
:mod:`statestore.metrics_prometheus`. Everything else is internal and lives in
packages named after what it is about, lowest layer first:

* :mod:`statestore.changelog` -- the changelog protocol, the segment log, Kafka;
* :mod:`statestore.state` -- state directory, stores, checkpoints, offsets policy;
* :mod:`statestore.restore` -- the restore engine, its planning and Spark;
* :mod:`statestore.ops` -- metrics, inspection, verification;
* :mod:`statestore.processing` -- tasks, the state updater, the task manager;
* :mod:`statestore.app` -- a stateful application on Kafka (consumer group, exactly-once);
* :mod:`statestore.cli` -- the ``statestore`` command.

``KafkaChangelog``, ``KafkaProducer``, ``ensure_changelog_topics`` and
``App`` (:mod:`statestore.app`) are imported on first use, so that importing
statestore does not load confluent-kafka (the optional ``kafka`` extra).
"""

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from statestore.changelog.protocol import Changelog, ChangelogProducer
from statestore.changelog.segment_log import LogReader, Producer, Record, SegmentLog
from statestore.errors import (
    ApplicationError,
    ChangelogUnavailableError,
    CheckpointError,
    ClusterError,
    CorruptLogError,
    IllegalStateError,
    LockError,
    LogError,
    ProcessingError,
    ProducerFencedError,
    RestoreError,
    StateStoreError,
    StoreCorruptedError,
    StoreError,
    TaskCorruptedError,
    TopologyError,
    TransactionInDoubtError,
    TransactionStateError,
    UnsupportedCompressionError,
)
from statestore.ids import OFFSET_UNKNOWN, TaskId, TopicPartition, changelog_topic
from statestore.ops.metrics import MetricsPublisher, MetricsSnapshot, RestoreMetrics, StoreMetrics
from statestore.processing.task import ActiveTask, StandbyTask, TaskState
from statestore.processing.task_manager import TaskManager
from statestore.processing.updater import (
    StandbyUpdateListener,
    StateRestoreListener,
    StateUpdater,
    SuspendReason,
)
from statestore.restore.engine import (
    OpenStores,
    RestoreListener,
    RestoreResult,
    RestoreSpec,
    SkippedRecords,
    restore_many,
    restore_store,
)
from statestore.state.checkpoint import OffsetCheckpoint
from statestore.state.lag import Lag, store_lag
from statestore.state.policy import Event, Guarantee, OffsetsMode, Policy
from statestore.state.store import InMemoryStore, Store

if TYPE_CHECKING:
    from statestore.app import App
    from statestore.kafka import KafkaChangelog, KafkaProducer, ensure_changelog_topics

__version__ = "0.1.0"

_KAFKA_NAMES = ("KafkaChangelog", "KafkaProducer", "ensure_changelog_topics")


#: Internals once exported here, and where they live now.
_MOVED = {
    "StateDirectory": "statestore.state.directory",
    "TaskLock": "statestore.state.directory",
    "StateManager": "statestore.state.state_manager",
}


def __getattr__(name: str) -> Any:
    """``statestore.KafkaChangelog`` and friends (and ``statestore.App``), imported from
    :mod:`statestore.kafka` (:mod:`statestore.app`) on first use;
    the internals in ``_MOVED`` with a deprecation warning naming their module."""
    if name in _KAFKA_NAMES:
        return getattr(importlib.import_module("statestore.kafka"), name)
    if name == "App":
        return importlib.import_module("statestore.app").App
    if name in _MOVED:
        module = _MOVED[name]
        warnings.warn(
            f"statestore.{name} is internal and no longer exported: import it from {module}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'statestore' has no attribute {name!r}")


__all__ = [
    "OFFSET_UNKNOWN",
    "ActiveTask",
    "App",
    "ApplicationError",
    "Changelog",
    "ChangelogProducer",
    "ChangelogUnavailableError",
    "CheckpointError",
    "ClusterError",
    "CorruptLogError",
    "Event",
    "Guarantee",
    "IllegalStateError",
    "InMemoryStore",
    "KafkaChangelog",
    "KafkaProducer",
    "Lag",
    "LockError",
    "LogError",
    "LogReader",
    "MetricsPublisher",
    "MetricsSnapshot",
    "OffsetCheckpoint",
    "OffsetsMode",
    "OpenStores",
    "Policy",
    "ProcessingError",
    "Producer",
    "ProducerFencedError",
    "Record",
    "RestoreError",
    "RestoreListener",
    "RestoreMetrics",
    "RestoreResult",
    "RestoreSpec",
    "SegmentLog",
    "SkippedRecords",
    "StandbyTask",
    "StandbyUpdateListener",
    "StateRestoreListener",
    "StateStoreError",
    "StateUpdater",
    "Store",
    "StoreCorruptedError",
    "StoreError",
    "StoreMetrics",
    "SuspendReason",
    "TaskCorruptedError",
    "TaskId",
    "TaskManager",
    "TaskState",
    "TopicPartition",
    "TopologyError",
    "TransactionInDoubtError",
    "TransactionStateError",
    "UnsupportedCompressionError",
    "changelog_topic",
    "ensure_changelog_topics",
    "restore_many",
    "restore_store",
    "store_lag",
]
