"""A stateful application on Kafka: a consumer group drives the task manager, exactly-once end to end.

:class:`App` runs a processing function over co-partitioned input topics.
Task ``0_p`` owns partition ``p`` of every input topic and the partition
``p`` of every store's changelog; the consumer group (classic protocol,
range assignor) decides which instance owns which task. Under
``exactly_once_v2`` each commit is one Kafka transaction holding the output
records, the changelog writes and the input positions; only after it
commits do the stores apply their staged writes. See docs/app.md.

Needs confluent-kafka (``pip install 'statestore[kafka]'``).
"""

from statestore.app.runner import App, Context, Record

__all__ = ["App", "Context", "Record"]
