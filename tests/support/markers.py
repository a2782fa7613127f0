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
