"""The counting application the ``app`` tests run (and SIGKILL) as a child process.

``counting_app.py <bootstrap> <application_id> <state_dir> <input> <output> [guarantee [commit_interval_ms [standbys]]]``

Per key it keeps a count and a running sum of the input values (store
``agg``, value ``b"<count>,<sum>"``) and sends ``key -> b"<count>,<sum>"`` to
the output topic, on the input record's partition. A record whose value is
``b"boom"`` makes the function raise. It prints ``running`` once the first
record was processed and exits on SIGTERM after a clean close.
"""

from __future__ import annotations

import logging
import sys

from statestore.app import App, Context, Record


def count(record: Record, ctx: Context) -> None:
    if record.value == b"boom":
        raise ValueError(f"cannot count {record.value!r}")
    agg = ctx.store("agg")
    assert record.key is not None and record.value is not None
    old = agg.get(record.key)
    n, total = (0, 0) if old is None else map(int, old.split(b","))
    new = b"%d,%d" % (n + 1, total + int(record.value))
    agg.put(record.key, new)
    ctx.send(record.key, new, partition=record.partition)


def main(argv: list[str]) -> None:
    bootstrap, app_id, state_dir, input_topic, output_topic = argv[:5]
    guarantee = argv[5] if len(argv) > 5 else "exactly_once_v2"
    commit_interval_ms = int(argv[6]) if len(argv) > 6 else None
    standbys = int(argv[7]) if len(argv) > 7 else 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = App(
        app_id,
        bootstrap,
        input_topics=[input_topic],
        output_topics=[output_topic],
        stores=["agg"],
        process=count,
        state_dir=state_dir,
        guarantee=guarantee,
        commit_interval_ms=commit_interval_ms,
        num_standby_replicas=standbys,
        consumer_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
    )
    app.run()


if __name__ == "__main__":
    main(sys.argv[1:])
