"""A Quix Streams application with a RocksDB state store, for the peer benchmark (benches/test_bench_peers.py).

Runs under Quix Streams' own virtual environment (it pins confluent-kafka
below the version statestore uses), so it talks to the benchmark only
through its command line and one JSON line on stdout.

``produce``: write the input topic: ``--records`` messages of ``--value-bytes``
bytes over ``--partitions`` partitions and ``--keys`` keys, each key visited
``records / keys`` times.

``process``: consume the input from the start and keep, per message key, the
last value in state (``state.set``); exit once ``--records`` messages were
processed. Quix writes a key's state to its changelog once per checkpoint, so
``--commit-every`` (messages per checkpoint, far fewer than the keys) makes
nearly every message one changelog record.

``recover``: start on an empty ``--state-dir`` and measure Quix's recovery:
from the first partition assignment (``RecoveryManager.assign_partition``) to
the end of recovery (``RecoveryManager.do_recovery`` returning with no
partition left recovering, right after Quix logs "Recovery process complete!");
then exit. Prints ``{"assign_to_recovered_s": ..., "changelog_records": ...}``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time


def produce(args: argparse.Namespace) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(args.topic, args.partitions, 1)])[args.topic].result()
    p = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "compression.type": "none",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    rng = random.Random(1)
    order = [i % args.keys for i in range(args.records)]
    rng.shuffle(order)
    value = b"x" * args.value_bytes
    for i, k in enumerate(order):
        key = b"key-%08d" % k
        while True:
            try:
                p.produce(args.topic, value=value, key=key, partition=k % args.partitions)
                break
            except BufferError:
                p.poll(0.1)
        if i % 10_000 == 0:
            p.poll(0)
    p.flush()
    print(json.dumps({"produced": args.records}))


def application(args: argparse.Namespace, **kw: object) -> object:
    from quixstreams import Application

    return Application(
        broker_address=args.bootstrap,
        consumer_group=args.app_id,
        state_dir=args.state_dir,
        auto_offset_reset="earliest",
        loglevel="WARNING",
        **kw,
    )


def process(args: argparse.Namespace) -> None:
    app = application(args, commit_every=args.commit_every)
    topic = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")  # type: ignore[attr-defined]
    seen = 0

    def keep_last(value: bytes, state: object) -> None:
        nonlocal seen
        state.set("last", value.decode())  # type: ignore[attr-defined]
        seen += 1
        if seen >= args.records:
            app.stop()  # type: ignore[attr-defined]

    sdf = app.dataframe(topic)  # type: ignore[attr-defined]
    sdf.update(keep_last, stateful=True)
    t0 = time.perf_counter()
    app.run()  # type: ignore[attr-defined]
    print(json.dumps({"processed": seen, "seconds": time.perf_counter() - t0}))


def recover(args: argparse.Namespace) -> None:
    from quixstreams.state.recovery import RecoveryManager

    marks: dict[str, float] = {}
    applied = 0
    assign = RecoveryManager.assign_partition
    do_recovery = RecoveryManager.do_recovery
    recover_msg = None
    from quixstreams.state import recovery as recovery_module

    recover_msg = recovery_module.RecoveryPartition.recover_from_changelog_message

    def timed_assign(self: RecoveryManager, *a: object, **k: object) -> object:
        marks.setdefault("assigned", time.perf_counter())
        return assign(self, *a, **k)

    def counted(self: object, *a: object, **k: object) -> object:
        nonlocal applied
        applied += 1
        return recover_msg(self, *a, **k)  # type: ignore[arg-type]

    app = None

    def timed_recovery(self: RecoveryManager) -> None:
        do_recovery(self)
        if "assigned" in marks and not self.recovering and "recovered" not in marks:
            marks["recovered"] = time.perf_counter()
            app.stop()  # type: ignore[attr-defined]

    RecoveryManager.assign_partition = timed_assign  # type: ignore[method-assign]
    RecoveryManager.do_recovery = timed_recovery  # type: ignore[method-assign]
    recovery_module.RecoveryPartition.recover_from_changelog_message = counted  # type: ignore[method-assign]
    app = application(args)
    topic = app.topic(args.topic, key_deserializer="bytes", value_deserializer="bytes")  # type: ignore[attr-defined]
    sdf = app.dataframe(topic)  # type: ignore[attr-defined]
    sdf.update(lambda value, state: state.set("last", value.decode()), stateful=True)
    app.run()  # type: ignore[attr-defined]
    if "recovered" not in marks:
        sys.exit("quix: recovery did not complete")
    print(
        json.dumps(
            {"assign_to_recovered_s": marks["recovered"] - marks["assigned"], "changelog_records": applied}
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("command", choices=["produce", "process", "recover"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--app-id", default="quix-bench")
    ap.add_argument("--state-dir", default="state")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--commit-every", type=int, default=1000)
    args = ap.parse_args()
    {"produce": produce, "process": process, "recover": recover}[args.command](args)


if __name__ == "__main__":
    main()
