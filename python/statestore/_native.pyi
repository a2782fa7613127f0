"""Type stubs of the Rust extension ``statestore._native``."""

from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Literal

_Path = str | PathLike[str]

def atomic_write(path: _Path, data: bytes) -> None: ...
def fsync_dir(path: _Path) -> None: ...
def replace_dir(staged: _Path, target: _Path, aside: _Path) -> Literal["renamed", "exchanged", "moved_aside"]: ...
def link_copy_dir(src: _Path, dst: _Path) -> None: ...
def store_write_batch(
    path: _Path,
    items: Sequence[tuple[bytes, bytes | None]],
    offsets: Mapping[str, int],
    status: int | None = None,
    format: str | None = None,
) -> None: ...
def store_format(path: _Path) -> str | None: ...
def store_dump(path: _Path) -> tuple[list[tuple[bytes, bytes]], dict[str, int], int | None]: ...

# restore engine (statestore.restore): outcome tuple = (mode, start_offset,
# end_offset, records_applied, skipped_aborted, skipped_control,
# skipped_null_key, bytes_read, seconds, offset)
_Outcome = tuple[str, int, int, int, int, int, int, int, float, int | None]

def restore_store(
    store_path: _Path,
    log: _Path | object,
    tp: tuple[str, int],
    end_offset: int | None = None,
    mode: str = "auto",
    memory_budget_bytes: int = ...,
    listener: object | None = None,
    progress_interval: float = 0.1,
    write_buffer_bytes: int = ...,
    chunk_bytes: int = ...,
    read_ahead: bool = True,
    format: str = "plain",
) -> _Outcome: ...
def restore_many(
    specs: Sequence[tuple[_Path, _Path | object, tuple[str, int], int | None, str, int, object | None, float, str]],
    threads: int,
) -> list[tuple[_Outcome | None, Exception | None]]: ...
def restore_write_ceiling(
    store_path: _Path, log_dir: _Path, tp: tuple[str, int], end_offset: int | None = None
) -> tuple[float, int]: ...
def store_info(path: _Path, check_blocks: bool = ...) -> tuple[dict[str, int], int | None, int]: ...
def store_compare(
    expected: _Path, actual: _Path
) -> tuple[str, str, int, int, tuple[bytes, bytes | None, bytes | None] | None]: ...

class KafkaClient:
    """The native Kafka fetcher of a cluster (``rust/src/py/kafka.rs``)."""

    def __init__(self, config: dict[str, str], request_timeout: float = ..., stall_timeout: float = ...) -> None: ...
    @staticmethod
    def unsupported(config: dict[str, str]) -> str | None: ...
    @property
    def bootstrap_servers(self) -> str: ...
    def offsets(self, topic: str, partition: int) -> tuple[int, int, int]: ...
    def reader(self, topic: str, partition: int, start: int) -> KafkaReaderCore: ...

class KafkaReaderCore:
    @property
    def position(self) -> int: ...
    @property
    def skipped(self) -> tuple[int, int]: ...
    def poll(
        self, end: int, max_bytes: int
    ) -> list[tuple[int, bytes | None, bytes | None, int, tuple[tuple[str, bytes | None], ...]]]: ...
