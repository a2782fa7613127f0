"""Fixtures shared by the test modules.

Child processes the tests start (and SIGKILL) import ``support.<module>``
too: ``tests`` is put on their ``PYTHONPATH`` here, as pytest's
``pythonpath`` setting puts it on this process's import path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_TESTS = str(Path(__file__).resolve().parent)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession for the whole run: 2 cores, and a task may fail twice before the job does.

    ``local[2,3]`` is local[2] with task retries (plain ``local[N]`` never
    retries a failed task).
    """
    pytest.importorskip("pyspark")
    from statestore.restore.spark import spark_session

    session = spark_session("local[2,3]", "statestore-tests", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the tests of one server on one worker in a parallel run (``support.markers.xdist_group``).

    tryfirst: pytest-xdist reads the marks in its own hook; the folders' hooks (also tryfirst, and
    registered after this file) have given their marks by then."""
    from support.markers import xdist_group

    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Apache Kafka 4.4 broker (``scripts/kafka-broker.sh``) on 127.0.0.1 for the whole run.

    Skips with the reason when none can start; under ``CI=true`` that is a
    failure instead, so CI never passes without having run the Kafka suite.
    """
    pytest.importorskip("confluent_kafka")
    from support.kafka_broker import BrokerUnavailable, broker_or_skip_reason

    try:
        broker, reason = broker_or_skip_reason(tmp_path_factory.mktemp("kafka-broker"))
    except BrokerUnavailable as e:
        pytest.fail(f"CI=true and no Kafka broker could start: {e}")
    if broker is None:
        pytest.skip(f"no Kafka broker could start: {reason}")
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Any) -> str:
    """``host:port`` of the session's Kafka broker."""
    return str(kafka_broker.bootstrap)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``(master URL, directory)`` of a standalone Spark cluster (``scripts/spark-cluster.sh``): a master and
    two 1-core workers as separate JVMs on 127.0.0.1, for the whole run.

    Skips with the reason when it cannot start; under ``CI=true`` that is a failure instead.
    """
    import os
    import subprocess

    pytest.importorskip("pyspark")
    d = tmp_path_factory.mktemp("spark-cluster")
    script = Path(__file__).resolve().parents[1] / "scripts" / "spark-cluster.sh"
    out = subprocess.run(
        ["bash", str(script), "start", str(d)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    if out.returncode != 0:
        reason = f"no Spark cluster could start: {out.stderr[-2000:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    master = dict(kv.split("=", 1) for kv in out.stdout.split())["master"]
    yield master, d
    subprocess.run(["bash", str(script), "stop", str(d)], capture_output=True, timeout=120)


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Any]:
    """A broker of the test's own, to kill, stop (SIGSTOP) or restart without disturbing the
    session's; never left stopped, and stopped at the end."""
    import signal

    from support.kafka_broker import BrokerUnavailable, start_broker

    try:
        broker = start_broker(tmp_path / "broker")
    except BrokerUnavailable as e:
        pytest.fail(f"no Kafka broker could start: {e}")
    yield broker
    if broker.alive():
        os.kill(broker.pid, signal.SIGCONT)
    broker.stop()
