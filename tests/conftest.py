"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator
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
