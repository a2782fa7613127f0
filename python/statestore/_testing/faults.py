"""Failures injected on purpose, for tests of retries only; not part of the API.

An attempt named in :data:`FAIL_ATTEMPT_ENV` (``<store>:<partition>:<attempt>[,...]``)
restores into its staging directory, then raises :class:`InjectedFailure`
before moving the store into place, so a test can see Spark retry it.
"""

from __future__ import annotations

import os

#: Environment variable naming attempts that fail on purpose: ``<store>:<partition>:<attempt>[,...]``.
FAIL_ATTEMPT_ENV = "STATESTORE_SPARK_FAIL_ATTEMPT"


class InjectedFailure(RuntimeError):
    """Raised by an attempt named in :data:`FAIL_ATTEMPT_ENV`."""


def failure_injected(store: str, partition: int, attempt: int) -> bool:
    """Whether :data:`FAIL_ATTEMPT_ENV` names this attempt (0-based, as Spark numbers them)."""
    spec = os.environ.get(FAIL_ATTEMPT_ENV, "")
    return f"{store}:{partition}:{attempt}" in {s.strip() for s in spec.split(",")}
