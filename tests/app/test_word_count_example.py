"""``examples/word_count.py`` runs against the broker: every word's last count is its number of occurrences,
and every count of a word appears once, in order (exactly-once through its repartition topic), under the
classic group protocol and under KIP-848's."""

from __future__ import annotations

import importlib.util
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from app_tools import create_topics, produce, read_committed, unique

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "word_count.py"

TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "the dog barks",
    "a fox is quick and the dog is lazy",
    "exactly once means once",
]


def load_example():
    spec = importlib.util.spec_from_file_location("word_count_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_word_count_example(protocol: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    """Under both group protocols (KIP-848's ``consumer`` with the server-side range assignor too)."""
    wc = load_example()
    wc.LINES, wc.WORDS, wc.COUNTS = unique("lines"), unique("words"), unique("word-counts")
    create_topics(kafka_bootstrap, {wc.LINES: 3, wc.WORDS: 3, wc.COUNTS: 2})
    produce(kafka_bootstrap, wc.LINES, [(i % 3, None, line.encode()) for i, line in enumerate(TEXT)])
    want = Counter(w for line in TEXT for w in line.split())
    app = wc.word_count_app(
        kafka_bootstrap, str(tmp_path / "state"), unique("word-count"), group_protocol=protocol
    )
    t0 = time.monotonic()
    app.run(
        until=lambda: app.processed >= len(TEXT) + want.total() or time.monotonic() - t0 > 90,
        handle_signals=False,
    )
    got: dict[bytes, list[int]] = defaultdict(list)
    for m in read_committed(kafka_bootstrap, wc.COUNTS, 2):
        got[m.key()].append(int(m.value()))
    assert {k.decode(): v for k, v in got.items()} == {w: list(range(1, n + 1)) for w, n in want.items()}
