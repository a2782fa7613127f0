"""A Faust (faust-streaming) application with a RocksDB table, for the peer benchmark (benches/test_bench_peers.py).

Run by its own virtual environment's ``faust -A faust_app worker``; the
broker and the data directory come from ``FAUST_BROKER`` and ``FAUST_DATADIR``.
Every input message sets ``table[key] = value`` (the last value per key);
Faust writes each table update to its changelog topic ``faust-bench-last-changelog``.
"""

import os

import faust

app = faust.App(
    "faust-bench",
    broker=f"kafka://{os.environ['FAUST_BROKER']}",
    store="rocksdb://",
    datadir=os.environ["FAUST_DATADIR"],
    topic_partitions=4,
    web_enabled=False,
    key_serializer="raw",
    value_serializer="raw",
)
topic = app.topic("faust-input", key_type=bytes, value_type=bytes, partitions=4)
table = app.Table("last", default=bytes, partitions=4, key_type=bytes, value_type=bytes)


@app.agent(topic)
async def keep_last(stream):  # type: ignore[no-untyped-def]
    async for key, value in stream.items():
        table[key] = value
