"""``statestore inspect``: one row per task and store."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from statestore.cli.common import console, human_bytes, log_dir_option, state_options
from statestore.inspection import inspect_app, reports_json


def _num(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


@click.command()
@state_options
@log_dir_option(required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")
def inspect(state_dir: Path, app_id: str, log_dir: Path | None, as_json: bool) -> None:
    """Show every store of an application: offsets, status, lag, size and lock holder.

    Reads only: stores are opened read-only and locks are looked up, never taken,
    so it is safe against a running application.

    \b
    Example:
      statestore inspect --state-dir /var/lib/app/state --app-id counts --log-dir /var/lib/app/log
    """
    holder, reports = inspect_app(state_dir, app_id, log_dir)
    if as_json:
        click.echo(reports_json(holder, reports))
        return
    table = Table(title=f"{app_id} in {state_dir}  (process lock: {'pid ' + str(holder) if holder else 'free'})")
    for col in ("task", "store", "store offset", "checkpoint", "status", "keys (est.)", "size", "lock"):
        table.add_column(col, justify="right" if col in ("store offset", "checkpoint", "keys (est.)", "size") else "left")
    if log_dir is not None:
        table.add_column("log end", justify="right")
        table.add_column("lag", justify="right")
    for r in reports:
        row = [
            r.task_id,
            r.store,
            _num(r.store_offset),
            _num(r.checkpoint_offset),
            r.status if r.problem is None else f"[red]{r.problem}[/red]",
            _num(r.approx_keys),
            human_bytes(r.size_bytes),
            f"pid {r.lock_holder_pid}" if r.lock_holder_pid else "free",
        ]
        if log_dir is not None:
            row += [_num(r.log_end), _num(r.lag)]
        table.add_row(*row)
    console.print(table)
    if not reports:
        console.print("no stores found")
