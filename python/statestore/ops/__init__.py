"""Operations: looking at state from outside while it restores or runs.

* :mod:`~statestore.ops.metrics` -- restore and task metrics, published to a
  file a second process can read.
* :mod:`~statestore.ops.exporter` -- those metrics for Prometheus.
* :mod:`~statestore.ops.inspection` -- what a state directory holds, store by
  store, without opening anything for writing.
* :mod:`~statestore.ops.verify` -- whether every store equals its changelog.
"""
