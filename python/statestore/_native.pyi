"""Type stubs of the Rust extension ``statestore._native``."""

from collections.abc import Mapping, Sequence
from os import PathLike

_Path = str | PathLike[str]

def atomic_write(path: _Path, data: bytes) -> None: ...
def store_write_batch(
    path: _Path, items: Sequence[tuple[bytes, bytes | None]], offsets: Mapping[str, int], status: int | None = None
) -> None: ...
def store_dump(path: _Path) -> tuple[list[tuple[bytes, bytes]], dict[str, int], int | None]: ...
