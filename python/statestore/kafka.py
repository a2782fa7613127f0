"""Kafka as the changelog: restore from and log to a Kafka cluster (``pip install 'statestore[kafka]'``).

The public face of :mod:`statestore.changelog.kafka`, where the code and its
documentation live.
"""

from statestore.changelog.kafka import (
    DEFAULT_STALL_TIMEOUT,
    KafkaChangelog,
    KafkaProducer,
    ensure_changelog_topics,
)

__all__ = ["DEFAULT_STALL_TIMEOUT", "KafkaChangelog", "KafkaProducer", "ensure_changelog_topics"]
