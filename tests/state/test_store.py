"""Store: staged writes, one-batch commits with offsets, status marker, byte compatibility with Rust."""

from __future__ import annotations

from pathlib import Path

import pytest
from rocksdict import Options, Rdict, WriteBatch

from statestore import IllegalStateError, StoreError, TopicPartition
from statestore._native import _testing
from statestore.state.store import (
    OFFSETS_CF,
    STATUS_CLOSED,
    STATUS_OPEN,
    InMemoryStore,
    Store,
    decode_i64,
    encode_i64,
)
from support.model import store_contents

TP = TopicPartition("app-s-changelog", 3)


def dump(path: Path) -> tuple[list[tuple[bytes, bytes]], dict[str, int], int | None]:
    """Read a closed store with the Rust data plane: (entries, offsets, status)."""
    contents = store_contents(path)
    return contents.entries, contents.offsets, contents.status


def test_encoding_is_8_byte_big_endian_signed() -> None:
    assert encode_i64(1) == b"\x00" * 7 + b"\x01"
    assert encode_i64(-4) == b"\xff" * 7 + b"\xfc"
    assert decode_i64(encode_i64(2**63 - 1), what="x", path=Path(".")) == 2**63 - 1
    with pytest.raises(StoreError, match="3 bytes, expected 8"):
        decode_i64(b"abc", what="offset of t-0", path=Path("/s"))


def test_staged_writes_are_visible_but_reach_rocksdb_only_at_commit(tmp_path: Path) -> None:
    p = tmp_path / "s"
    s = Store(p)
    s.put(b"a", b"1")
    s.put(b"b", b"2")
    assert s.get(b"a") == b"1"
    assert s.uncommitted == 2
    assert s.is_empty()  # nothing committed yet
    s.commit({TP: 7})
    assert s.uncommitted == 0 and not s.is_empty()
    s.put(b"c", b"3")  # staged, never committed
    s.delete(b"a")
    assert s.get(b"a") is None and s.get(b"c") == b"3"
    s.close(clean=False)
    entries, offsets, status = dump(p)
    assert entries == [(b"a", b"1"), (b"b", b"2")]
    assert offsets == {str(TP): 7}
    assert status == STATUS_OPEN  # a dirty close looks like a crash


def test_commit_puts_data_and_offsets_in_one_batch_readable_by_rust(tmp_path: Path) -> None:
    p = tmp_path / "s"
    with Store(p) as s:
        assert s.previous_status is None
        s.put(b"k1", b"v1")
        s.put(b"k2", b"v2")
        s.commit({TP: 41, TopicPartition("other-topic", 0): 5})
        s.delete(b"k1")
        s.commit({TP: 42})
        assert s.offsets() == {TP: 42, TopicPartition("other-topic", 0): 5}
        assert s.offset(TP) == 42
        assert s.offset(TopicPartition("nope", 0)) is None
        assert s.status() == STATUS_OPEN
    entries, offsets, status = dump(p)
    assert entries == [(b"k2", b"v2")]
    assert offsets == {"app-s-changelog-3": 42, "other-topic-0": 5}
    assert status == STATUS_CLOSED
    # and the exact bytes, read without either of our layers
    db = Rdict(str(p), Options(raw_mode=True), column_families={OFFSETS_CF: Options(raw_mode=True)})
    try:
        cf = db.get_column_family(OFFSETS_CF)
        assert cf.get(b"app-s-changelog-3") == b"\x00\x00\x00\x00\x00\x00\x00\x2a"
        assert cf.get(b"status") == b"\x00" * 8
        del cf
    finally:
        db.close()


def test_opens_a_store_written_by_rust(tmp_path: Path) -> None:
    p = tmp_path / "s"
    _testing.store_write_batch(str(p), [(b"x", b"1"), (b"y", b"2"), (b"x", None)], {str(TP): 99}, STATUS_OPEN)
    with Store(p) as s:
        assert s.previous_status == STATUS_OPEN  # Rust left it "open": e.g. a crash mid-restore
        assert s.offsets() == {TP: 99}
        assert list(s) == [(b"y", b"2")]
    assert dump(p)[2] == STATUS_CLOSED
    with Store(p) as s:
        assert s.previous_status == STATUS_CLOSED


def test_range_merges_staged_and_committed_in_key_order(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as s:
        for k in (b"b", b"d", b"f", b"h"):
            s.put(k, k.upper())
        s.commit()
        s.put(b"a", b"a!")
        s.put(b"d", b"d!")  # overrides committed
        s.delete(b"f")  # hides committed
        s.put(b"g", b"g!")
        s.delete(b"zz")  # delete of a missing key
        assert list(s.range()) == [(b"a", b"a!"), (b"b", b"B"), (b"d", b"d!"), (b"g", b"g!"), (b"h", b"H")]
        assert list(s.range(b"b", b"g")) == [(b"b", b"B"), (b"d", b"d!")]
        assert list(s.range(start=b"c")) == [(b"d", b"d!"), (b"g", b"g!"), (b"h", b"H")]
        assert list(s.range(end=b"b")) == [(b"a", b"a!")]
        assert list(s.range(b"x", b"y")) == []
        assert [k for k, _ in s] == [b"a", b"b", b"d", b"g", b"h"]
        s.abort()
        assert [k for k, _ in s] == [b"b", b"d", b"f", b"h"]
        s.commit()


def test_approximate_num_entries(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as s:
        assert s.approximate_num_entries() == 0
        for i in range(100):
            s.put(b"%03d" % i, b"v")
        assert s.approximate_num_entries() == 100
        s.commit()
        s.flush()
        assert 50 <= s.approximate_num_entries() <= 200


def test_status_marks_clean_and_unclean_shutdown(tmp_path: Path) -> None:
    p = tmp_path / "s"
    Store(p).close()
    with Store(p) as s:
        assert s.previous_status == STATUS_CLOSED
        s.put(b"a", b"1")
        s.commit({TP: 1})
    s = Store(p)
    s.close(clean=False)
    with Store(p) as s:
        assert s.previous_status == STATUS_OPEN
        assert s.offsets() == {TP: 1}


def test_reopen_right_after_close_releases_rocksdb_lock(tmp_path: Path) -> None:
    """rocksdict keeps the DB LOCK while column-family handles live; close() must drop them."""
    p = tmp_path / "s"
    for i in range(5):
        s = Store(p)
        s.put(b"k", str(i).encode())
        s.commit({TP: i})
        assert s.offsets() == {TP: i}
        s.close(clean=i % 2 == 0)
    assert dump(p)[1] == {str(TP): 4}


def test_second_open_of_an_open_store_fails_naming_the_path(tmp_path: Path) -> None:
    p = tmp_path / "s"
    with Store(p, name="s", task_id=None):
        with pytest.raises(StoreError, match=str(p)):
            Store(p)


def test_store_is_never_created_in_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="parent directory does not exist"):
        Store(tmp_path / "gone" / "rocksdb" / "s")
    assert not (tmp_path / "gone").exists()


def test_negative_offset_is_refused_and_nothing_written(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as s:
        s.put(b"a", b"1")
        with pytest.raises(ValueError, match="negative offset -1"):
            s.commit({TP: -1})
        assert s.is_empty() and s.uncommitted == 1
        s.abort()


def test_damaged_offset_value_is_an_error_naming_the_key(tmp_path: Path) -> None:
    p = tmp_path / "s"
    Store(p).close()
    db = Rdict(str(p), Options(raw_mode=True), column_families={OFFSETS_CF: Options(raw_mode=True)})
    wb = WriteBatch(raw_mode=True)
    wb.put(b"t-0", b"xyz", db.get_column_family_handle(OFFSETS_CF))
    db.write(wb)
    db.close()
    del db, wb
    with Store(p) as s:
        with pytest.raises(StoreError, match="offset of t-0 is 3 bytes"):
            s.offsets()


def test_closed_store_refuses_use(tmp_path: Path) -> None:
    s = Store(tmp_path / "s")
    s.close()
    s.close()  # idempotent
    assert s.closed
    for call in (lambda: s.get(b"a"), lambda: s.put(b"a", b"b"), lambda: s.commit(), lambda: s.offsets()):
        with pytest.raises(IllegalStateError, match="closed"):
            call()


def test_keys_and_values_must_be_bytes(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as s:
        with pytest.raises(TypeError):
            s.put("a", b"1")  # type: ignore[arg-type]
        s.put(bytearray(b"a"), memoryview(b"1"))  # type: ignore[arg-type]
        assert s.get(b"a") == b"1"
        s.abort()


def test_in_memory_store_has_the_same_processing_api() -> None:
    m = InMemoryStore("mem")
    m.put(b"b", b"2")
    m.put(b"a", b"1")
    assert list(m) == [(b"a", b"1"), (b"b", b"2")]
    m.commit({TP: 5})
    m.delete(b"a")
    m.put(b"c", b"3")
    assert list(m.range(b"a", b"c")) == [(b"b", b"2")]
    m.abort()
    assert list(m) == [(b"a", b"1"), (b"b", b"2")]
    m.delete(b"a")
    m.commit()
    assert list(m) == [(b"b", b"2")] and m.approximate_num_entries() == 1
    m.close()
    with pytest.raises(IllegalStateError):
        m.put(b"x", b"y")


def test_a_marker_that_cannot_be_read_is_a_store_error_naming_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker a restore job leaves beside a store it creates says whether the store's files
    were made durable; an I/O error reading it (found by the injected-fault runs) must be an error
    of statestore naming the store -- the task manager then wipes and restores the task -- never a
    bare OSError that stops the application."""
    from statestore.state import store as store_module

    def unreadable(path: object) -> None:
        raise OSError(5, "Input/output error", f"{tmp_path}/.s.unsynced")

    monkeypatch.setattr(store_module._native, "unsynced_marker", unreadable)
    with pytest.raises(StoreError, match=r"cannot tell whether .* was made durable") as failed:
        Store(tmp_path / "s")
    assert failed.value.path == str(tmp_path / "s") and isinstance(failed.value.__cause__, OSError)
    assert not (tmp_path / "s").exists(), "nothing opened or created"
