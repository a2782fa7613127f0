"""``statestore restore``: rebuild stores from their changelogs (segment log or Kafka), in this process or on Spark."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

import click
from rich.console import Console
from rich.table import Table

from statestore import _native
from statestore.changelog.protocol import Changelog
from statestore.changelog.segment_log import SegmentLog
from statestore.cli.common import BarListener, kafka_changelog, kafka_options, kafka_plan, restore_progress
from statestore.cli.stores import (
    found_stores,
    load_topology,
    parse_retentions,
    parse_store_formats,
    parse_store_names,
    topology_option,
)
from statestore.errors import LockError, StateStoreError
from statestore.ids import OFFSET_UNKNOWN, TaskId, TopicPartition, changelog_topic
from statestore.ops.metrics import MetricsPublisher, RestoreMetrics
from statestore.restore.discovery import FoundStore, segmented_refusal
from statestore.restore.engine import (
    DEFAULT_MEMORY_BUDGET,
    MODES,
    LogLike,
    RestoreListener,
    RestoreResult,
    RestoreSpec,
    restore_many,
)
from statestore.restore.planning import changelog_stores, parse_partitions, plan
from statestore.restore.staging import DEFAULT_LOCK_TIMEOUT, can_resume_from, store_location
from statestore.restore.work import PartitionWork, RestoreRow
from statestore.state.directory import StateDirectory
from statestore.state.lag import store_lag
from statestore.state.layout import (
    KIP_1035,
    VERSION_NAMES,
    Layout,
    layout_for,
    record_in_checkpoint,
    record_no_offset_yet,
    to_checkpoint_layout,
)
from statestore.state.policy import Guarantee
from statestore.state.segmented import check_segmented_format
from statestore.state.store import check_store_format
from statestore.state.store_kinds import KIND_OF_FORMAT


def restore_local(
    work: list[PartitionWork],
    *,
    log_dir: LogLike,
    state_dir: Path,
    application_id: str,
    mode: str,
    guarantee: Guarantee,
    memory_budget_bytes: int,
    threads: int | None,
    listener_for: Callable[[PartitionWork], RestoreListener | None] | None = None,
    metrics: RestoreMetrics | None = None,
    formats: Mapping[str, str] | None = None,
    layout: Layout = KIP_1035,
    retentions: Mapping[str, int] | None = None,
) -> list[RestoreRow]:
    """Restore ``work`` with ``restore_many`` in this process, every task locked for the whole run.

    ``log_dir`` is the segment log directory, or any changelog the engine
    reads (a :class:`~statestore.changelog.kafka.KafkaChangelog`).

    A store holding data without an offset is deleted first under
    exactly-once (unknown state), as the Spark engine does. With ``metrics``,
    every restore records into it, and the snapshots are published for
    ``statestore watch`` while the restore runs. ``formats`` maps store names
    to their format (default ``"plain"``; ``"timestamped"`` for Kafka Streams'
    timestamped stores, ``"timestamped-headers"`` for its header-aware ones;
    ``"versioned"`` for a versioned store, with its history retention from
    ``retentions``; ``"timestamped-window"``, ``"window"``, ``"session"``,
    their ``-headers`` forms or the ``"emit-final-*"`` ones for a window or
    session store, restored into its directory of segments ``<task>/<store>``
    with its retention from ``retentions`` (name -> ms)). A key-value store
    of another format, or of a type statestore does not know, is left
    untouched and reported as a failed row (a segmented store: segments of a
    type statestore does not know, or that do not fit its format); so is a
    segmented or versioned store without its retention, or a store
    ``layout=CHECKPOINT`` does not write (header-aware, versioned,
    emit-final). With ``layout=CHECKPOINT`` (Kafka Streams 3.6 - 4.2) each
    restored store (a window or session store: each of its segments) is
    turned into that layout and its offset recorded in its task's
    ``.checkpoint``, under the task lock.
    """
    fmts, rets = dict(formats or {}), dict(retentions or {})
    refused: dict[int, str] = {}
    with StateDirectory(state_dir, application_id) as sd:
        for task_id in sorted({w.task_id for w in work}):
            if not sd.lock(task_id):
                raise LockError(
                    f"task {task_id}: {sd.task_dir(task_id)} is locked by another thread",
                    path=sd.task_dir(task_id),
                    task_id=task_id,
                )
        specs = []
        todo: list[int] = []
        wipe: list[Path] = []
        for i, w in enumerate(work):
            fmt = fmts.get(w.store, "plain")
            target = store_location(sd, w.task_id, w.store, fmt)
            if fmt in _native.RETAINED_STORE_FORMATS or fmt in _native.HEADERS_STORE_FORMATS:
                why = segmented_refusal(
                    w.store, w.tp.topic, fmt, rets.get(w.store), offsets_in_store=layout.offsets_in_store
                )
                if why is not None:
                    refused[i] = f"task {w.task_id} store {w.store}: {why}"
                    continue
            try:
                if fmt in _native.SEGMENTED_STORE_FORMATS:
                    check_segmented_format(target, fmt, who=f"task {w.task_id} store {w.store}")
                else:
                    check_store_format(target, fmt)
            except StateStoreError as e:
                refused[i] = str(e)
                continue
            todo.append(i)
            if target.exists() and not can_resume_from(target, w.tp, guarantee):
                wipe.append(target)
            listener = listener_for(w) if listener_for is not None else None
            if metrics is not None:
                listener = metrics.listener(w.task_id, also=listener)
            specs.append(
                RestoreSpec(
                    target,
                    log_dir,
                    w.tp,
                    mode=mode,
                    memory_budget_bytes=memory_budget_bytes,
                    listener=listener,
                    format=fmt,
                    retention_ms=rets.get(w.store) if fmt in _native.RETAINED_STORE_FORMATS else None,
                )
            )
        if not layout.offsets_in_store:
            # A task's .checkpoint vouches for its stores as they are: each store about to change
            # loses its entry first (durably), so a restore that fails or is killed never leaves
            # an offset over a store that does not hold it (Kafka Streams would resume from it and
            # never read what lies before). _settle records the entries of the restored ones.
            stale: dict[TaskId, dict[TopicPartition, int | None]] = {}
            for i in todo:
                stale.setdefault(work[i].task_id, {})[work[i].tp] = None
            for task_id, entries in sorted(stale.items()):
                record_in_checkpoint(sd.checkpoint_path(task_id), entries)
        for target in wipe:
            shutil.rmtree(target)
        for spec in specs:
            Path(spec.store_path).parent.mkdir(exist_ok=True)
        if not specs:
            done = []
        elif metrics is not None:
            with MetricsPublisher(metrics, state_dir):
                done = restore_many(specs, threads=threads)
        else:
            done = restore_many(specs, threads=threads)
        refused.update(_settle(sd, work, todo, done, layout, fmts))
    by_index = dict(zip(todo, done, strict=True))
    # The lag once restored: of the segment log, or of the changelog object (e.g. Kafka) given.
    changelog: Changelog | None = (
        SegmentLog(Path(log_dir))
        if isinstance(log_dir, (str, os.PathLike))
        else (cast(Changelog, log_dir) if hasattr(log_dir, "committed_records") else None)
    )
    rows = []
    for i, w in enumerate(work):
        if i in refused:
            rows.append(RestoreRow.failed(w, refused[i], mode=mode, seconds=0.0))
            continue
        r = by_index[i]
        if r.error is not None:
            rows.append(
                RestoreRow.failed(
                    w,
                    str(r.error),
                    mode=r.mode,
                    seconds=r.seconds,
                    records_applied=r.records_applied,
                    records_skipped=r.records_skipped.total,
                    bytes_read=r.bytes_read,
                )
            )
            continue
        lag = None
        if changelog is not None:
            try:
                lag = store_lag(changelog, w.tp, r.offset)
            except StateStoreError:
                lag = None  # unknown; the restore itself succeeded
        rows.append(RestoreRow.restored(w, r, lag=lag))
    return rows


def _settle(
    sd: StateDirectory,
    work: list[PartitionWork],
    todo: list[int],
    done: list[RestoreResult],
    layout: Layout,
    formats: Mapping[str, str],
) -> dict[int, str]:
    """Leave every store restored without error as ``layout`` wants it, under the task locks.

    In the KIP-1035 layout a window or session store is left as the engine
    wrote it (without a committed record it has no segment to record
    ``OFFSET_UNKNOWN`` in). In the ``.checkpoint`` layout each store -- a
    window or session store segment by segment -- is converted and its offset recorded in its task's
    ``.checkpoint`` (other entries kept). A store restored from a changelog partition without a
    committed record gets ``OFFSET_UNKNOWN`` in either layout (``record_no_offset_yet``), or Kafka
    Streams would wipe its task under exactly_once_v2. Returns, by work index, why a store could
    not be settled.
    """
    failed: dict[int, str] = {}
    by_task: dict[TaskId, dict[TopicPartition, int | None]] = {}
    for i, r in zip(todo, done, strict=True):
        if r.error is not None:
            continue
        w = work[i]
        fmt = formats.get(w.store, "plain")
        segmented = fmt in _native.SEGMENTED_STORE_FORMATS
        if segmented and layout.offsets_in_store:
            continue
        path = store_location(sd, w.task_id, w.store, fmt)
        try:
            if layout.offsets_in_store:
                if r.offset is None:
                    record_no_offset_yet(
                        path, sd.checkpoint_path(w.task_id), w.tp, formats.get(w.store, "plain"), layout
                    )
                continue
            offset = to_checkpoint_layout(path, w.tp)
        except StateStoreError as e:
            failed[i] = str(e)
            continue
        by_task.setdefault(w.task_id, {})[w.tp] = OFFSET_UNKNOWN if offset is None else offset
    for task_id, offsets in sorted(by_task.items()):
        record_in_checkpoint(sd.checkpoint_path(task_id), offsets)
    return failed


def _table(rows: list[RestoreRow]) -> Table:
    t = Table(title="restore", title_justify="left")
    for col, right in [
        ("task", False),
        ("store", False),
        ("partition", True),
        ("mode", False),
        ("start", True),
        ("end", True),
        ("applied", True),
        ("skipped", True),
        ("MiB read", True),
        ("seconds", True),
        ("status", False),
        ("error", False),
    ]:
        t.add_column(col, justify="right" if right else "left", overflow="fold")
    for r in rows:
        t.add_row(
            r.task_id,
            r.store,
            str(r.partition),
            r.mode,
            "" if r.start_offset is None else str(r.start_offset),
            "" if r.end_offset is None else str(r.end_offset),
            f"{r.records_applied:,}",
            f"{r.records_skipped:,}",
            f"{r.bytes_read / 2**20:,.1f}",
            f"{r.seconds:.2f}",
            "ok" if r.ok else "[red]failed[/red]",
            r.error or "",
        )
    return t


@click.command()
@click.option(
    "--log-dir",
    default=None,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The changelog segment log (as executors see it, with --engine spark); or use --kafka.",
)
@kafka_options
@click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The state directory; stores go to <state-dir>/<app-id>/<task>/rocksdb/<store>.",
)
@click.option("--app-id", "application_id", required=True, help="The application id.")
@click.option(
    "--store",
    "stores",
    multiple=True,
    metavar="NAME[@SUBTOPOLOGY]",
    help="Store to restore, e.g. counts or counts@1 (sub-topology 1: task directories 1_<p>; default 0); "
    "repeatable (default: every store with a changelog, or every store of --topology).",
)
@topology_option
@click.option(
    "--partitions",
    default=None,
    metavar="LIST",
    help="Partitions, e.g. 0-7 or 0,2,5-7 (default: every partition of each changelog).",
)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default="auto",
    show_default=True,
    help="auto: bulk for an empty store, replay otherwise.",
)
@click.option(
    "--guarantee",
    type=click.Choice([g.value for g in Guarantee]),
    default=Guarantee.EXACTLY_ONCE_V2.value,
    show_default=True,
    help="What a store holding data without an offset means (exactly-once: restore it from nothing).",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "spark"]),
    default="local",
    show_default=True,
    help="local: threads of this process; spark: one Spark task per (store, partition).",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="Threads of the local engine (default: one per core).",
)
@click.option(
    "--master",
    default="local[2]",
    show_default=True,
    help="Spark master for --engine spark (ignored when a session is already active).",
)
@click.option(
    "--memory-budget",
    "memory_mib",
    type=click.IntRange(min=1),
    default=DEFAULT_MEMORY_BUDGET // 2**20,
    show_default=True,
    help="Memory budget of each bulk restore, MiB.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help="Serve Prometheus metrics on this port of 127.0.0.1 while restoring (needs statestore[metrics]).",
)
@click.option(
    "--store-format",
    "store_formats",
    multiple=True,
    metavar="NAME=FORMAT",
    help="A store's format: plain (default) or timestamped (Kafka Streams' DSL stores, e.g. count()); "
    "timestamped-window, window or session for a window or session store (with --retention); "
    "versioned for Stores.persistentVersionedKeyValueStore (with --retention: its history retention); "
    "repeatable. With --topology a store's format must be given here or (key-value) found on disk.",
)
@click.option(
    "--kafka-streams-version",
    "kafka_streams_version",
    type=click.Choice(VERSION_NAMES),
    default=VERSION_NAMES[-1],
    show_default=True,
    help="The Kafka Streams version that opens the stores: 4.3+ reads offsets in each store's offsets "
    "column family; 3.6 - 4.2 in the task's .checkpoint file.",
)
@click.option(
    "--retention",
    "retentions",
    multiple=True,
    metavar="NAME=MS",
    help="A window or session store's retention in milliseconds (window size + grace for the DSL's "
    "windowed aggregations), required for each; a versioned store's history retention (with --kafka "
    "and --topology, min.compaction.lag.ms - 1 day of its changelog unless given); repeatable. Without "
    "--topology the store's --store-format must name a window, session or versioned format.",
)
def restore(
    log_dir: Path | None,
    kafka: str | None,
    kafka_config: tuple[str, ...],
    state_dir: Path,
    application_id: str,
    stores: tuple[str, ...],
    partitions: str | None,
    mode: str,
    guarantee: str,
    engine: str,
    threads: int | None,
    master: str,
    memory_mib: int,
    metrics_port: int | None,
    store_formats: tuple[str, ...],
    topology_file: Path | None,
    retentions: tuple[str, ...],
    kafka_streams_version: str,
) -> None:
    """Rebuild stores from their changelogs and print one row per (store, partition).

    Exits with status 1 if any partition failed.

    \b
    Examples:
      statestore restore --log-dir /data/changelog --state-dir /var/lib/app --app-id app --threads 4
      statestore restore --engine spark --master local[2] --log-dir /data/changelog \\
          --state-dir /var/lib/app --app-id app --store counts --partitions 0-7
      statestore restore --kafka broker1:9092 --kafka-config security.protocol=SSL \\
          --state-dir /var/lib/app --app-id app --threads 4
      statestore restore --kafka broker1:9092 --state-dir /var/lib/kstreams --app-id my-streams-app \\
          --store-format counts=timestamped
      statestore restore --kafka broker1:9092 --state-dir /var/lib/kstreams --app-id my-streams-app \\
          --topology topology.txt --store-format counts=timestamped --store-format latest=plain
      statestore restore --log-dir /data/changelog --state-dir /var/lib/kstreams --app-id my-streams-app \\
          --store tumbling --store-format tumbling=timestamped-window --retention tumbling=86400000
    """
    try:
        parts = parse_partitions(partitions) if partitions is not None else None
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--partitions") from e
    formats = parse_store_formats(store_formats)
    named = parse_store_names(stores)
    retention_ms = parse_retentions(retentions)
    if (log_dir is None) == (kafka is None):
        raise click.UsageError("name the changelog: either --log-dir DIR or --kafka BOOTSTRAP")
    topology = load_topology(topology_file) if topology_file is not None else None
    if topology is None:
        for name, ms in retention_ms.items():
            if formats.get(name) not in _native.RETAINED_STORE_FORMATS:
                raise click.UsageError(
                    f"--retention {name}={ms}: a retention is a window, session or versioned store's; give "
                    f"--store-format {name}={'|'.join(_native.RETAINED_STORE_FORMATS)}, or --topology FILE"
                )
    layout = layout_for(kafka_streams_version)
    subs: dict[str, int] = {n: sub or 0 for n, sub in named.items()}
    refused: list[FoundStore] = []
    budget = memory_mib * 2**20
    metrics = RestoreMetrics(application_id)
    if metrics_port is not None:
        from statestore.ops.exporter import start_exporter

        port, _ = start_exporter(metrics, metrics_port)
        click.echo(f"metrics: http://127.0.0.1:{port}/metrics", err=True)
    t0 = time.perf_counter()
    console = Console() if sys.stdout.isatty() else Console(width=200)
    if topology is not None:
        if kafka is not None:
            with kafka_changelog(kafka, kafka_config) as changelog:
                found = found_stores(
                    topology,
                    application_id,
                    changelog=changelog,
                    log_dir=None,
                    names=named,
                    formats=formats,
                    retentions=retention_ms,
                    state_dir=state_dir,
                )
        else:
            found = found_stores(
                topology,
                application_id,
                changelog=None,
                log_dir=log_dir,
                names=named,
                formats=formats,
                retentions=retention_ms,
                state_dir=state_dir,
            )
        subs = {f.name: f.subtopology for f in found if f.refusal is None}
        formats = {f.name: f.format for f in found if f.refusal is None and f.format is not None}
        retention_ms = {
            f.name: f.retention_ms for f in found if f.refusal is None and f.retention_ms is not None
        }
        refused = [f for f in found if f.refusal is not None]
    asked = bool(subs)
    configs = None
    segmented = [n for n, fmt in formats.items() if fmt in _native.SEGMENTED_STORE_FORMATS]
    if kafka is not None and topology is None and segmented:
        # the changelog topics' configs (retention.ms) may contradict a --retention given
        with kafka_changelog(kafka, kafka_config) as changelog:
            topics = set(changelog.topics())
            wanted = [t for t in (changelog_topic(application_id, n) for n in segmented) if t in topics]
            configs = changelog.topic_configs(wanted)
    refused += _refused_segmented(formats, retention_ms, subs, layout, application_id, configs)
    blocked = {f.name for f in refused}
    _check_segments(state_dir, application_id, formats, retention_ms, blocked)
    subs = {n: sub for n, sub in subs.items() if n not in blocked}
    formats = {n: fmt for n, fmt in formats.items() if n not in blocked}
    retention_ms = {n: ms for n, ms in retention_ms.items() if n not in blocked}
    if (asked or topology is not None) and not subs:
        _report(console, [], t0, engine, refused)
        return
    if kafka is not None:
        if engine != "local":
            conf = {"bootstrap.servers": kafka, **dict(kv.partition("=")[::2] for kv in kafka_config)}
            rows = _restore_spark(
                subs,
                parts,
                log_dir=None,
                kafka=conf,
                state_dir=state_dir,
                application_id=application_id,
                mode=mode,
                guarantee=guarantee,
                memory_budget_bytes=budget,
                master=master,
                formats=formats,
                kafka_streams_version=kafka_streams_version,
                retentions=retention_ms,
            )
            _report(console, rows, t0, f"{engine}, Kafka", refused)
            return
        with kafka_changelog(kafka, kafka_config) as changelog:
            work = [w for w in kafka_plan(changelog, application_id, subs, parts) if w.store not in blocked]
            with restore_progress(console) as progress:
                rows = restore_local(
                    work,
                    log_dir=changelog,
                    state_dir=state_dir,
                    application_id=application_id,
                    mode=mode,
                    guarantee=Guarantee(guarantee),
                    memory_budget_bytes=budget,
                    threads=threads,
                    listener_for=lambda w: BarListener(progress, f"task {w.task_id} {w.store}"),
                    metrics=metrics,
                    formats=formats,
                    layout=layout,
                    retentions=retention_ms,
                )
        _report(console, rows, t0, "local, Kafka", refused)
        return
    assert log_dir is not None
    if not subs:
        subs = dict.fromkeys(changelog_stores(log_dir, application_id), 0)
        if not subs:
            raise click.UsageError(
                f"no changelog of application {application_id!r} under {log_dir}; "
                "check --app-id or name the stores with --store"
            )
        subs = {n: sub for n, sub in subs.items() if n not in blocked}
        if not subs:
            _report(console, [], t0, engine, refused)
            return
    work = plan(log_dir, application_id, subs, parts)
    if engine == "local":
        with restore_progress(console) as progress:
            rows = restore_local(
                work,
                log_dir=log_dir,
                state_dir=state_dir,
                application_id=application_id,
                mode=mode,
                guarantee=Guarantee(guarantee),
                memory_budget_bytes=budget,
                threads=threads,
                listener_for=lambda w: BarListener(progress, f"task {w.task_id} {w.store}"),
                metrics=metrics,
                formats=formats,
                layout=layout,
                retentions=retention_ms,
            )
    else:
        rows = _restore_spark(
            subs,
            parts,
            log_dir=log_dir,
            state_dir=state_dir,
            application_id=application_id,
            mode=mode,
            guarantee=guarantee,
            memory_budget_bytes=budget,
            master=master,
            formats=formats,
            kafka_streams_version=kafka_streams_version,
            retentions=retention_ms,
        )
    _report(console, rows, t0, engine, refused)


def _refused_segmented(
    formats: Mapping[str, str],
    retentions: Mapping[str, int],
    subs: Mapping[str, int],
    layout: Layout,
    application_id: str,
    topic_configs: Mapping[str, Mapping[str, str]] | None = None,
) -> list[FoundStore]:
    """The stores ``formats`` makes window, session, versioned or header-aware stores that are not
    restored, each with why (no ``--retention``, one its changelog topic's configs contradict, where
    ``topic_configs`` gives them, or a format the ``.checkpoint`` layout does not take): refused
    before any store is opened, so nothing of them is written."""
    out = []
    for name, fmt in sorted(formats.items()):
        if fmt not in _native.RETAINED_STORE_FORMATS and fmt not in _native.HEADERS_STORE_FORMATS:
            continue
        topic = changelog_topic(application_id, name)
        why = segmented_refusal(
            name,
            topic,
            fmt,
            retentions.get(name),
            None if topic_configs is None else topic_configs.get(topic),
            offsets_in_store=layout.offsets_in_store,
        )
        if why is not None:
            out.append(
                FoundStore(name, subs.get(name, 0), KIND_OF_FORMAT[fmt], fmt, retentions.get(name), why)
            )
    return out


def _check_segments(
    state_dir: Path,
    application_id: str,
    formats: Mapping[str, str],
    retentions: Mapping[str, int],
    blocked: set[str],
) -> None:
    """A usage error naming the segment directory when a window or session store already in the
    state directory holds a segment that does not start at a multiple of the segment interval its
    ``--retention`` gives (the DSL's, ``max(retention / 2, 60 s)``): it was written with another
    retention or interval, and nothing is written before this is settled."""
    root = state_dir / application_id
    if not root.is_dir():
        return
    for name, fmt in sorted(formats.items()):
        if fmt not in _native.SEGMENTED_STORE_FORMATS or name in blocked or name not in retentions:
            continue
        for task_dir in sorted(root.iterdir()):
            store = task_dir / name
            if not store.is_dir() or task_dir.name.startswith("."):
                continue
            try:
                _native.segments_check(store, retentions[name])
            except StateStoreError as e:
                raise click.UsageError(
                    f"--retention {name}={retentions[name]} (segment interval "
                    f"{_native.dsl_segment_interval(retentions[name])} ms) does not fit the store on disk: {e}"
                ) from e


def _report(
    console: Console, rows: list[RestoreRow], t0: float, engine: str, refused: Sequence[FoundStore] = ()
) -> None:
    """The result table, then each store not restored with why; exit 1 if any failed or was refused."""
    if rows:
        console.print(_table(rows))
    failed = sum(1 for r in rows if not r.ok)
    for f in refused:
        console.print(
            f"not restored: store {f.name} (sub-topology {f.subtopology}): {f.refusal}", soft_wrap=True
        )
    console.print(
        f"{len(rows) - failed} ok, {failed} failed, {len(refused)} stores not restored in "
        f"{time.perf_counter() - t0:.1f} s ({engine})"
    )
    if failed or refused:
        sys.exit(1)


def _restore_spark(
    names: Mapping[str, int],
    parts: list[int] | None,
    *,
    log_dir: Path | None,
    state_dir: Path,
    application_id: str,
    mode: str,
    guarantee: str,
    memory_budget_bytes: int,
    master: str,
    formats: Mapping[str, str],
    kafka: dict[str, str] | None = None,
    kafka_streams_version: str | None = None,
    retentions: Mapping[str, int] | None = None,
) -> list[RestoreRow]:
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise click.ClickException(
            f"--engine spark needs pyspark: pip install 'statestore[spark]' ({e})"
        ) from e
    from statestore.restore.spark import restore_on_spark, spark_session

    active = SparkSession.getActiveSession()
    session = active if active is not None else spark_session(master)
    try:
        if not names:
            raise click.UsageError("--engine spark with --kafka needs the stores named (--store)")
        df = restore_on_spark(
            session,
            log_dir=None if log_dir is None else log_dir.resolve(),
            kafka=kafka,
            state_dir=state_dir.resolve(),
            application_id=application_id,
            stores=names,
            partitions=parts,
            mode=mode,
            guarantee=guarantee,
            memory_budget_bytes=memory_budget_bytes,
            lock_timeout=DEFAULT_LOCK_TIMEOUT,
            formats=formats,
            kafka_streams_version=kafka_streams_version,
            retentions=retentions,
        )
        return [RestoreRow(*r) for r in df.collect()]
    finally:
        if active is None:
            session.stop()
