"""The manylinux wheel ``make wheel`` built, installed in a fresh virtual environment: every test here is marked ``wheel``."""

import pytest

from support.markers import mark_folder

pytest_collection_modifyitems = mark_folder(__file__, pytest.mark.wheel)
