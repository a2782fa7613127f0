"""The changelog on a 3-node Apache Kafka 4.4 cluster, while nodes die, pause and restart: every test here is
marked ``kafka_cluster``.

The cluster (``scripts/kafka-cluster.sh``, through :mod:`support.kafka_cluster`) is started once for the session;
after each test every node runs again and every partition of the tests' topics is led by its preferred replica
with an ISR of at least two, so a test starts from a healthy, balanced cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from support.markers import mark_folder

pytest_collection_modifyitems = mark_folder(__file__, pytest.mark.kafka_cluster)


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One 3-node Kafka 4.4 cluster on 127.0.0.1 for the whole run (a :class:`support.kafka_cluster.Cluster`).

    Skips with the reason when none can start; under ``CI=true`` that is a failure instead, so CI never passes
    without having run the cluster tests.
    """
    pytest.importorskip("confluent_kafka")
    from support.kafka_cluster import ClusterUnavailable, cluster_or_skip_reason

    try:
        cluster, reason = cluster_or_skip_reason(tmp_path_factory.mktemp("kafka-cluster"))
    except ClusterUnavailable as e:
        pytest.fail(f"CI=true and no Kafka cluster could start: {e}")
    if cluster is None:
        pytest.skip(f"no Kafka cluster could start: {reason}")
    yield cluster
    cluster.stop()
