"""The changelog on Apache Kafka 4.4 (native fetcher, producer, admin), against a real broker: every test here is marked ``kafka``."""

import pytest

from support.markers import mark_folder

pytest_collection_modifyitems = mark_folder(__file__, pytest.mark.kafka)
