"""Changelogs: the logs every store write goes to and every restore reads from.

* :mod:`statestore.changelog.protocol` -- what any changelog offers the rest of
  the library (:class:`~statestore.changelog.protocol.Changelog`, its producer).
* :mod:`statestore.changelog.segment_log` -- the changelog on local segment
  files, in Kafka's record batch format (the Rust ``log`` module underneath).
* :mod:`statestore.changelog.kafka` -- the changelog on a Kafka cluster.
"""
