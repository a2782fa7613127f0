"""Restoration: rebuilding stores from their changelogs, in-process or on Spark.

* :mod:`~statestore.restore.engine` -- ``restore_store`` / ``restore_many``
  over the Rust restore engine (replay or bulk, GIL released).
* :mod:`~statestore.restore.work` -- one row per (store, partition) restored,
  the same for every engine.
* :mod:`~statestore.restore.planning` -- which partitions of which changelogs
  a job restores.
* :mod:`~statestore.restore.staging` -- a restore into a staging directory,
  moved into place whole (what a Spark executor runs).
* :mod:`~statestore.restore.spark` -- one Spark task per partition.
* :mod:`~statestore.restore.topic_ids` -- the Kafka topic id a store's records
  were read under, kept beside it, so a recreated topic is never read on.
"""
