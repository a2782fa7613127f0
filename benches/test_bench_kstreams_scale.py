"""statestore against Kafka Streams 4.4's restoration at 10x the records (issue 36, item 5): 20M over 8 partitions.

``test_bench_kstreams.py``'s rows on a changelog of 20M records over 8
partitions (2M keys, 100-byte values) instead of 2M over 4, measured the
same way (``statestore_vs_kafka_streams``, ``spark_vs_kafka_streams``), with
the goals that belong to this size: statestore replay ÷ Kafka Streams >= 5x
and bulk >= 15x at the same threads; bulk on Spark ``local[2]`` >= 10x Kafka
Streams with 2 stream threads. The 2M rows keep their own goals (3x, 10x).

Marked ``scale`` (the application processes 20M records and Kafka Streams
restores them six times: many minutes): left out of a full ``make bench``,
run by name, ``make bench BENCH=benches/test_bench_kstreams_scale.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from conftest import scaled
from kstreams_bench import Setup
from test_bench_kstreams import kstreams_setup, spark_vs_kafka_streams, statestore_vs_kafka_streams

pytestmark = pytest.mark.scale

N = scaled(20_000_000, minimum=20_000)
PARTITIONS = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with kstreams_setup(tmp_path_factory, N, PARTITIONS) as s:
        yield s


@pytest.mark.parametrize("mode,goal", [("replay", 5.0), ("bulk", 15.0)])
def test_statestore_vs_kafka_streams_restoration_at_20m(
    benchmark: Any, setup: Setup, mode: str, goal: float
) -> None:
    statestore_vs_kafka_streams(benchmark, setup, mode, goal)


@pytest.mark.spark
def test_spark_bulk_vs_kafka_streams_restoration_at_20m(benchmark: Any, setup: Setup) -> None:
    spark_vs_kafka_streams(benchmark, setup, "bulk", 10.0)
