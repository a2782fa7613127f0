"""Kafka Streams itself and statestore on one real broker: every test here is marked ``kafka``."""

from pathlib import Path

import pytest

from support import kstreams_app
from support.markers import mark_folder

pytest_collection_modifyitems = mark_folder(__file__, pytest.mark.kafka)


@pytest.fixture(scope="session")
def app_built() -> Path:
    """The interop Kafka Streams application, built once (``scripts/kafka-streams-app.sh``); a skip
    when Maven or a JDK 17 is missing, a failure under ``CI=true``."""
    return kstreams_app.built()
