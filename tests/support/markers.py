"""Markers given by folder: a folder's ``conftest.py`` marks every test under it.

What a test needs (a Kafka broker, a Spark cluster, the built wheel) is said
once per folder instead of in each file, so ``-m 'not kafka'`` and friends
select by where a test lives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def mark_folder(conftest_file: str, mark: pytest.MarkDecorator) -> Callable[[list[pytest.Item]], None]:
    """A ``pytest_collection_modifyitems`` hook adding ``mark`` to every test in the folder of ``conftest_file``.

    It runs before pytest deselects by ``-m``, so the mark selects as if written on each test.
    """
    folder = Path(conftest_file).resolve().parent

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
        for item in items:
            if folder in Path(item.path).resolve().parents:
                item.add_marker(mark)

    return pytest_collection_modifyitems


# The servers a test may start, by the session fixture that starts it, with whether all of its tests
# share one instance in a parallel run. Under `pytest -n N --dist loadgroup` (what `make test` runs),
# session fixtures exist once per worker: a group keeps the tests of one server on one worker.
# A 3-node cluster or a Spark session is one per run (its ports, memory and cores); a broker is cheap
# enough to have one per worker, so its tests are grouped by file only (a file's tests may rely on
# each other's topics), and the files spread over the workers.
SERVER_GROUPS: tuple[tuple[str, bool], ...] = (
    ("kafka_cluster", True),
    ("spark_cluster", True),
    ("spark", True),
    ("kafka_broker", False),
)


def xdist_group(item: pytest.Item) -> str | None:
    """The ``xdist_group`` of ``item``: the server it needs (see ``SERVER_GROUPS``), or None to run anywhere."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for fixture, one_per_run in SERVER_GROUPS:
        if fixture in fixtures:
            return fixture if one_per_run else f"{fixture}:{item.path}"
    if item.get_closest_marker("wheel") is not None:
        return "wheel"
    return None
