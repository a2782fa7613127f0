"""Type stubs of ``statestore._native._testing``: what tests and benchmarks call and users should not.

One batch encoded or decoded by hand, a store written raw, the write ceilings of replay and of
bulk's table building, synthetic changelogs for the benchmarks at scale (``rust/src/py/testing/``).
Not part of the API.
"""

from collections.abc import Mapping, Sequence

from statestore._native import KafkaClient, _Path, _RecordRow, _TopicPartition

def decode_batch(data: bytes) -> tuple[dict[str, object], list[_RecordRow]]: ...
def encode_batch(
    base_offset: int,
    records: Sequence[tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    compression: str = "none",
    control: str | None = None,
) -> bytes: ...
def restore_write_ceiling(
    store_path: _Path, log_dir: _Path, tp: _TopicPartition, end_offset: int | None = None
) -> tuple[float, int]: ...
def sst_write_ceiling(
    dir: _Path, records: int, value_size: int = 100, threads: int = 1, seed: int = 1
) -> tuple[float, int]: ...
def write_synthetic_changelog(
    log_dir: _Path, topic: str, partition: int, records: int, keys: int, value_size: int = 100, seed: int = 1
) -> int: ...
def produce_synthetic_changelog(
    client: KafkaClient,
    topic: str,
    partition: int,
    records: int,
    keys: int,
    value_size: int = 100,
    seed: int = 1,
    acks: int = -1,
) -> int: ...
def store_write_batch(
    path: _Path,
    items: Sequence[tuple[bytes, bytes | None]],
    offsets: Mapping[str, int],
    status: int | None = None,
    format: str | None = None,
) -> None: ...

__all__ = [
    "decode_batch",
    "encode_batch",
    "produce_synthetic_changelog",
    "restore_write_ceiling",
    "sst_write_ceiling",
    "store_write_batch",
    "write_synthetic_changelog",
]
