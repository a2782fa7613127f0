"""``statestore verify``: compare each store with its changelog."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table

from statestore.cli.common import console, err_console, log_dir_option, show_bytes, state_options
from statestore.verify import verify_app


@click.command()
@state_options
@log_dir_option(required=True)
@click.option("--store", "stores", multiple=True, help="Only this store (repeatable).")
def verify(state_dir: Path, app_id: str, log_dir: Path, stores: tuple[str, ...]) -> None:
    """Recompute each store from its changelog and compare; exit 1 on any mismatch.

    The expected state is rebuilt up to the offset the store claims, so a store
    that is behind its log still verifies; one that holds anything else does not.

    \b
    Example:
      statestore verify --state-dir /var/lib/app/state --app-id counts --log-dir /var/lib/app/log
    """
    results = verify_app(state_dir, app_id, log_dir, list(stores) or None)
    table = Table(title=f"verify {app_id}")
    for col in ("task", "store", "offset", "entries", "digest", "result"):
        table.add_column(col, justify="right" if col in ("offset", "entries") else "left")
    bad = []
    for r in results:
        verdict = "[green]exact[/green]" if r.ok else "[red]DAMAGED[/red]" if r.damage else "[red]MISMATCH[/red]"
        table.add_row(
            str(r.store.task_id),
            r.store.store,
            "-" if r.offset is None else f"{r.offset:,}",
            "-" if r.damage else f"{r.actual_entries:,}",
            r.actual_digest[:16] or "-",
            verdict,
        )
        if not r.ok:
            bad.append(r)
    console.print(table)
    for r in bad:
        where = f"task {r.store.task_id} store {r.store.store} ({r.store.path}) at offset {r.offset}"
        if r.damage is not None:
            err_console.print(
                f"damaged: task {r.store.task_id} store {r.store.store} ({r.store.path}) cannot be read: "
                f"{r.damage}",
                soft_wrap=True,
            )
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
    if not results:
        err_console.print(f"no stores found for {app_id} in {state_dir}")
    if bad:
        err_console.print(f"{len(bad)} of {len(results)} stores differ from their changelog; wipe them to restore")
        sys.exit(1)
