"""``python -m statestore.cli``: the same as the ``statestore`` command."""

from statestore.cli import main

main()
