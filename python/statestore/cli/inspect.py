"""``statestore inspect``: one row per task and store."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from statestore.cli.common import (
    console,
    human_bytes,
    kafka_changelog,
    kafka_options,
    log_dir_option,
    state_options,
)
from statestore.cli.stores import (
    check_topology_against_state,
    load_topology,
    parse_retentions,
    parse_store_formats,
    segmented_options,
    topology_option,
)
from statestore.ops.inspection import StoreReport, inspect_app, reports_json
from statestore.ops.metrics import describe_liveness, published_snapshots, task_states_by_process


def _num(v: int | None, missing: str = "-") -> str:
    return missing if v is None else f"{v:,}"


def _format(r: StoreReport) -> str:
    """The format column: the format, what the bytes fit when they do not tell it, and the layout."""
    fmt = r.format or ("window|session" if r.format_note is not None else "?")
    return f"{fmt} ({r.layout})" if r.layout == "checkpoint" else fmt


@click.command()
@state_options
@log_dir_option(required=False)
@kafka_options
@topology_option
@segmented_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")
@click.option(
    "--quick",
    is_flag=True,
    help="Do not read every block of every store to check its checksum (damaged data blocks go unseen).",
)
def inspect(
    state_dir: Path,
    app_id: str,
    log_dir: Path | None,
    kafka: str | None,
    kafka_config: tuple[str, ...],
    as_json: bool,
    quick: bool,
    topology_file: Path | None,
    store_formats: tuple[str, ...],
    retentions: tuple[str, ...],
) -> None:
    """Show every store of an application: offsets, status, lag, size, lock holder and task state.

    The task state (RESTORING, RUNNING, STANDBY) and the liveness of the
    process running the application come from the snapshots a running
    application publishes (statestore.app does, every second); "-" when no
    live process publishes one.

    Reads only: stores are opened read-only and locks are looked up, never taken,
    so it is safe against a running application. Every block of every store is
    read once with its checksum verified, so a damaged store shows with
    RocksDB's reason (--quick skips that read). With --topology (the text
    Topology.describe() prints), a state directory that disagrees with it (a
    store in a task of another sub-topology, a store it does not name) is a
    usage error naming the line.

    A window or session store (a directory of segments) shows as one row with
    the offset Kafka Streams reads (the newest segment's) and a row per
    segment below it. Timestamped segments are a timestamped-window store;
    plain ones a window or session store, which the bytes do not tell apart
    (--store-format NAME=window|session). With --retention NAME=MS its
    segments are checked against the segment interval that retention gives
    (the DSL's, max(retention / 2, 60 s)). A versioned store's bytes look like
    a plain store's: it shows as versioned with --store-format NAME=versioned,
    or with --kafka, whose changelog configs tell it.

    \b
    Example:
      statestore inspect --state-dir /var/lib/app/state --app-id counts --log-dir /var/lib/app/log
      statestore inspect --state-dir /var/lib/app/state --app-id counts --kafka broker1:9092
    """
    if log_dir is not None and kafka is not None:
        raise click.UsageError("give either --log-dir or --kafka, not both")
    formats = parse_store_formats(store_formats)
    retention_ms = parse_retentions(retentions)
    if topology_file is not None:
        check_topology_against_state(load_topology(topology_file), state_dir, app_id)
    holder: int | None
    reports: list[StoreReport]
    if kafka is not None:
        with kafka_changelog(kafka, kafka_config) as changelog:
            holder, reports = inspect_app(
                state_dir,
                app_id,
                changelog=changelog,
                check_blocks=not quick,
                formats=formats,
                retentions=retention_ms,
            )
    else:
        holder, reports = inspect_app(
            state_dir, app_id, log_dir, check_blocks=not quick, formats=formats, retentions=retention_ms
        )
    with_log = log_dir is not None or kafka is not None
    live = published_snapshots(state_dir, app_id)
    states = task_states_by_process(live)
    if as_json:
        click.echo(reports_json(holder, reports, live))
        return
    table = Table(
        title=f"{app_id} in {state_dir}  (process lock: {'pid ' + str(holder) if holder else 'free'})"
    )
    for col in (
        "task",
        "store",
        "format",
        "store offset",
        "checkpoint",
        "status",
        "task state",
        "keys (est.)",
        "size",
        "lock",
    ):
        table.add_column(
            col, justify="right" if col in ("store offset", "checkpoint", "keys (est.)", "size") else "left"
        )
    if with_log:
        table.add_column("log end", justify="right")
        table.add_column("lag (records)", justify="right")
        table.add_column("lag (offsets)", justify="right")
    for r in reports:
        unknown_type = r.problem is not None and "statestore does not know" in r.problem
        row = [
            r.task_id,
            r.store,
            _format(r),
            _num(r.store_offset, r.offset_note or "-"),
            _num(r.checkpoint_offset, r.checkpoint_note or "-"),
            r.status
            if r.problem is None
            else ("[red]unknown type[/red] (below)" if unknown_type else "[red]damaged[/red] (below)"),
            f"{states[r.task_id][0]} (pid {states[r.task_id][1]})" if r.task_id in states else "-",
            _num(r.approx_keys),
            human_bytes(r.size_bytes),
            f"pid {r.lock_holder_pid}" if r.lock_holder_pid else "free",
        ]
        if with_log:
            row += [_num(r.log_end), _num(r.lag, "unknown"), _num(r.offset_lag, "unknown")]
        table.add_row(*row)
        for seg in r.segments:
            seg_row = [
                "",
                f"  {seg.directory}",
                "segment",
                _num(seg.store_offset, seg.offset_note or "-"),
                "",
                seg.status,
                "",
                _num(seg.approx_keys),
                "",
                "",
            ]
            table.add_row(*([*seg_row, "", "", ""] if with_log else seg_row))
    console.print(table)
    for r in reports:
        if r.format_note is not None:
            console.print(f"{r.task_id} {r.store}: {r.format_note}", soft_wrap=True)
        if r.problem is not None:
            # Below the table, whole: a path or a RocksDB message is unreadable folded into a column.
            console.print(f"[red]{r.task_id} {r.store}:[/red] {r.problem}", soft_wrap=True)
    if not reports:
        console.print("no stores found")
    for snap in live:
        console.print(f"live: {describe_liveness(snap)}", soft_wrap=True)
