"""The application runner (``statestore.app``) against Apache Kafka 4.4: every test here is marked ``app``
and uses the session's broker (``kafka_bootstrap``)."""

import pytest

from support.markers import mark_folder

pytest_collection_modifyitems = mark_folder(__file__, pytest.mark.app)
