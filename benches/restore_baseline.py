"""The pure-Python restore the Rust engine is measured against (benchmark (a)).

It does what a Python stream processor without statestore would do to restore a
store from the same segment files: decode every record batch with
kafka-python's decoder (CRC checked, as a consumer does by default), skip
control batches, and write RocksDB through rocksdict in raw mode, one
``WriteBatch`` of 10,000 records with the WAL off, the offset of the last record
in the same batch, then flush. The benchmark changelogs hold no aborted
transactions, so no aborted-transaction filtering is needed here.
"""

from __future__ import annotations

import struct
from pathlib import Path

from kafka.record import MemoryRecords
from rocksdict import Options, Rdict, WriteBatch, WriteOptions

BATCH_RECORDS = 10_000


def restore_python(log_dir: Path, topic: str, partition: int, store_path: Path) -> int:
    """Restore partition ``topic``/``partition`` of the segment log into a new store; returns records applied."""
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_atomic_flush(True)
    db = Rdict(str(store_path), opts, column_families={"offsets": Options(raw_mode=True)})
    offsets = db.get_column_family_handle("offsets")
    wo = WriteOptions()
    wo.disable_wal = True
    tp_key = f"{topic}-{partition}".encode()
    wb = WriteBatch(raw_mode=True)
    in_batch = applied = 0
    last = -1
    for seg in sorted((log_dir / f"{topic}-{partition}").glob("*.log")):
        records = MemoryRecords(seg.read_bytes())
        while records.has_next():
            batch = records.next_batch()
            if batch is None:
                break
            if not batch.validate_crc():
                raise ValueError(f"bad CRC in {seg} at offset {batch.base_offset}")
            if batch.is_control_batch:
                continue
            for rec in batch:
                last = rec.offset
                if rec.key is None:
                    continue
                if rec.value is None:
                    wb.delete(rec.key)
                else:
                    wb.put(rec.key, rec.value)
                in_batch += 1
                if in_batch == BATCH_RECORDS:
                    wb.put(tp_key, struct.pack(">q", last), offsets)
                    db.write(wb, wo)
                    applied += in_batch
                    wb = WriteBatch(raw_mode=True)
                    in_batch = 0
    if in_batch:
        wb.put(tp_key, struct.pack(">q", last), offsets)
        db.write(wb, wo)
        applied += in_batch
    db.flush()
    del offsets
    db.close()
    return applied
