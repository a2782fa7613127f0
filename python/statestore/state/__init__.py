"""Local state: where stores live, who may touch them, and what they record.

* :mod:`~statestore.state.directory` -- the state directory's layout, its
  process and task locks, the cleaner.
* :mod:`~statestore.state.store` -- one RocksDB store with its offsets and
  open/closed status.
* :mod:`~statestore.state.checkpoint` -- Kafka Streams' ``.checkpoint`` file.
* :mod:`~statestore.state.policy` -- the offsets policy (exactly_once_v2 /
  at_least_once) as one table of decisions.
* :mod:`~statestore.state.state_manager` -- the stores of one task, opened,
  committed, closed and wiped by the policy.
* :mod:`~statestore.state.lag` -- how far a store is behind its changelog.
"""
