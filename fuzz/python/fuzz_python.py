"""Run one Python fuzz target under atheris (libFuzzer for Python).

    python fuzz/python/fuzz_python.py <target> [libFuzzer flags] [corpus dirs]

Targets are in ``statestore_fuzz.TARGETS``; ``make fuzz`` runs each for
FUZZ_SECONDS with its seed corpus ``fuzz/corpus/py_<target>/``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Guide the fuzzer through string comparisons too. (The RegEx hook would
# break json's scanner, which calls pattern.match with a position.)
atheris.enabled_hooks.add("str")

with atheris.instrument_imports(include=["statestore", "statestore_fuzz"]):
    import statestore_fuzz

# json.decoder, uuid and re's Python parts were imported before the block
# above: instrument every loaded function so that coverage includes them.
atheris.instrument_all()


def main() -> None:
    # The parsers warn about skipped entries; a million warnings would only slow the run.
    logging.disable(logging.WARNING)
    if len(sys.argv) < 2 or sys.argv[1] not in statestore_fuzz.TARGETS:
        sys.exit(
            f"usage: {sys.argv[0]} <{'|'.join(statestore_fuzz.TARGETS)}> [libFuzzer flags] [corpus dirs]"
        )
    target = statestore_fuzz.TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
