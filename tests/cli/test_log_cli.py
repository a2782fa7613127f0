"""``statestore log dump``: batches like kafka-dump-log, records on request."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from statestore import SegmentLog
from statestore.cli import main


def make_log(d: Path) -> None:
    log = SegmentLog(d)
    a = log.producer("writer-a")
    a.begin()
    a.send("dump-t", 0, b"kept-key", b"kept-value")
    a.commit()
    a.begin()
    a.send("dump-t", 0, b"gone-key", b"aborted-value")
    a.abort()
    log.producer().send("dump-t", 1, None, b"\xff\x00binary")
    log.close()


def test_dump_prints_batches_and_offsets(tmp_path: Path) -> None:
    make_log(tmp_path)
    res = CliRunner().invoke(main, ["log", "dump", str(tmp_path), "--partition", "dump-t-0"])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "dump-t-0: 4 batches" in out
    assert "COMMIT" in out and "ABORT" in out and "aborted" in out and "committed" in out
    assert "start offset 0, end offset 4, last stable offset 4" in out
    assert "kept-value" not in out, "records only with --records"


def test_dump_records_follow_the_isolation_level(tmp_path: Path) -> None:
    make_log(tmp_path)
    committed = CliRunner().invoke(main, ["log", "dump", str(tmp_path), "--records"])
    assert committed.exit_code == 0, committed.output
    assert "kept-value" in committed.output and "aborted-value" not in committed.output
    assert "dump-t-1" in committed.output and "0xff0062696e617279" in committed.output
    everything = CliRunner().invoke(
        main,
        [
            "log",
            "dump",
            str(tmp_path),
            "--partition",
            "dump-t-0",
            "--records",
            "--isolation",
            "read_uncommitted",
        ],
    )
    assert everything.exit_code == 0, everything.output
    assert "kept-value" in everything.output and "aborted-value" in everything.output


def test_dump_reports_corruption_in_one_line(tmp_path: Path) -> None:
    make_log(tmp_path)
    seg = tmp_path / "dump-t-0" / f"{0:020d}.log"
    data = bytearray(seg.read_bytes())
    data[16] = 7  # magic of the first batch
    seg.write_bytes(bytes(data))
    res = CliRunner().invoke(main, ["log", "dump", str(tmp_path), "--partition", "dump-t-0"])
    assert res.exit_code == 1
    assert "error: corrupt log segment" in res.output and str(seg) in res.output and "at byte 0" in res.output


def test_dump_bad_partition_name_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["log", "dump", str(tmp_path), "--partition", "no_partition"])
    assert res.exit_code == 2
    assert "--partition" in res.output
