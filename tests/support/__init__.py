"""What the tests share: child processes they SIGKILL, a Kafka broker for the
session, the reference model of a restored store, and small worlds for bad input.

``tests`` is on the import path of the test run (pytest's ``pythonpath``) and,
through ``PYTHONPATH`` set in ``conftest.py``, of every child process a test
starts, so modules here import each other as ``support.<module>``.
"""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]
#: ``tests/``.
TESTS = ROOT / "tests"
#: ``tests/support/``: child processes and shared helpers.
SUPPORT = TESTS / "support"


def load_module(path: Path, name: str) -> ModuleType:
    """The module at ``path``, imported as ``name`` without putting its folder on the import path.

    For code that lives outside the test path but is tested here (the Python
    fuzz harness in ``fuzz/python``, the benchmark runner in ``benches``).
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
