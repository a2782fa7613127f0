"""The counting application on Quix Streams, for the application benchmarks (benches/test_bench_app.py).

Runs under Quix Streams' own virtual environment (see benches/peer_envs.py).
Per message key it keeps a count and a running sum of the input values in
its RocksDB state and sends ``key -> b"<count>,<sum>"`` to the output topic,
as ``tests/app/counting_app.py`` does on statestore. It runs until SIGTERM
(or SIGKILL) with the settings the benchmark gives both frameworks:
exactly-once, the commit interval, the session timeout and the transaction
timeout.

It prints one JSON line per event on stdout, each with ``t`` (``time.time()``):
``{"event": "revoked"|"lost"|"assigned", "partitions": [...]}`` when its
rebalance callbacks run (``Application._on_revoke``/``_on_lost``/
``_on_assign``), and ``{"event": "recovered"}`` when a recovery ends
(``RecoveryManager.do_recovery`` returning with no partition left
recovering, right after Quix logs "Recovery process complete!").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def event(name: str, **fields: object) -> None:
    print(json.dumps({"event": name, "t": time.time(), **fields}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--app-id", required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--commit-ms", type=int, default=100)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--transaction-ms", type=int, default=10_000)
    args = ap.parse_args()

    from quixstreams import Application
    from quixstreams.state.recovery import RecoveryManager

    def partitions(tps: list[Any]) -> list[int]:
        return sorted({tp.partition for tp in tps})

    on_assign, on_revoke, on_lost = Application._on_assign, Application._on_revoke, Application._on_lost
    do_recovery = RecoveryManager.do_recovery

    def assigned(self: Application, consumer: object, tps: list[Any]) -> None:
        if tps:
            event("assigned", partitions=partitions(tps))
        on_assign(self, consumer, tps)

    def revoked(self: Application, consumer: object, tps: list[Any]) -> None:
        event("revoked", partitions=partitions(tps))
        on_revoke(self, consumer, tps)

    def lost(self: Application, consumer: object, tps: list[Any]) -> None:
        event("lost", partitions=partitions(tps))
        on_lost(self, consumer, tps)

    def recovery(self: RecoveryManager) -> None:
        do_recovery(self)
        if not self.recovering:
            event("recovered")

    Application._on_assign = assigned  # type: ignore[method-assign]
    Application._on_revoke = revoked  # type: ignore[method-assign]
    Application._on_lost = lost  # type: ignore[method-assign]
    RecoveryManager.do_recovery = recovery  # type: ignore[method-assign]

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.app_id,
        state_dir=args.state_dir,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=args.commit_ms / 1000,
        consumer_extra_config={
            "session.timeout.ms": args.session_ms,
            "heartbeat.interval.ms": max(100, args.session_ms // 6),
        },
        producer_extra_config={"transaction.timeout.ms": args.transaction_ms},
        loglevel="WARNING",
    )
    source = app.topic(args.input, key_deserializer="bytes", value_deserializer="bytes")
    sink = app.topic(args.output, key_serializer="bytes", value_serializer="bytes")

    def count(value: bytes, state: Any) -> bytes:
        n, total = state.get("agg", (0, 0))
        n, total = n + 1, total + int(value)
        state.set("agg", (n, total))
        return b"%d,%d" % (n, total)

    sdf = app.dataframe(source)
    sdf = sdf.apply(count, stateful=True)
    sdf.to_topic(sink)
    event("started")
    app.run()


if __name__ == "__main__":
    sys.exit(main())
