"""Restores on a standalone Spark cluster started by scripts/spark-cluster.sh: every test here is marked ``spark_cluster``."""

import pytest

from support.markers import mark_folder

pytest_collection_modifyitems = mark_folder(__file__, pytest.mark.spark_cluster)
