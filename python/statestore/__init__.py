"""statestore: local RocksDB state stores kept consistent with their changelogs.

The public API is re-exported here; internals live in modules named after the
design's vocabulary (``checkpoint``, ``directory``, ``log``, ``restore`` ...).

``KafkaChangelog`` and ``ensure_changelog_topics`` (``statestore.kafka``, the
changelog on a Kafka cluster) are imported on first use, so that importing
statestore does not load confluent-kafka (the optional ``kafka`` extra).
"""

from typing import TYPE_CHECKING, Any

from statestore.changelog import Changelog, ChangelogProducer
from statestore.checkpoint import OffsetCheckpoint
from statestore.directory import StateDirectory, TaskLock
from statestore.errors import (
    CheckpointError,
    ClusterError,
    CorruptLogError,
    IllegalStateError,
    LockError,
    LogError,
    ProducerFencedError,
    RestoreError,
    StateStoreError,
    StoreCorruptedError,
    StoreError,
    TaskCorruptedError,
    TransactionStateError,
    UnsupportedCompressionError,
)
from statestore.ids import OFFSET_UNKNOWN, TaskId, TopicPartition, changelog_topic
from statestore.lag import Lag, store_lag
from statestore.log import LogReader, Producer, Record, SegmentLog
from statestore.metrics import MetricsPublisher, MetricsSnapshot, RestoreMetrics, StoreMetrics
from statestore.policy import Event, Guarantee, OffsetsMode, Policy
from statestore.restore import (
    RestoreListener,
    RestoreResult,
    RestoreSpec,
    SkippedRecords,
    restore_many,
    restore_store,
)
from statestore.state_manager import StateManager
from statestore.store import InMemoryStore, Store
from statestore.task import ActiveTask, StandbyTask, TaskState
from statestore.task_manager import TaskManager
from statestore.updater import StandbyUpdateListener, StateRestoreListener, StateUpdater, SuspendReason

if TYPE_CHECKING:
    from statestore.kafka import KafkaChangelog, KafkaProducer, ensure_changelog_topics

__version__ = "0.1.0"

_KAFKA_NAMES = ("KafkaChangelog", "KafkaProducer", "ensure_changelog_topics")


def __getattr__(name: str) -> Any:
    """``statestore.KafkaChangelog`` and friends, imported from ``statestore.kafka`` on first use."""
    if name in _KAFKA_NAMES:
        from statestore import kafka

        return getattr(kafka, name)
    raise AttributeError(f"module 'statestore' has no attribute {name!r}")


__all__ = [
    "OFFSET_UNKNOWN",
    "ActiveTask",
    "Changelog",
    "ChangelogProducer",
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
    "Policy",
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
    "StateDirectory",
    "StateManager",
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
    "TaskLock",
    "TaskManager",
    "TaskState",
    "TopicPartition",
    "TransactionStateError",
    "UnsupportedCompressionError",
    "changelog_topic",
    "ensure_changelog_topics",
    "restore_many",
    "restore_store",
    "store_lag",
]
