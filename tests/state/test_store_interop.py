"""Stores written from Rust read in rocksdict (raw mode) and the other way round."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from rocksdict import Options, Rdict, WriteBatch

from statestore import StoreError
from statestore._native import _testing
from support.model import store_contents


def _open_rocksdict(path: Path, create: bool = False) -> Rdict:
    opts = Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.create_missing_column_families(True)
    return Rdict(str(path), opts, column_families={"offsets": Options(raw_mode=True)})


def test_rust_written_store_reads_in_rocksdict(tmp_path: Path) -> None:
    path = tmp_path / "store"
    items = [(b"k%03d" % i, b"v%03d" % i) for i in range(100)]
    _testing.store_write_batch(str(path), items, {"app-counts-changelog-3": 99}, 1)
    # a second batch with a tombstone and an overwrite
    _testing.store_write_batch(
        str(path), [(b"k000", None), (b"k001", b"new")], {"app-counts-changelog-3": 101}
    )

    db = _open_rocksdict(path)
    try:
        assert set(Rdict.list_cf(str(path))) == {"default", "offsets"}
        data = dict(db.items())
        assert b"k000" not in data
        assert data[b"k001"] == b"new"
        assert data[b"k050"] == b"v050"
        assert len(data) == 99
        offsets_cf = db.get_column_family("offsets")
        assert offsets_cf[b"app-counts-changelog-3"] == struct.pack(">q", 101)
        assert offsets_cf[b"status"] == struct.pack(">q", 1)
        del offsets_cf
    finally:
        db.close()


def test_rocksdict_written_store_reads_from_rust(tmp_path: Path) -> None:
    path = tmp_path / "store"
    db = _open_rocksdict(path, create=True)
    wb = WriteBatch(raw_mode=True)
    for i in range(50):
        wb.put(b"key-%02d" % i, b"\x00value\xff" * i)
    offsets = db.get_column_family_handle("offsets")
    wb.put(b"app-s-changelog-0", struct.pack(">q", 49), offsets)
    wb.put(b"status", struct.pack(">q", 0), offsets)
    db.write(wb)
    del offsets
    db.close()

    contents = store_contents(path)
    assert contents.entries == sorted((b"key-%02d" % i, b"\x00value\xff" * i) for i in range(50))
    assert contents.offsets == {"app-s-changelog-0": 49}
    assert contents.status == 0


def test_dump_of_missing_store_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=str(tmp_path / "nope")):
        store_contents(tmp_path / "nope")


def test_bad_offset_value_names_store_and_key(tmp_path: Path) -> None:
    path = tmp_path / "store"
    db = _open_rocksdict(path, create=True)
    wb = WriteBatch(raw_mode=True)
    h = db.get_column_family_handle("offsets")
    wb.put(b"t-0", b"\x01\x02", h)
    db.write(wb)
    del h
    db.close()
    with pytest.raises(StoreError, match=r"t-0.*2 bytes"):
        store_contents(path)


def _options_version(store: Path) -> tuple[int, ...]:
    options = sorted(store.glob("OPTIONS-*"))[-1].read_text()
    line = next(x for x in options.splitlines() if x.strip().startswith("rocksdb_version="))
    return tuple(int(p) for p in line.split("=", 1)[1].strip().split("."))


def test_rust_side_bundles_the_rocksdb_major_of_rocksdict(tmp_path: Path) -> None:
    """Stores written from Rust must stay readable by rocksdict's RocksDB (9.8.4): same major, close minor."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    _testing.store_write_batch(str(ours), [(b"k", b"v")], {})
    _open_rocksdict(theirs, create=True).close()
    assert _options_version(ours)[0] == _options_version(theirs)[0] == 9
    assert _options_version(ours) >= _options_version(theirs)
