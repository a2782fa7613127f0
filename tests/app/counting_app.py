"""The counting application the ``app`` tests run (and SIGKILL) as a child process.

``counting_app.py <bootstrap> <application_id> <state_dir> <input> <output> [guarantee [commit_interval_ms [standbys [request_timeout_s [session_timeout_ms]]]]]``

Per key it keeps a count and a running sum of the input values (store
``agg``, value ``b"<count>,<sum>"``) and sends ``key -> b"<count>,<sum>"`` to
the output topic, on the input record's partition. A record whose value is
``b"boom"`` makes the function raise. It prints ``running`` once the first
record was processed and exits on SIGTERM after a clean close.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from statestore.app import App, Context, Record

#: ``<broker pid>:<n>:<seconds>``: SIGSTOP the broker as the application's n-th transaction commit is
#: asked for, and SIGCONT it after that many seconds (``test_app_stalled_broker.py``).
STALL_ENV = "COUNTING_APP_STALL_BROKER_AT_COMMIT"


class _StallingClient:
    """A confluent-kafka producer whose n-th ``commit_transaction`` (counted over every producer of
    the process) first stops the broker for a while: the stall meets the commit itself."""

    commits = 0

    def __init__(self, inner: Any, pid: int, at: int, seconds: float) -> None:
        self._inner, self._pid, self._at, self._seconds = inner, pid, at, seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit_transaction(self, *args: Any) -> Any:
        _StallingClient.commits += 1
        if _StallingClient.commits == self._at:
            print(f"stalling the broker for {self._seconds} s at commit {self._at}", flush=True)
            os.kill(self._pid, signal.SIGSTOP)
            threading.Timer(self._seconds, os.kill, (self._pid, signal.SIGCONT)).start()
        return self._inner.commit_transaction(*args)


def _stall_broker_at_commit(spec: str) -> None:
    import confluent_kafka

    pid, at, seconds = spec.split(":")
    real = confluent_kafka.Producer

    def producer(conf: dict[str, Any]) -> Any:
        return _StallingClient(real(conf), int(pid), int(at), float(seconds))

    confluent_kafka.Producer = producer  # type: ignore[misc]


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
    request_timeout = float(argv[8]) if len(argv) > 8 else 30.0
    session_timeout_ms = int(argv[9]) if len(argv) > 9 else 6000
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.environ.get(STALL_ENV):
        _stall_broker_at_commit(os.environ[STALL_ENV])
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
        consumer_config={"session.timeout.ms": session_timeout_ms, "heartbeat.interval.ms": 1000},
        request_timeout=request_timeout,
    )
    app.run()


if __name__ == "__main__":
    main(sys.argv[1:])
