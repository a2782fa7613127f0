"""Property: read_committed over random interleavings equals a simple model of committed records.

Two transactional producers and one plain producer write to two partitions;
commits, aborts, flushes and crashes come in any order. A crash closes the
log, leaves a torn batch prefix at the end of a partition (what a kill in the
middle of an append leaves) and reopens everything: the new producers fence
the old ones, whose open transactions are aborted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statestore import SegmentLog, TopicPartition
from statestore._native import _testing

TOPIC = "prop"
TXN_IDS = ("A", "B")
SEGMENT_BYTES = 2048

ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 2), st.integers(0, 1), st.binary(max_size=300)),
        st.tuples(st.just("commit"), st.integers(0, 1)),
        st.tuples(st.just("abort"), st.integers(0, 1)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("crash"), st.integers(0, 1), st.integers(1, 200)),
    ),
    max_size=60,
)


class Model:
    """Offsets of committed records per partition, and the open transactions."""

    def __init__(self) -> None:
        self.committed: dict[int, dict[int, bytes]] = {0: {}, 1: {}}
        self.open: dict[int, list[tuple[int, int, bytes]]] = {
            0: [],
            1: [],
        }  # producer -> (partition, offset, value)

    def send(self, who: int, partition: int, offset: int, value: bytes) -> None:
        if who == 2:
            self.committed[partition][offset] = value
        else:
            self.open[who].append((partition, offset, value))

    def end(self, who: int, commit: bool) -> None:
        if commit:
            for partition, offset, value in self.open[who]:
                self.committed[partition][offset] = value
        self.open[who] = []

    def lso(self, partition: int) -> int | None:
        firsts = [o for who in (0, 1) for (p, o, _) in self.open[who] if p == partition]
        return min(firsts) if firsts else None


def torn_prefix(log_dir: Path, partition: int, cut: int) -> None:
    part_dir = log_dir / f"{TOPIC}-{partition}"
    segs = sorted(part_dir.glob("*.log"))
    if not segs:
        return
    batch = _testing.encode_batch(0, [(0, 0, b"k", b"v" * 300, [])])
    with open(segs[-1], "ab") as f:
        f.write(batch[: min(cut, len(batch) - 1)])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_read_committed_equals_model(script: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(tmp)
        log = SegmentLog(log_dir, segment_bytes=SEGMENT_BYTES, sync=False)
        producers = [log.producer(t) for t in TXN_IDS] + [log.producer()]
        model = Model()
        # A torn tail is left only by a writer that was appending: a partition
        # is torn at most once between two opens of its writer.
        written = {0: False, 1: False}
        for op in script:
            kind = op[0]
            if kind == "send":
                _, who, partition, value = op
                p = producers[who]
                if who < 2 and not p.in_transaction:
                    p.begin()
                offset = p.send(TOPIC, partition, b"k", value)
                written[partition] = True
                model.send(who, partition, offset, value)
            elif kind in ("commit", "abort"):
                who = op[1]
                p = producers[who]
                if p.in_transaction:
                    for part, _, _ in model.open[who]:
                        written[part] = True  # its writer appends the marker
                    p.commit() if kind == "commit" else p.abort()
                    model.end(who, kind == "commit")
            elif kind == "flush":
                log.flush()
            else:
                _, partition, cut = op
                log.close()
                if written[partition]:
                    torn_prefix(log_dir, partition, cut)
                # The new producers abort what was open: those partitions' writers reopen.
                written = {0: False, 1: False}
                for who in (0, 1):
                    for part, _, _ in model.open[who]:
                        written[part] = True
                    model.end(who, False)
                log = SegmentLog(log_dir, segment_bytes=SEGMENT_BYTES, sync=False)
                producers = [log.producer(t) for t in TXN_IDS] + [log.producer()]
        log.flush()
        for partition in (0, 1):
            tp = TopicPartition(TOPIC, partition)
            _, end, lso = log.offsets(tp)
            want_lso = model.lso(partition)
            assert lso == (end if want_lso is None else want_lso)
            expected = [v for o, v in sorted(model.committed[partition].items()) if o < lso]
            reader = log.reader(tp, 0)
            got = [r.value for r in reader]
            assert got == expected
            assert reader.position == lso
        log.close()
