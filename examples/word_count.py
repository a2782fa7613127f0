"""Word count on statestore's application runner, exactly once: lines in, ``word -> count`` out.

    python examples/word_count.py BOOTSTRAP [--state-dir DIR] [--app-id ID]

Topics ``lines``, ``words`` and ``word-counts`` must exist, ``lines`` and
``words`` with the same partition count. A line is split into words sent to
``words`` keyed by the word (the repartition: every occurrence of a word goes
to one partition, so one task counts it); a word read back from ``words``
is counted in the store ``counts`` and its new count sent to
``word-counts``. Both steps commit in the task's transactions. Stop with
Ctrl-C or SIGTERM: a clean close (committed, stores closed, group left).
"""

from __future__ import annotations

import argparse

from statestore.app import App, Context, Record

LINES, WORDS, COUNTS = "lines", "words", "word-counts"


def word_count(record: Record, ctx: Context) -> None:
    if record.topic == LINES:  # split, and send each word to the partition its key chooses
        for word in (record.value or b"").decode().lower().split():
            ctx.send(word.encode(), b"1", topic=WORDS)
    else:  # a word, on the task that owns it: count it
        counts = ctx.store("counts")
        n = int(counts.get(record.key or b"") or 0) + 1
        counts.put(record.key or b"", b"%d" % n)
        ctx.send(record.key, b"%d" % n, topic=COUNTS)


def word_count_app(bootstrap: str, state_dir: str, application_id: str = "word-count", **kw: object) -> App:
    return App(
        application_id,
        bootstrap,
        input_topics=[LINES, WORDS],
        output_topics=[WORDS, COUNTS],
        stores={"counts": "plain"},
        process=word_count,
        state_dir=state_dir,
        guarantee="exactly_once_v2",
        **kw,
    )  # type: ignore[arg-type]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bootstrap")
    p.add_argument("--state-dir", default="/tmp/word-count-state")
    p.add_argument("--app-id", default="word-count")
    args = p.parse_args()
    word_count_app(args.bootstrap, args.state_dir, args.app_id).run()
