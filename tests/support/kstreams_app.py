"""Run the Kafka Streams application of ``interop/kafka-streams`` and read what it prints.

``scripts/kafka-streams-app.sh`` builds it once (Maven, cached outside the clone)
and runs it; every line it prints is an event (see ``StreamsApp.java``). The
input it produces is deterministic, so a test knows the exact results: record
``seq`` (counting from the first record ever produced to the input topic) has
key ``k%06d % (seq % keys)`` and value ``v<seq>-`` padded with ``x`` to
``value_size`` bytes.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from statestore import TopicPartition, _native
from statestore.restore.engine import RestoreSpec, restore_many
from support.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kafka-streams-app.sh"

#: The Kafka Streams the application is built against by default (its ``pom.xml``): the KIP-1035 layout.
NEWEST = "4.4.0"
#: Older Kafka Streams it is built against too (``KAFKA_STREAMS_VERSION``), which keep offsets in the
#: task's ``.checkpoint``: 3.9 (rocksdbjni 7.9, table ``format_version`` 5 at most) and 4.2, the newest
#: such. The script leaves out the sources using 4.3+ APIs (header-aware stores) for them.
CHECKPOINT_LAYOUT_VERSIONS = ("3.9.0", "4.2.0")


def layout_of(version: str) -> str:
    """The layout Kafka Streams ``version`` keeps its stores in: ``"kip-1035"`` (4.3+, offsets in each
    store) or ``"checkpoint"`` (offsets in the task's ``.checkpoint``)."""
    return "checkpoint" if version in CHECKPOINT_LAYOUT_VERSIONS else "kip-1035"


def version_flags(version: str) -> list[str]:
    """``--kafka-streams-version MAJOR.MINOR``: ``restore`` writes that version's layout."""
    return ["--kafka-streams-version", version.rsplit(".", 1)[0]]


#: Settings of every run: Kafka Streams does not leave its consumer group on close, so a run started
#: after another of the same application waits out the previous member's session (45 s by default)
#: before its tasks are assigned; the tests' runs follow one another, so their sessions are short (the
#: broker's minimum is 6 s).
QUICK_REJOIN = {"consumer.session.timeout.ms": "6000", "consumer.heartbeat.interval.ms": "1500"}

#: The stores of the application and their formats.
STORE_FORMATS = {"latest": "plain", "counts": "timestamped"}

#: A store of the application: its format and, for a window or session store, its retention (ms).
StoreSpec = tuple[str, int | None]

#: The stores of the application with ``stores="windowed"``: format and retention (ms).
WINDOWED_STORES: dict[str, StoreSpec] = {
    "wcounts": ("timestamped-window", 60_000),
    "scounts": ("session", 30_000),
}
#: Input timestamps of a windowed run march this many ms a record (a key every 37.5 s with 150 keys,
#: beyond the 30 s session gap), so windows and sessions close and expire as the input goes.
WINDOWED_STEP_MS = 250
#: A windowed run's settings: no record cache, so interactive queries read the segments alone, as
#: both runs a test compares keep them.
WINDOWED_CONFIG = {"commit.interval.ms": "500", "statestore.cache.max.bytes": "0"}


def windowed_first_timestamp() -> int:
    """The timestamp of a windowed run's input record 0: an hour ago, on a minute (the broker's
    retention deletes older records, of the input and of the changelogs, whose retention is the
    store's plus a day)."""
    return (int(time.time() * 1000) // 60_000 - 60) * 60_000


def store_flags(stores: Mapping[str, tuple[str, int | None]]) -> list[str]:
    """``--store-format NAME=FORMAT`` (and ``--retention NAME=MS`` where a retention is given: a window
    or session store) for each store of ``stores`` (name -> (format, retention)), as ``restore``,
    ``inspect`` and ``verify`` take them."""
    flags = []
    for name, (fmt, retention) in stores.items():
        flags += ["--store-format", f"{name}={fmt}"]
        if retention is not None:
            flags += ["--retention", f"{name}={retention}"]
    return flags


#: The stores of the application with ``stores="versioned"`` (``VersionedTopology.java``), a Processor API
#: store and a DSL table (``toTable``) over the same input: format and history retention (ms); their
#: segment interval is Kafka's default for it, 10 s.
VERSIONED_STORES: dict[str, StoreSpec] = {"vtable": ("versioned", 30_000), "vdsl": ("versioned", 30_000)}


def cannot_build(why: str) -> NoReturn:
    """A build of the application failed: a skip, but a failure under ``CI=true``, where Maven and a
    JDK 17 are installed, so that a proof never goes missing silently (e.g. the application no longer
    compiling against an older Kafka Streams)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {why}")
    pytest.skip(why)


#: The stores of the application with ``stores="headers"`` run under ``dsl.store.format=headers``
#: (Kafka Streams' header-aware stores): the count, the tumbling windowed count and the session
#: count (the DSL stores no headers in them), and the latest value of each key with its record's
#: headers in a store of each kind (Processor API).
HEADERS_STORES: dict[str, StoreSpec] = {
    "counts": ("timestamped-headers", None),
    "wcounts": ("timestamped-window-headers", 60_000),
    "scounts": ("session-headers", 30_000),
    "hlatest": ("timestamped-headers", None),
    "hwlatest": ("timestamped-window-headers", 60_000),
    "hslatest": ("session-headers", 30_000),
}


#: The stores of the application with ``stores="emit-final"``: the tumbling and the sliding
#: windowed count and the session count with ``emitStrategy(onWindowClose())``; and the same under
#: ``dsl.store.format=headers``.
EMIT_FINAL_STORES: dict[str, StoreSpec] = {
    "wcounts": ("emit-final-window", 60_000),
    "swcounts": ("emit-final-sliding-window", 120_000),
    "scounts": ("emit-final-session", 30_000),
}
EMIT_FINAL_HEADERS_STORES: dict[str, StoreSpec] = {
    "wcounts": ("emit-final-window-headers", 60_000),
    "swcounts": ("emit-final-window-headers", 120_000),
    "scounts": ("emit-final-session-headers", 30_000),
}


def store_path(state_dir: Path, app: str, partition: int, name: str, fmt: str) -> Path:
    """Where store ``name`` of task ``0_<partition>`` lives: ``rocksdb/<name>``, or a window or
    session store's directory of segments, ``<name>``."""
    task = state_dir / app / f"0_{partition}"
    return task / name if fmt in _native.SEGMENTED_STORE_FORMATS else task / "rocksdb" / name


def segments(store: Path) -> list[str]:
    """The segment directories of a window or session store (none when it does not exist)."""
    return sorted(p.name for p in store.iterdir()) if store.is_dir() else []


def restore_with_threads(
    bootstrap: str, app: str, restored: Path, stores: Mapping[str, StoreSpec], partitions: int
) -> None:
    """Restore ``stores`` of every task into ``restored`` with ``restore_many`` from the changelog
    topics, two threads; every store gets records."""
    from statestore.changelog import kafka

    specs = []
    with kafka.KafkaChangelog(bootstrap) as changelog:
        for p in range(partitions):
            (restored / app / f"0_{p}").mkdir(parents=True)
            for name, (fmt, retention) in stores.items():
                tp = TopicPartition(f"{app}-{name}-changelog", p)
                path = store_path(restored, app, p, name, fmt)
                path.parent.mkdir(exist_ok=True)
                specs.append(RestoreSpec(path, changelog, tp, format=fmt, retention_ms=retention))
        results = restore_many(specs, threads=2)
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.records_applied > 0 for r in results), results


def restore_with_spark(
    spark: Any, log_dir: Path, app: str, restored: Path, stores: Mapping[str, StoreSpec], partitions: int
) -> None:
    """``restore_on_spark`` of ``stores`` from the broker's own partition directories (the segment
    log reads Kafka's log.dirs)."""
    from statestore.restore.spark import restore_on_spark

    rows = restore_on_spark(
        spark,
        log_dir=log_dir,
        state_dir=restored,
        application_id=app,
        stores=list(stores),
        formats={name: fmt for name, (fmt, _) in stores.items()},
        retentions={name: ms for name, (_, ms) in stores.items() if ms is not None},
    ).collect()
    assert [r.status for r in rows] == ["ok"] * (len(stores) * partitions), rows
    assert all(r.records_applied > 0 for r in rows), rows


def windowed_runner(
    stores: str, keys: int, partitions: int, first_timestamp_ms: int, config: Mapping[str, str] | None = None
) -> Callable[..., AppRun]:
    """``run(bootstrap, app, state, **kw)``: a run under exactly_once_v2 of topology ``stores`` whose
    input timestamps march (``WINDOWED_STEP_MS`` a record from ``first_timestamp_ms``) with the
    windowed runs' settings (``WINDOWED_CONFIG``, plus ``config``)."""

    def run(bootstrap: str, app: str, state: Path, **kw: Any) -> AppRun:
        return run_app(
            bootstrap,
            app,
            state,
            guarantee="exactly_once_v2",
            stores=stores,
            keys=keys,
            value_size=20,
            partitions=partitions,
            time_step_ms=WINDOWED_STEP_MS,
            first_timestamp_ms=first_timestamp_ms,
            config={**WINDOWED_CONFIG, **(config or {})},
            **kw,
        )

    return run


def restore_with_cli(
    bootstrap: str, app: str, restored: Path, stores: Mapping[str, StoreSpec], version: str, *more: str
) -> str:
    """``statestore restore`` of ``stores`` of every task from the changelog topics into ``restored``, in
    the layout of Kafka Streams ``version`` (``more``: further flags); what it printed."""
    out = run_cli(
        "restore",
        "--kafka",
        bootstrap,
        "--state-dir",
        str(restored),
        "--app-id",
        app,
        *[a for name in stores for a in ("--store", name)],
        *version_flags(version),
        *store_flags(stores),
        *more,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def check_more_input(
    run: Callable[..., AppRun], app: str, restored: Path, ref_dir: Path, produced: int, more: int = 1000
) -> AppRun:
    """Kafka Streams on ``restored`` (a state directory statestore pre-warmed): ``more`` new input
    records restore nothing, and its results (``print_results``) equal those of a reference
    application that processed all ``produced + more`` records from scratch over the same input.
    ``run(app, state, **kw)`` runs the test's application; the reference run is returned for the
    test's own checks of what it holds."""
    after = run(app, restored, produce=more, print_results=True)
    assert after.restored_records == 0, after.restores
    ref = run(f"{app}ref", ref_dir, input_topic=f"{app}-input", expect=produced + more, print_results=True)
    assert after.results == ref.results
    assert after.stores == ref.stores
    return ref


def _env(version: str) -> dict[str, str]:
    return {**os.environ, "KAFKA_STREAMS_VERSION": version}


def build(version: str = NEWEST) -> Path:
    """Build the application against Kafka Streams ``version`` if needed; the directory holding
    ``app.jar`` and ``libs/``."""
    out = subprocess.run(
        ["bash", str(SCRIPT), "build"],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
        env=_env(version),
    )
    if out.returncode != 0:
        raise RuntimeError(f"building the Kafka Streams application against {version} failed:\n{out.stderr}")
    return Path(out.stdout.strip().splitlines()[-1])


def built(version: str = NEWEST) -> Path:
    """:func:`build`, a skip when Maven or a JDK 17 is missing (a failure under ``CI=true``)."""
    try:
        return build(version)
    except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired) as e:
        cannot_build(f"the Kafka Streams application could not be built (Maven, JDK 17): {e}")


@dataclass
class Restore:
    """One changelog partition's restoration as the application's StateRestoreListener saw it."""

    topic: str
    partition: int
    store: str
    start: int
    end: int
    restored: int | None = None
    start_nanos: int = 0
    end_nanos: int | None = None


@dataclass
class AppRun:
    """What one run printed."""

    returncode: int
    lines: list[str]
    stderr: str = ""
    restores: dict[tuple[str, int], Restore] = field(default_factory=dict)
    summary: dict[str, str] = field(default_factory=dict)
    stores: dict[str, dict[str, str]] = field(default_factory=dict)
    results: dict[str, dict[str, str]] = field(default_factory=dict)
    closed_clean: bool | None = None

    @property
    def restored_records(self) -> int:
        """Records Kafka Streams restored, over every changelog partition."""
        return sum(r.restored or 0 for r in self.restores.values())

    @property
    def restore_ms(self) -> float:
        """From the first onRestoreStart to the last onRestoreEnd, ms (Kafka Streams' own restoration)."""
        return float(self.summary.get("ms", "0"))

    @property
    def restore_cpu_ms(self) -> float:
        """CPU time of the whole JVM over that window, ms (every thread: restoration, RocksDB, clients, GC, JIT)."""
        return float(self.summary.get("cpu_ms", "0"))


def parse(lines: list[str], returncode: int = 0, stderr: str = "") -> AppRun:
    """The events of a run's output."""
    run = AppRun(returncode, lines, stderr)
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        kind = parts[0]
        if kind == "RESTORE_START":
            topic, p, store, start, end, nanos = parts[1:7]
            run.restores[(topic, int(p))] = Restore(
                topic, int(p), store, int(start), int(end), None, int(nanos)
            )
        elif kind == "RESTORE_END":
            topic, p, store, restored, nanos = parts[1:6]
            r = run.restores[(topic, int(p))]
            r.restored, r.end_nanos = int(restored), int(nanos)
        elif kind == "RESTORE_SUMMARY":
            run.summary = dict(kv.split("=", 1) for kv in parts[1:])
        elif kind == "STORE":
            run.stores[parts[1]] = dict(kv.split("=", 1) for kv in parts[2:])
        elif kind == "RESULT":
            run.results.setdefault(parts[1], {})[parts[2]] = parts[3]
        elif kind == "CLOSED":
            run.closed_clean = parts[1] == "clean=true"
    return run


def command(
    bootstrap: str,
    app_id: str,
    state_dir: Path,
    *,
    guarantee: str = "at_least_once",
    mode: str = "process",
    produce: int = 0,
    keys: int = 100,
    value_size: int = 100,
    partitions: int = 2,
    threads: int = 1,
    print_results: bool = False,
    config: dict[str, str] | None = None,
    timeout: int = 600,
    stores: str = "both",
    time_step_ms: int = 0,
    first_timestamp_ms: int | None = None,
    input_topic: str | None = None,
    expect: int | None = None,
    retention_ms: int | None = None,
) -> list[str]:
    """The command line of one run."""
    cmd = [
        "bash",
        str(SCRIPT),
        "run",
        "--bootstrap",
        bootstrap,
        "--application-id",
        app_id,
        "--state-dir",
        str(state_dir),
        "--guarantee",
        guarantee,
        "--mode",
        mode,
        "--produce",
        str(produce),
        "--keys",
        str(keys),
        "--value-size",
        str(value_size),
        "--partitions",
        str(partitions),
        "--threads",
        str(threads),
        "--timeout",
        str(timeout),
        "--stores",
        stores,
    ]
    if print_results:
        cmd.append("--print-results")
    if time_step_ms:
        cmd += ["--time-step-ms", str(time_step_ms)]
    if first_timestamp_ms is not None:
        cmd += ["--first-timestamp-ms", str(first_timestamp_ms)]
    if input_topic is not None:
        cmd += ["--input-topic", input_topic]
    if expect is not None:
        cmd += ["--expect", str(expect)]
    if retention_ms is not None:
        cmd += ["--retention-ms", str(retention_ms)]
    for k, v in {**QUICK_REJOIN, **(config or {})}.items():
        cmd += ["--config", f"{k}={v}"]
    return cmd


def run_app(bootstrap: str, app_id: str, state_dir: Path, version: str = NEWEST, **kw: object) -> AppRun:
    """Run the application (built against Kafka Streams ``version``) to its end and parse what it
    printed; a failed run raises with its output."""
    timeout = int(kw.get("timeout", 600))  # type: ignore[call-overload]
    cmd = command(bootstrap, app_id, state_dir, **kw)  # type: ignore[arg-type]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=timeout + 120, env=_env(version)
    )
    run = parse(out.stdout.splitlines(), out.returncode, out.stderr)
    if out.returncode != 0:
        raise RuntimeError(
            f"the Kafka Streams application exited with {out.returncode}:\n{out.stdout}\n{out.stderr[-4000:]}"
        )
    return run


def described_topology(run: AppRun) -> str:
    """What ``Topology.describe()`` printed (the application prints it to stderr before it starts)."""
    lines = run.stderr.splitlines()
    start = lines.index("Topologies:")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def value_of(seq: int, value_size: int) -> str:
    """The input value of record ``seq``."""
    v = f"v{seq}-"
    return v + "x" * max(0, value_size - len(v))


def expected(total: int, keys: int, value_size: int) -> tuple[dict[str, str], dict[str, int]]:
    """``(latest value per key, count per key)`` after records ``0 .. total-1``."""
    latest: dict[str, str] = {}
    counts: Counter[str] = Counter()
    for seq in range(total):
        k = f"k{seq % keys:06d}"
        latest[k] = value_of(seq, value_size)
        counts[k] += 1
    return latest, dict(counts)


__all__ = [
    "CHECKPOINT_LAYOUT_VERSIONS",
    "EMIT_FINAL_HEADERS_STORES",
    "EMIT_FINAL_STORES",
    "HEADERS_STORES",
    "NEWEST",
    "QUICK_REJOIN",
    "STORE_FORMATS",
    "WINDOWED_CONFIG",
    "WINDOWED_STEP_MS",
    "WINDOWED_STORES",
    "AppRun",
    "Restore",
    "StoreSpec",
    "build",
    "built",
    "check_more_input",
    "command",
    "described_topology",
    "expected",
    "layout_of",
    "parse",
    "restore_with_cli",
    "restore_with_spark",
    "restore_with_threads",
    "run_app",
    "segments",
    "store_flags",
    "store_path",
    "value_of",
    "version_flags",
    "windowed_first_timestamp",
    "windowed_runner",
]
