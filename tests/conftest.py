"""Fixtures shared by the test modules."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run: 2 cores, and a task may fail twice before the job does.

    ``local[2,3]`` is local[2] with task retries (plain ``local[N]`` never
    retries a failed task).
    """
    pytest.importorskip("pyspark")
    from statestore.spark import spark_session

    session = spark_session("local[2,3]", "statestore-tests", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a Kafka-protocol broker (tansu) started on 127.0.0.1 for the whole run.

    Skips the test with the reason when none can start (no confluent-kafka,
    no broker binary, or it does not come up).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent / "procs"))
    from kafka_broker import BrokerUnavailable, start_broker

    try:
        broker = start_broker()
    except BrokerUnavailable as e:
        pytest.skip(f"no Kafka-protocol broker could start: {e}")
    yield broker.bootstrap
    broker.stop()
