"""Restoring many stores on Spark, one Spark task per (store, changelog partition).

The public face of :mod:`statestore.restore.spark`, where the code and its
documentation live. Importing it does not import pyspark.
"""

from statestore.restore.spark import (
    DEFAULT_EXECUTOR_TIMEOUT,
    INLINE_ROWS_MAX,
    LOCAL_DRIVER_JAVA_OPTIONS,
    MASTER_CONNECT_TIMEOUT,
    check_master,
    restore_on_spark,
    result_schema,
    rows_frame,
    spark_session,
)

__all__ = [
    "DEFAULT_EXECUTOR_TIMEOUT",
    "INLINE_ROWS_MAX",
    "LOCAL_DRIVER_JAVA_OPTIONS",
    "MASTER_CONNECT_TIMEOUT",
    "check_master",
    "restore_on_spark",
    "result_schema",
    "rows_frame",
    "spark_session",
]
