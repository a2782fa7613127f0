"""Short fuzz runs of the Python parsers of on-disk bytes (the long runs are `make fuzz`).

The targets live in ``fuzz/python/statestore_fuzz.py`` (shared with the
atheris runner): any input either parses to a valid value or raises the
documented ``StateStoreError`` naming the file, never another exception.
Here hypothesis drives them with raw bytes and with near-valid text, and the
committed seed corpus and past crashes are replayed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statestore import OffsetCheckpoint, StoreError, TaskId, TopicPartition
from statestore.state.directory import (
    PROCESS_FILE_NAME,
    StateDirectory,
    describe_lock_holder,
    parse_process_file,
)
from statestore.state.store import decode_offset_entry
from support import ROOT, load_module

statestore_fuzz = load_module(ROOT / "fuzz" / "python" / "statestore_fuzz.py", "statestore_fuzz")


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Near-valid checkpoint text: the right shape with hostile fields.
_field = st.one_of(
    st.from_regex(r"[+-]?[0-9]{1,25}", fullmatch=True),
    st.text(alphabet="0123456789-+ \t\r\n\x0b\x1c\u00a0\u2028x", max_size=12),
    st.just("9" * 5000),
)
_line = st.builds(lambda t, p, o: f"{t} {p} {o}", st.text(min_size=0, max_size=8), _field, _field)
_checkpoint_text = st.builds(
    lambda v, n, lines, end: f"{v}\n{n}\n" + "\n".join(lines) + end,
    st.sampled_from(["0", "00", "+0", "1", "-0", ""]),
    _field,
    st.lists(_line, max_size=5),
    st.sampled_from(["", "\n", "\r\n", "\r"]),
)


@FUZZ
@given(st.binary(max_size=300))
def test_checkpoint_bytes(data: bytes) -> None:
    statestore_fuzz.checkpoint(data)


@FUZZ
@given(_checkpoint_text)
def test_checkpoint_near_valid_text(text: str) -> None:
    statestore_fuzz.checkpoint(text.encode("utf-8"))


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=40),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.sampled_from(["processId", "pid", "host", "x"]), inner)
            ),
            max_leaves=10,
        ).map(lambda doc: __import__("json").dumps(doc).encode()),
    )
)
def test_process_metadata(data: bytes) -> None:
    statestore_fuzz.process_metadata(data)


@FUZZ
@given(st.binary(max_size=64))
def test_offsets_entry_bytes(data: bytes) -> None:
    statestore_fuzz.offsets_entry(data)


@FUZZ
@given(st.text(alphabet="t-0123456789²٣\n ", max_size=14), st.binary(min_size=7, max_size=9))
def test_offsets_entry_near_valid(key: str, value: bytes) -> None:
    k = key.encode()[:255]
    statestore_fuzz.offsets_entry(bytes([len(k)]) + k + value)


@FUZZ
@given(st.text(alphabet="0123456789_\n x٣", max_size=24))
def test_task_dir_name(name: str) -> None:
    statestore_fuzz.task_dir_name(name.encode())


def _corpus() -> list[tuple[str, Path]]:
    out = []
    for target in statestore_fuzz.TARGETS:
        d = ROOT / "fuzz" / "corpus" / f"py_{target}"
        out += [(target, p) for p in sorted(d.glob("*"))] if d.is_dir() else []
    return out


@pytest.mark.parametrize(("target", "path"), _corpus(), ids=lambda x: x.name if isinstance(x, Path) else x)
def test_corpus_replays(target: str, path: Path) -> None:
    statestore_fuzz.TARGETS[target](path.read_bytes())


def test_corpus_is_present() -> None:
    assert {t for t, _ in _corpus()} == set(statestore_fuzz.TARGETS)


# -- inputs that broke a parser before it was fixed ---------------------------------------------


def test_checkpoint_with_more_digits_than_int_accepts_is_a_checkpoint_error(tmp_path: Path) -> None:
    # int() refuses digit strings beyond sys.get_int_max_str_digits() (4300) with a bare ValueError.
    path = tmp_path / ".checkpoint"
    path.write_text("0\n1\nt 0 " + "1" * 5000 + "\n")
    with pytest.raises(Exception) as e:
        OffsetCheckpoint(path).read()
    assert type(e.value).__name__ == "CheckpointError" and str(path) in str(e.value)
    assert "out of range" in str(e.value) and len(str(e.value)) < 400
    # leading zeros are still fine, however many (Java's parseLong accepts them)
    path.write_text("0\n1\nt 0 " + "0" * 5000 + "7\n")
    assert OffsetCheckpoint(path).read() == {TopicPartition("t", 0): 7}


def test_deeply_nested_process_metadata_is_replaced_by_a_new_id(tmp_path: Path) -> None:
    # json.loads raised RecursionError (not ValueError), so opening the directory failed.
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / PROCESS_FILE_NAME).write_bytes(b"[" * 100_000)
    with StateDirectory(tmp_path, "app") as sd:
        assert parse_process_file((tmp_path / "app" / PROCESS_FILE_NAME).read_bytes()) == sd.process_id
    with pytest.raises(ValueError):
        parse_process_file(b"[" * 100_000)
    assert describe_lock_holder(b"[" * 4096).startswith("another process")


def test_task_id_with_trailing_newline_is_not_a_task() -> None:
    with pytest.raises(ValueError):
        TaskId.parse("0_1\n")
    with pytest.raises(ValueError):
        TaskId.parse("0_99999999999")


@pytest.mark.parametrize("key", [b"t-007", b"t-\xd9\xa3", b"t-99999999999", b"t-+1"])
def test_offsets_key_not_written_by_statestore_is_a_store_error(key: bytes, tmp_path: Path) -> None:
    # "t-٣" used to decode as partition 3 and "t-007" as 7: an offset for a key nobody wrote.
    with pytest.raises(StoreError, match="is not '<topic>-<partition>'"):
        decode_offset_entry(key, (5).to_bytes(8, "big"), path=tmp_path, who="test")
