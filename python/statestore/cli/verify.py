"""``statestore verify``: compare each store with its changelog."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table

from statestore import _native
from statestore.cli.common import (
    console,
    err_console,
    kafka_changelog,
    kafka_options,
    log_dir_option,
    show_bytes,
    state_options,
)
from statestore.cli.stores import (
    check_topology_against_state,
    load_topology,
    parse_retentions,
    parse_store_formats,
    topology_option,
)
from statestore.ops.verify import VerifyResult, verify_app


@click.command()
@state_options
@log_dir_option(required=False)
@kafka_options
@click.option("--store", "stores", multiple=True, help="Only this store (repeatable).")
@click.option(
    "--store-format",
    "store_formats",
    multiple=True,
    metavar="NAME=versioned",
    help="A versioned store (its bytes look like a plain store's; with --kafka its changelog tells it); "
    "repeatable, with --retention NAME=MS.",
)
@click.option(
    "--retention",
    "retentions",
    multiple=True,
    metavar="NAME=MS",
    help="A versioned store's history retention in milliseconds (with --kafka: its changelog's "
    "min.compaction.lag.ms less a day unless given); repeatable.",
)
@topology_option
def verify(
    state_dir: Path,
    app_id: str,
    log_dir: Path | None,
    kafka: str | None,
    kafka_config: tuple[str, ...],
    stores: tuple[str, ...],
    store_formats: tuple[str, ...],
    retentions: tuple[str, ...],
    topology_file: Path | None,
) -> None:
    """Recompute each store from its changelog and compare; exit 1 on any mismatch.

    The expected state is rebuilt up to the offset the store claims, so a store
    that is behind its log still verifies; one that holds anything else does not.
    With --topology (the text Topology.describe() prints), a state directory
    that disagrees with it is a usage error naming the line.

    \b
    Example:
      statestore verify --state-dir /var/lib/app/state --app-id counts --log-dir /var/lib/app/log
      statestore verify --state-dir /var/lib/kstreams --app-id my-streams-app --kafka broker1:9092
    """
    if (log_dir is None) == (kafka is None):
        raise click.UsageError("name the changelog: either --log-dir DIR or --kafka BOOTSTRAP")
    if topology_file is not None:
        check_topology_against_state(load_topology(topology_file), state_dir, app_id)
    formats, history = parse_store_formats(store_formats), parse_retentions(retentions)
    for name, fmt in formats.items():
        if fmt not in _native.VERSIONED_STORE_FORMATS:
            raise click.BadParameter(
                f"{name}={fmt}: verify takes the format of a versioned store only (others are read from "
                "the store)",
                param_hint="--store-format",
            )
    results: list[VerifyResult]
    if kafka is not None:
        with kafka_changelog(kafka, kafka_config) as changelog:
            results = verify_app(
                state_dir,
                app_id,
                stores=list(stores) or None,
                changelog=changelog,
                formats=formats,
                retentions=history,
            )
    else:
        results = verify_app(
            state_dir, app_id, log_dir, list(stores) or None, formats=formats, retentions=history
        )
    table = Table(title=f"verify {app_id}")
    for col in ("task", "store", "format", "offset", "entries", "digest", "result"):
        table.add_column(col, justify="right" if col in ("offset", "entries") else "left")
    bad = []
    for r in results:
        verdict = (
            f"[yellow]{r.offset_note}[/yellow]"
            if r.ok and r.offset_note is not None
            else "[green]exact[/green]"
            if r.ok
            else (
                "[red]MISMATCH[/red]"
                if r.problem is None
                else "[red]DAMAGED[/red]"
                if r.damaged
                else "[red]UNREADABLE[/red]"
            )
        )
        table.add_row(
            str(r.store.task_id),
            r.store.store,
            r.format or "?",
            (r.offset_note or "-") if r.offset is None else f"{r.offset:,}",
            "-" if r.problem else f"{r.actual_entries:,}",
            r.actual_digest[:16] or "-",
            verdict,
        )
        if not r.ok:
            bad.append(r)
    console.print(table)
    for r in bad:
        where = f"task {r.store.task_id} store {r.store.store} ({r.store.path}) at offset {r.offset}"
        if r.damaged:
            err_console.print(
                f"damaged: task {r.store.task_id} store {r.store.store} ({r.store.path}) cannot be read: "
                f"{r.problem}",
                soft_wrap=True,
            )
        elif r.problem is not None:
            err_console.print(f"cannot verify task {r.store.task_id} store {r.store.store}: {r.problem}")
        elif r.first_difference is not None:
            key, exp, act = r.first_difference
            err_console.print(
                f"mismatch in {where}: first differing key {show_bytes(key)}: "
                f"changelog says {show_bytes(exp)}, store has {show_bytes(act)}"
            )
        else:
            err_console.print(
                f"mismatch in {where}: the store claims offset {r.offset} but the changelog's last "
                f"committed record up to there is at {r.expected_offset}"
            )
    for r in results:
        if r.ok and r.offset_note is not None:
            err_console.print(
                f"{r.offset_note}: task {r.store.task_id} store {r.store.store} ({r.store.path}) records "
                f"no committed changelog offset; it holds {r.actual_entries:,} entries and is restored "
                "from the changelog's start",
                soft_wrap=True,
            )
    if not results:
        err_console.print(f"no stores found for {app_id} in {state_dir}")
    if bad:
        err_console.print(
            f"{len(bad)} of {len(results)} stores differ from their changelog; wipe them to restore"
        )
        sys.exit(1)
