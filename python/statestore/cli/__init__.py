"""The ``statestore`` command.

Each subcommand lives in its own module of this package and is attached to the
group here. Errors from the library become one line on stderr and exit code 1
(2 for usage errors, as click does); ``--verbose`` shows the trace.
"""

from __future__ import annotations

import logging
import sys

import click

from statestore.errors import StateStoreError


class _Group(click.Group):
    """A group that turns library errors into one clear line instead of a trace."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except StateStoreError as e:
            if ctx.obj and ctx.obj.get("verbose"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.option("--verbose", "-v", is_flag=True, help="Log progress and show the full trace on errors.")
@click.pass_context
def main(ctx: click.Context, verbose: bool) -> None:
    """statestore: local RocksDB state stores kept consistent with their changelogs."""
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


def _register() -> None:
    from statestore.cli.clean import clean
    from statestore.cli.demo import demo
    from statestore.cli.inspect import inspect
    from statestore.cli.log import log
    from statestore.cli.restore import restore
    from statestore.cli.verify import verify
    from statestore.cli.watch import watch

    main.add_command(demo)
    main.add_command(inspect)
    main.add_command(verify)
    main.add_command(clean)
    main.add_command(log)
    main.add_command(restore)
    main.add_command(watch)


_register()
