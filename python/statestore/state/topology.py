"""A Kafka Streams application's topology, read from the text ``Topology.describe()`` prints.

The text is what tells each store its subtopology, so its task directories
(``<subtopology>_<partition>``): a store after a ``groupBy`` lives in
subtopology 1 or later, under a name like
``KSTREAM-AGGREGATE-STATE-STORE-0000000004``. The format, as Kafka Streams
(3.x to 4.4) writes it::

    Topologies:
       Sub-topology: 0
        Source: KSTREAM-SOURCE-0000000000 (topics: [input])
          --> KSTREAM-AGGREGATE-0000000002
        Processor: KSTREAM-AGGREGATE-0000000002 (stores: [counts])
          --> none
          <-- KSTREAM-SOURCE-0000000000
        Sink: KSTREAM-SINK-0000000006 (topic: counts-repartition)
          <-- KSTREAM-FILTER-0000000007

      Sub-topology: 2 for global store (will not generate tasks)
        Source: KSTREAM-SOURCE-0000000011 (topics: [global-input])
          --> KTABLE-SOURCE-0000000012
        Processor: KTABLE-SOURCE-0000000012 (stores: [global])
          --> none
          <-- KSTREAM-SOURCE-0000000011

A global store has no tasks and no changelog of its own (its source topic is
its log), so it is listed apart and never restored. Anything else in the text
-- a line that is none of these, a node before its ``Sub-topology`` line, a
store in two subtopologies -- is a :class:`~statestore.errors.TopologyError`
naming the file and the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from statestore.errors import TopologyError

_HEADER = re.compile(r"Topologies:|Topology: .+:")
_SUBTOPOLOGY = re.compile(
    r"Sub-topology: (0|[1-9][0-9]{0,9})( for global store \(will not generate tasks\))?"
)
_PROCESSOR = re.compile(r"Processor: (\S+) \(stores: \[(.*)\]\)")
_SOURCE = re.compile(r"Source: (\S+) \((topics|topic pattern): .*\)")
_SINK = re.compile(r"Sink: (\S+) \((topic|extractor class): .*\)")
_EDGE = re.compile(r"(-->|<--) .+")
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class TopologyStore:
    """One store the topology names: its subtopology and the line of its first processor."""

    name: str
    subtopology: int
    line: int
    #: A global store: no tasks, no changelog of its own; never restored.
    is_global: bool = False


@dataclass(frozen=True)
class Topology:
    """The stores of a topology description, by name."""

    stores: dict[str, TopologyStore]
    #: The file the description came from (for messages), or None.
    source: Path | None = None

    @property
    def task_stores(self) -> dict[str, TopologyStore]:
        """The stores that live in task directories (every store but the global ones)."""
        return {n: s for n, s in self.stores.items() if not s.is_global}

    def where(self, store: str) -> str:
        """``"<file>:<line>"`` of the processor that first names ``store``."""
        return f"{self.source or '<topology>'}:{self.stores[store].line}"


def parse_topology(text: str, *, source: Path | None = None) -> Topology:
    """The stores of ``text``, the output of ``Topology.describe()``; ``TopologyError`` names the line."""

    def fail(lineno: int, what: str) -> TopologyError:
        return TopologyError(
            f"{source or '<topology>'}:{lineno}: {what}; expected the text Kafka Streams' "
            "Topology.describe() prints",
            path=source,
            line=lineno,
        )

    stores: dict[str, TopologyStore] = {}
    seen_header = False
    current: int | None = None
    is_global = False
    subtopologies: set[int] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if not seen_header:
            if not _HEADER.fullmatch(line):
                raise fail(lineno, f"no 'Topologies:' line before {line[:80]!r}")
            seen_header = True
            continue
        if m := _SUBTOPOLOGY.fullmatch(line):
            current, is_global = int(m.group(1)), m.group(2) is not None
            if current > _INT32_MAX or current in subtopologies:
                raise fail(lineno, f"sub-topology {current} named twice or out of range")
            subtopologies.add(current)
            continue
        if m := _PROCESSOR.fullmatch(line):
            if current is None:
                raise fail(lineno, f"processor {m.group(1)} before any 'Sub-topology:' line")
            names = [n.strip() for n in m.group(2).split(",")] if m.group(2).strip() else []
            for name in names:
                if not name or "/" in name or name in (".", ".."):
                    raise fail(lineno, f"store name {name!r} cannot name a directory")
                known = stores.get(name)
                if known is None:
                    stores[name] = TopologyStore(name, current, lineno, is_global)
                elif known.subtopology != current:
                    raise fail(
                        lineno,
                        f"store {name} is in sub-topology {current} here but in {known.subtopology} "
                        f"at line {known.line}",
                    )
            continue
        if _SOURCE.fullmatch(line) or _SINK.fullmatch(line) or _EDGE.fullmatch(line):
            if current is None:
                raise fail(lineno, f"{line.split(':')[0].split()[0]} before any 'Sub-topology:' line")
            continue
        raise fail(lineno, f"not a line of a topology description: {line[:120]!r}")
    if not seen_header:
        raise fail(1, "the file is empty")
    return Topology(stores, source)


def read_topology(path: str | Path) -> Topology:
    """The topology description in the file at ``path`` (see :func:`parse_topology`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"cannot read topology description {p}: {e}", path=p) from e
    return parse_topology(text, source=p)


__all__ = ["Topology", "TopologyStore", "parse_topology", "read_topology"]
