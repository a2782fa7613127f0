use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::writer::WriterConfig;
use super::Log;
use super::*;
use crate::codec::{self, Compression};
use crate::source::ChangelogSource;

fn cfg(segment_bytes: u64) -> WriterConfig {
    WriterConfig { segment_bytes, sync: false, ..Default::default() }
}

type Rec = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

fn drain(src: &mut dyn ChangelogSource, end: i64) -> Vec<Rec> {
    let mut out = Vec::new();
    loop {
        let more = src
            .next_chunk(end, 1000, &mut |r| {
                out.push((r.offset, r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec)))
            })
            .unwrap();
        if !more {
            break;
        }
    }
    out
}

#[test]
fn plain_records_round_trip_across_segments() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(2000)).unwrap());
    let mut p = log.producer(None).unwrap();
    for i in 0..500i64 {
        let off = p.send("t", 0, Some(format!("k{i}").as_bytes()), Some(&[i as u8; 40]), &[], None).unwrap();
        assert_eq!(off, i);
        if i % 7 == 0 {
            p.flush().unwrap();
        }
    }
    p.flush().unwrap();
    let segs = segment::list_segments(&d.path().join("t-0")).unwrap();
    assert!(segs.len() > 5, "rolled: {}", segs.len());
    let o = partition_offsets(d.path(), "t", 0).unwrap();
    assert_eq!(o, Bounds { start: 0, end: 500, last_stable: 500 });
    for start in [0, 1, 77, 250, 499, 500] {
        let mut src = open_committed_source(d.path(), "t", 0, start).unwrap();
        let got = drain(src.as_mut(), o.end);
        assert_eq!(got.len() as i64, 500 - start, "start {start}");
        assert!(got.iter().enumerate().all(|(i, r)| r.0 == start + i as i64));
        assert_eq!(src.position(), 500);
    }
    // Bounded end: stops mid-batch, position == end, then continues.
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    assert_eq!(drain(src.as_mut(), 123).len(), 123);
    assert_eq!(src.position(), 123);
    assert_eq!(drain(src.as_mut(), 500).first().unwrap().0, 123);
}

#[test]
fn transactions_commit_abort_and_lso() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    let mut a = log.producer(Some("a")).unwrap();
    let mut b = log.producer(Some("b")).unwrap();
    a.begin().unwrap();
    b.begin().unwrap();
    a.send("t", 0, Some(b"a1"), Some(b"1"), &[], None).unwrap(); // 0
    b.send("t", 0, Some(b"b1"), Some(b"1"), &[], None).unwrap(); // 1
    a.send("t", 0, Some(b"a2"), None, &[], None).unwrap(); // 2
    b.abort().unwrap(); // marker 3
    a.commit().unwrap(); // marker 4
    b.begin().unwrap();
    b.send("t", 0, Some(b"b2"), Some(b"2"), &[], None).unwrap(); // 5
    b.flush().unwrap();
    let o = partition_offsets(d.path(), "t", 0).unwrap();
    assert_eq!(o, Bounds { start: 0, end: 6, last_stable: 5 });
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    let got = drain(src.as_mut(), o.last_stable);
    let offs: Vec<i64> = got.iter().map(|r| r.0).collect();
    assert_eq!(offs, vec![0, 2]);
    assert_eq!(got[1].2, None, "tombstone");
    assert_eq!(src.position(), 5);
    assert_eq!(src.skipped().aborted, 1);
    assert_eq!(src.skipped().control, 2);
    // Even asked past the LSO, the reader stops at the open transaction.
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    assert_eq!(drain(src.as_mut(), 100).len(), 2);
    assert_eq!(src.position(), 5);
    b.commit().unwrap();
    let o = partition_offsets(d.path(), "t", 0).unwrap();
    assert_eq!((o.end, o.last_stable), (7, 7));
    let got = drain(src.as_mut(), 7);
    assert_eq!(got.iter().map(|r| r.0).collect::<Vec<_>>(), vec![5]);
}

#[test]
fn fencing_aborts_the_old_transaction() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    let mut old = log.producer(Some("x")).unwrap();
    old.begin().unwrap();
    old.send("t", 0, Some(b"k"), Some(b"zombie"), &[], None).unwrap();
    old.send("u", 1, Some(b"k"), Some(b"zombie"), &[], None).unwrap();
    let mut new = log.producer(Some("x")).unwrap();
    assert_eq!(new.identity().0, old.identity().0);
    assert_eq!(new.identity().1, old.identity().1 + 1);
    assert!(matches!(old.send("t", 0, None, Some(b"v"), &[], None), Err(LogError { kind: LogErrorKind::Fenced, .. })));
    assert!(matches!(old.commit(), Err(LogError { kind: LogErrorKind::Fenced, .. })));
    for (t, p) in [("t", 0), ("u", 1)] {
        let o = partition_offsets(d.path(), t, p).unwrap();
        assert_eq!((o.end, o.last_stable), (2, 2), "{t}");
        let mut src = open_committed_source(d.path(), t, p, 0).unwrap();
        assert!(drain(src.as_mut(), 2).is_empty());
        assert_eq!(src.position(), 2);
    }
    new.begin().unwrap();
    new.send("t", 0, Some(b"k"), Some(b"ok"), &[], None).unwrap();
    new.commit().unwrap();
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    assert_eq!(drain(src.as_mut(), 4).len(), 1);
}

#[test]
fn expired_transaction_is_aborted() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    let mut p = log.producer(Some("slow")).unwrap();
    p.begin().unwrap();
    p.send("t", 0, None, Some(b"v"), &[], None).unwrap();
    p.flush().unwrap();
    assert_eq!(log.abort_expired_transactions(60_000).unwrap(), Vec::<String>::new());
    assert_eq!(partition_offsets(d.path(), "t", 0).unwrap().last_stable, 0);
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(log.abort_expired_transactions(1).unwrap(), vec!["slow".to_string()]);
    let o = partition_offsets(d.path(), "t", 0).unwrap();
    assert_eq!((o.end, o.last_stable), (2, 2));
    assert!(matches!(p.commit(), Err(LogError { kind: LogErrorKind::Fenced, .. })));
}

#[test]
fn torn_tail_is_truncated_and_corruption_is_reported() {
    let d = tempfile::tempdir().unwrap();
    {
        let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
        let mut p = log.producer(None).unwrap();
        for i in 0..3 {
            p.send("t", 0, None, Some(&[i; 100]), &[], None).unwrap();
            p.flush().unwrap();
        }
        log.close().unwrap();
    }
    let seg = d.path().join("t-0").join(segment::log_file_name(0));
    let full = fs::read(&seg).unwrap();
    let one = full.len() / 3;
    // Torn tail: half of a fourth batch.
    let mut torn = full.clone();
    torn.extend_from_slice(&full[..one / 2]);
    fs::write(&seg, &torn).unwrap();
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    assert_eq!(drain(src.as_mut(), 100).len(), 3, "reader stops at the torn tail");
    {
        let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
        let mut p = log.producer(None).unwrap();
        assert_eq!(p.send("t", 0, None, Some(b"after"), &[], None).unwrap(), 3);
        log.close().unwrap();
    }
    let now = fs::read(&seg).unwrap();
    assert_eq!(&now[..full.len()], &full[..], "tail cut, new batch appended");
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    let got = drain(src.as_mut(), 100);
    assert_eq!(got.len(), 4);
    assert_eq!(got[3].2.as_deref(), Some(&b"after"[..]));
    // A flipped byte in the middle batch.
    let mut bad = fs::read(&seg).unwrap();
    bad[one + 70] ^= 0x10;
    fs::write(&seg, &bad).unwrap();
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    let err = src.next_chunk(100, 1 << 20, &mut |_| {}).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, LogError { kind: LogErrorKind::Corrupt, .. }), "{msg}");
    assert!(
        msg.contains(&seg.display().to_string()) && msg.contains(&format!("at byte {one}")) && msg.contains("offset 1"),
        "{msg}"
    );
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    assert!(matches!(log.writer("t", 0), Err(LogError { kind: LogErrorKind::Corrupt, .. })));
}

#[test]
fn empty_and_missing_partitions() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(partition_offsets(d.path(), "t", 0).unwrap(), Bounds { start: 0, end: 0, last_stable: 0 });
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    assert!(drain(src.as_mut(), 10).is_empty());
    assert!(partition_offsets(&d.path().join("nope"), "t", 0).is_err());
    assert!(partition_offsets(d.path(), "../x", 0).is_err());
}

#[test]
fn partition_starting_at_non_zero_offset() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(500)).unwrap());
    let mut p = log.producer(None).unwrap();
    for i in 0..50 {
        p.send("t", 0, None, Some(&[i; 100]), &[], None).unwrap();
        p.flush().unwrap();
    }
    log.close().unwrap();
    let segs = segment::list_segments(&d.path().join("t-0")).unwrap();
    for s in &segs[..3] {
        fs::remove_file(&s.path).unwrap();
        fs::remove_file(s.index_path()).unwrap();
    }
    let start = segs[3].base;
    assert!(start > 0);
    let o = partition_offsets(d.path(), "t", 0).unwrap();
    assert_eq!((o.start, o.end), (start, 50));
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    let got = drain(src.as_mut(), 50);
    assert_eq!(got.first().unwrap().0, start);
    assert_eq!(got.len() as i64, 50 - start);
}

#[test]
fn second_process_writer_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    log.writer("t", 0).unwrap();
    // Same process: shared. Another open file description: refused.
    let other = super::writer::PartitionWriter::open(&d.path().join("t-0"), cfg(1 << 30));
    let Err(LogError { kind: LogErrorKind::Lock, message: msg, .. }) = other else { panic!("expected a lock error") };
    assert!(msg.contains("t-0") && msg.contains("another process"), "{msg}");
}

#[test]
fn exhausted_epoch_gets_a_new_producer_id_after_aborting() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    let mut p = log.producer(Some("e")).unwrap();
    p.begin().unwrap();
    p.send("t", 0, None, Some(b"v"), &[], None).unwrap();
    p.flush().unwrap();
    let path = d.path().join("transactions.state");
    let text = fs::read_to_string(&path).unwrap();
    let (pid, epoch) = p.identity();
    let text = text.replace(&format!(" {pid} {epoch} ongoing"), &format!(" {pid} {} ongoing", i16::MAX - 1));
    fs::write(&path, text).unwrap();
    let q = log.producer(Some("e")).unwrap();
    assert_ne!(q.identity().0, pid);
    assert_eq!(q.identity().1, 0);
    let o = partition_offsets(d.path(), "t", 0).unwrap();
    assert_eq!((o.end, o.last_stable), (2, 2), "the old transaction was aborted under the old id");
}

#[test]
fn many_small_batches_scan_quickly_and_correctly() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(8 << 10)).unwrap());
    let mut a = log.producer(Some("a")).unwrap();
    let mut b = log.producer(Some("b")).unwrap();
    let mut want = Vec::new();
    for i in 0..300i64 {
        let (p, commit) = if i % 3 == 0 { (&mut b, false) } else { (&mut a, true) };
        p.begin().unwrap();
        let off = p.send("t", 0, None, Some(&i.to_be_bytes()), &[], None).unwrap();
        if commit {
            p.commit().unwrap();
            want.push(off);
        } else {
            p.abort().unwrap();
        }
    }
    let o = partition_offsets(d.path(), "t", 0).unwrap();
    assert_eq!((o.end, o.last_stable), (600, 600));
    assert!(segment::list_segments(&d.path().join("t-0")).unwrap().len() > 1);
    let mut src = open_committed_source(d.path(), "t", 0, 0).unwrap();
    let got: Vec<i64> = drain(src.as_mut(), o.end).into_iter().map(|r| r.0).collect();
    assert_eq!(got, want);
    assert_eq!(src.skipped().aborted, 100);
    assert_eq!(src.skipped().control, 300);
}

#[test]
fn damaged_length_far_from_the_end_is_corruption_not_a_torn_tail() {
    let d = tempfile::tempdir().unwrap();
    {
        let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
        let mut p = log.producer(None).unwrap();
        let v = vec![7u8; 4096];
        for _ in 0..5000 {
            p.send("t", 0, None, Some(&v), &[], None).unwrap();
        }
        log.close().unwrap();
    }
    let seg = d.path().join("t-0").join(segment::log_file_name(0));
    let mut data = fs::read(&seg).unwrap();
    let len = data.len();
    assert!(len as u64 > segment::MAX_TORN_TAIL);
    data[8] = 0x7f; // the first batch now claims ~2 GB
    fs::write(&seg, &data).unwrap();
    let err = match open_committed_source(d.path(), "t", 0, 0) {
        Err(e) => e,
        Ok(mut src) => src.next_chunk(i64::MAX, 1 << 20, &mut |_| {}).unwrap_err(),
    };
    assert!(
        matches!(err, LogError { kind: LogErrorKind::Corrupt, ref message, .. } if message.contains("damaged")),
        "{err}"
    );
    assert!(matches!(partition_offsets(d.path(), "t", 0), Err(LogError { kind: LogErrorKind::Corrupt, .. })));
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    assert!(matches!(log.writer("t", 0), Err(LogError { kind: LogErrorKind::Corrupt, .. })));
    assert_eq!(fs::metadata(&seg).unwrap().len() as usize, len, "nothing was cut off");
}

#[test]
fn damaged_length_near_the_end_is_corruption_when_a_valid_batch_follows() {
    let d = tempfile::tempdir().unwrap();
    {
        let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
        let mut p = log.producer(None).unwrap();
        for i in 0..20u8 {
            p.send("t", 0, Some(&[i]), Some(&[i; 100]), &[], None).unwrap();
            p.flush().unwrap();
        }
        log.close().unwrap();
    }
    let seg = d.path().join("t-0").join(segment::log_file_name(0));
    let mut data = fs::read(&seg).unwrap();
    let len = data.len();
    assert!((len as u64) < segment::MAX_TORN_TAIL);
    data[8..12].copy_from_slice(&i32::MAX.to_be_bytes()); // the first batch claims 2 GB; 19 valid batches follow
    fs::write(&seg, &data).unwrap();
    let err = match open_committed_source(d.path(), "t", 0, 0) {
        Err(e) => e,
        Ok(mut src) => src.next_chunk(i64::MAX, 1 << 20, &mut |_| {}).unwrap_err(),
    };
    assert!(
        matches!(err, LogError { kind: LogErrorKind::Corrupt, ref message, .. } if message.contains("a valid batch follows")),
        "{err}"
    );
    let log = Arc::new(Log::new(d.path(), cfg(1 << 30)).unwrap());
    assert!(
        matches!(log.writer("t", 0), Err(LogError { kind: LogErrorKind::Corrupt, .. })),
        "the writer must not cut committed batches off"
    );
    assert_eq!(fs::metadata(&seg).unwrap().len() as usize, len, "nothing was cut off");
}

#[test]
fn a_segment_at_the_last_offset_refuses_appends_instead_of_overflowing() {
    // Found by the `segment` fuzz target: an empty segment named i64::MAX
    // made the writer's next offset overflow on the first send.
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("t-0");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(segment::log_file_name(i64::MAX)), b"").unwrap();
    let mut w = writer::PartitionWriter::open(&dir, cfg(1 << 20)).unwrap();
    assert_eq!(w.next_offset(), i64::MAX);
    let e = w.send(crate::codec::BatchMeta::default(), 0, Some(b"k"), Some(b"v"), &[]).unwrap_err();
    assert!(e.to_string().contains("no offsets left"), "{e}");
    assert!(w.append_marker(1, 0, true, 0).is_err());
}

#[test]
fn index_entries_past_the_last_offset_are_ignored() {
    let d = tempfile::tempdir().unwrap();
    let seg = segment::Segment { base: i64::MAX - 5, path: d.path().join(segment::log_file_name(i64::MAX - 5)) };
    // relative offsets 1 then 10 (base + 10 overflows): the second entry ends the index
    let mut idx = Vec::new();
    for (rel, pos) in [(1u32, 0u32), (10, 100)] {
        idx.extend_from_slice(&rel.to_be_bytes());
        idx.extend_from_slice(&pos.to_be_bytes());
    }
    fs::write(seg.index_path(), idx).unwrap();
    assert_eq!(segment::read_index(&seg), vec![(i64::MAX - 4, 0)]);
}

/// `n` records of 30-byte values in partition `t-0` under `root`, flushed
/// every `flush_every`, in segments of `segment_bytes`: at least two segments.
fn write_rolled(root: &Path, segment_bytes: u64, n: i64, flush_every: i64) -> (PathBuf, Vec<segment::Segment>) {
    let log = Arc::new(Log::new(root, cfg(segment_bytes)).unwrap());
    let mut p = log.producer(None).unwrap();
    for i in 0..n {
        p.send("t", 0, Some(b"k"), Some(&[i as u8; 30]), &[], None).unwrap();
        if i % flush_every == 0 {
            p.flush().unwrap();
        }
    }
    p.flush().unwrap();
    drop(p);
    log.close().unwrap();
    let dir = root.join("t-0");
    let segs = segment::list_segments(&dir).unwrap();
    assert!(segs.len() >= 2);
    (dir, segs)
}

#[test]
fn an_index_pointing_past_the_end_of_its_segment_skips_nothing() {
    // Found by the `segment` fuzz target: an index entry beyond the end of the
    // file made the cursor's check of the hint step into the next segment,
    // and falling back then started *that* segment: the rest of this one was
    // skipped without an error.
    let d = tempfile::tempdir().unwrap();
    let (_, segs) = write_rolled(d.path(), 3000, 200, 5);
    let mut bad = Vec::new();
    bad.extend_from_slice(&1u32.to_be_bytes());
    bad.extend_from_slice(&(1u32 << 29).to_be_bytes());
    fs::write(segs[0].index_path(), bad).unwrap();
    let start = 3;
    assert!(segs[1].base > start);
    let mut src = open_committed_source(d.path(), "t", 0, start).unwrap();
    let got = drain(src.as_mut(), 200);
    assert_eq!(got.first().map(|r| r.0), Some(start));
    assert_eq!(got.len(), 197);
}

#[test]
fn a_batch_running_into_the_next_segment_is_corrupt_before_any_record_is_handed_out() {
    // Found by the `segment` fuzz target: the base offset is not covered by
    // the CRC, so a damaged one in the last batch of a segment was believed
    // -- its records went out with made-up offsets (and with i64::MAX - 1 the
    // reader stopped there for good, so later appends were never read).
    let d = tempfile::tempdir().unwrap();
    let (dir, segs) = write_rolled(d.path(), 1000, 40, 1);
    // Point the last batch of the first segment at offset 1_000_000.
    let mut bytes = fs::read(&segs[0].path).unwrap();
    let mut pos = 0;
    let mut last = 0;
    while pos < bytes.len() {
        last = pos;
        pos += crate::codec::peek_offset_and_length(&bytes[pos..]).unwrap().1 as usize + crate::codec::LOG_OVERHEAD;
    }
    bytes[last..last + 8].copy_from_slice(&1_000_000i64.to_be_bytes());
    fs::write(&segs[0].path, bytes).unwrap();

    let mut r = PartitionReader::open(&dir, 0, Isolation::ReadUncommitted, 1 << 16).unwrap();
    let mut seen = Vec::new();
    let err = loop {
        match r.read(i64::MAX, 1, |rec| {
            seen.push(rec.offset);
            true
        }) {
            Ok(true) => continue,
            Ok(false) => panic!("read to the end without an error; offsets {seen:?}"),
            Err(e) => break e,
        }
    };
    assert!(err.to_string().contains("runs into the next segment"), "{err}");
    assert!(seen.iter().all(|&o| o < segs[1].base), "made-up offsets handed out: {seen:?}");
    let e = partition_offsets(d.path(), "t", 0).unwrap_err();
    assert!(e.to_string().contains("runs into the next segment"), "{e}");
}

/// Everything `next_records` hands over below `end`, read `max_bytes` at a
/// time, with the number of slices it came in.
fn drain_slices(src: &mut dyn ChangelogSource, end: i64, max_bytes: usize) -> (Vec<Rec>, usize) {
    let (mut out, mut slices) = (Vec::new(), 0);
    while src
        .next_records(end, max_bytes, &mut |slice| {
            assert!(!slice.is_empty(), "an empty slice was handed over");
            slices += 1;
            out.extend(slice.iter().map(|r| (r.offset, r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec))));
        })
        .unwrap()
    {}
    (out, slices)
}

#[test]
fn slices_of_the_segment_reader_hand_over_what_its_records_do() {
    let mut log_bytes = Vec::new();
    for compression in [Compression::None, Compression::Lz4] {
        let d = tempfile::tempdir().unwrap();
        let log = Arc::new(Log::new(d.path(), WriterConfig { segment_bytes: 1500, sync: false, compression }).unwrap());
        let mut plain = log.producer(None).unwrap();
        let mut txn = log.producer(Some("x")).unwrap();
        for round in 0..30i64 {
            for i in 0..7 {
                let v = (i != 3).then(|| format!("v{round}-{i}{}", "x".repeat(100)));
                plain
                    .send("t", 0, Some(format!("k{i}").as_bytes()), v.as_deref().map(str::as_bytes), &[], None)
                    .unwrap();
            }
            plain.flush().unwrap();
            txn.begin().unwrap();
            txn.send("t", 0, Some(format!("t{round}").as_bytes()), Some(b"in a transaction"), &[], None).unwrap();
            if round % 3 == 0 {
                txn.abort().unwrap();
            } else {
                txn.commit().unwrap();
            }
        }
        let o = partition_offsets(d.path(), "t", 0).unwrap();
        let segments = segment::list_segments(&d.path().join("t-0")).unwrap();
        assert!(segments.len() > 2, "{compression:?}");
        log_bytes.push(segments.iter().map(|s| fs::metadata(&s.path).unwrap().len()).sum::<u64>());
        for (start, end) in [(0, o.end), (5, o.end), (0, 100), (37, 151), (o.end, o.end)] {
            for max_bytes in [1, 700, 1 << 20] {
                let mut by_record = open_committed_source(d.path(), "t", 0, start).unwrap();
                let want = drain(by_record.as_mut(), end);
                let mut by_slice = open_committed_source(d.path(), "t", 0, start).unwrap();
                let (got, slices) = drain_slices(by_slice.as_mut(), end, max_bytes);
                let case = format!("{compression:?} {start}..{end} reading {max_bytes}");
                assert_eq!(got, want, "{case}");
                assert!(!want.is_empty() || start == end, "{case}");
                assert!(slices < got.len().max(1) || got.len() <= 1, "one slice a record: {case}");
                if (start, end, max_bytes) == (0, o.end, 1 << 20) {
                    // Each batch's records are borrowed from it, not gathered into a copy.
                    assert!(slices >= 30, "{slices} slices for 30 rounds of batches: {case}");
                }
                assert_eq!(by_slice.position(), by_record.position(), "{case}");
                assert_eq!(by_slice.skipped(), by_record.skipped(), "{case}");
            }
        }
    }
    assert!(log_bytes[1] < log_bytes[0] / 2, "the LZ4 batches are compressed: {log_bytes:?}");
}

#[test]
fn slices_before_a_damaged_batch_are_handed_over_before_its_error() {
    let d = tempfile::tempdir().unwrap();
    {
        let log = Arc::new(Log::new(d.path(), cfg(1 << 20)).unwrap());
        let mut p = log.producer(None).unwrap();
        for i in 0..30 {
            p.send("t", 0, Some(b"k"), Some(&[i as u8; 30]), &[], None).unwrap();
            if i % 10 == 9 {
                p.flush().unwrap();
            }
        }
        log.close().unwrap();
    }
    let dir = d.path().join("t-0");
    let seg = dir.join(segment::log_file_name(0));
    // Flip a byte inside the third batch (offsets 20..30): its CRC fails.
    let mut bytes = fs::read(&seg).unwrap();
    let mut starts = vec![0usize];
    while let Some((_, len)) = crate::codec::peek_offset_and_length(&bytes[*starts.last().unwrap()..]) {
        let next = starts.last().unwrap() + len as usize + crate::codec::LOG_OVERHEAD;
        if next >= bytes.len() {
            break;
        }
        starts.push(next);
    }
    assert_eq!(starts.len(), 3, "three batches of ten");
    bytes[starts[2] + 80] ^= 0x01;
    fs::write(&seg, bytes).unwrap();
    let mut src = CommittedReader::open(&dir, 0).unwrap();
    let mut got = Vec::new();
    let err = loop {
        match src.next_records(i64::MAX, 1 << 20, &mut |s| got.extend(s.iter().map(|r| r.offset))) {
            Ok(true) => continue,
            Ok(false) => panic!("no error; offsets {got:?}"),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, LogError { kind: LogErrorKind::Corrupt, .. }), "{err}");
    assert!(err.to_string().contains("offset 20"), "{err}");
    assert_eq!(got, (0..20).collect::<Vec<i64>>());
    assert_eq!(src.position(), 20);
}

/// A batch with the control and transactional flags and no record, as
/// Kafka's log cleaner leaves one (a marker emptied, kept for its producer).
fn empty_control(base: i64, pid: i64) -> Vec<u8> {
    let meta = codec::BatchMeta { producer_id: pid, transactional: true, control: true, ..Default::default() };
    codec::BatchBuilder::new(base, meta).finish(Compression::None)
}

/// A batch of `n` records from `base` (keys `k<offset>`, `value_len`-byte
/// values), transactional for producer `pid`. Also the reader's tests' batches.
pub(super) fn records(base: i64, n: i64, value_len: usize, pid: Option<i64>) -> Vec<u8> {
    let meta = match pid {
        Some(p) => codec::BatchMeta {
            producer_id: p,
            producer_epoch: 0,
            base_sequence: 0,
            transactional: true,
            ..Default::default()
        },
        None => codec::BatchMeta::default(),
    };
    let mut b = codec::BatchBuilder::new(base, meta);
    let value = vec![b'v'; value_len];
    for o in base..base + n {
        b.append(o, 1000 + o, Some(format!("k{o}").as_bytes()), Some(&value), &[]);
    }
    b.finish(Compression::None)
}

#[test]
fn empty_control_batches_left_by_the_cleaner_are_skipped() {
    // A compacted transactional segment as Kafka's cleaner leaves it: 0..10
    // plain; 10..15 pid 5, aborted at 15; an empty control batch of pid 5 at
    // 16; 17..20 pid 6, committed at 20; an empty one of pid 6 at 21; 22..27
    // plain; an empty data batch at 27 (which already read as no record, as
    // Kafka's consumer reads it); 28..30 plain.
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("t-0");
    fs::create_dir_all(&dir).unwrap();
    let segment: Vec<u8> = [
        records(0, 10, 1, None),
        records(10, 5, 1, Some(5)),
        codec::control_batch(15, 5, 0, false, 2000, 0),
        empty_control(16, 5),
        records(17, 3, 1, Some(6)),
        codec::control_batch(20, 6, 0, true, 2000, 0),
        empty_control(21, 6),
        records(22, 5, 1, None),
        // An idempotent producer's last batch, its records compacted away.
        codec::BatchBuilder::new(
            27,
            codec::BatchMeta { producer_id: 8, producer_epoch: 0, base_sequence: 3, ..Default::default() },
        )
        .finish(Compression::None),
        records(28, 2, 1, None),
    ]
    .concat();
    fs::write(dir.join(segment::log_file_name(0)), &segment).unwrap();
    assert_eq!(partition_offsets(d.path(), "t", 0).unwrap(), Bounds { start: 0, end: 30, last_stable: 30 });
    let want: Vec<i64> = (0..10).chain(17..20).chain(22..27).chain(28..30).collect();
    for start in [0, 16, 21, 27] {
        let mut src = open_committed_source(d.path(), "t", 0, start).unwrap();
        let got: Vec<i64> = drain(src.as_mut(), 30).iter().map(|r| r.0).collect();
        assert_eq!(got, want.iter().copied().filter(|o| *o >= start).collect::<Vec<_>>(), "from {start}");
        assert_eq!(src.position(), 30);
        if start == 0 {
            // Records stepped over: two markers (the empty batches hold none), five aborted.
            assert_eq!((src.skipped().control, src.skipped().aborted), (2, 5));
        }
    }
    let mut r = PartitionReader::open(&dir, 0, Isolation::ReadUncommitted, 1 << 16).unwrap();
    let mut got = Vec::new();
    while r
        .read(30, 1 << 20, |rec| {
            got.push(rec.offset);
            true
        })
        .unwrap()
    {}
    assert_eq!(got, (0..15).chain(17..20).chain(22..27).chain(28..30).collect::<Vec<_>>());
}

#[test]
fn the_stamp_of_a_partition_changes_with_its_files_and_only_then() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::new(d.path(), cfg(2000)).unwrap());
    let dir = d.path().join("t-0");
    let mut p = log.producer(None).unwrap();
    let mut send = |n: i64| {
        for i in 0..n {
            p.send("t", 0, Some(format!("k{i}").as_bytes()), Some(&[7; 40]), &[], None).unwrap();
        }
        p.flush().unwrap();
    };
    send(10);
    let a = segment::stamp(&dir).unwrap();
    assert_eq!(segment::stamp(&dir), Some(a), "nothing written");
    send(1);
    let b = segment::stamp(&dir).unwrap();
    assert_ne!(a, b, "appended");
    send(100);
    let c = segment::stamp(&dir).unwrap();
    assert!(segment::list_segments(&dir).unwrap().len() > 1);
    assert_ne!(b, c, "rolled");
    // A segment replaced by a copy of itself (as the cleaner swaps files): a new inode.
    let first = &segment::list_segments(&dir).unwrap()[0].path;
    let copy = first.with_extension("swap");
    fs::copy(first, &copy).unwrap();
    fs::rename(&copy, first).unwrap();
    assert_ne!(segment::stamp(&dir).unwrap(), c, "replaced");
}

#[test]
fn a_damaged_record_is_reported_by_the_reads_that_reach_it_and_only_them() {
    // One batch of offsets 0..10 whose last record says it has -1 headers,
    // with a CRC that matches: the batch reads as whole, the record does not.
    let mut batch = records(0, 10, 1, None);
    let last = batch.len() - 1;
    assert_eq!(batch[last], 0, "the last record's header count");
    batch[last] = 0x01; // zigzag varint -1
    let crc = codec::batch_crc(&batch);
    batch[17..21].copy_from_slice(&crc.to_be_bytes()); // the CRC field
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("t-0");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join(segment::log_file_name(0)), &batch).unwrap();
    let read = |end: i64| {
        let mut src = CommittedReader::open(&dir, 0).unwrap();
        let mut got = Vec::new();
        let r = loop {
            match src.next_records(end, 1 << 20, &mut |s| got.extend(s.iter().map(|r| r.offset))) {
                Ok(true) => continue,
                Ok(false) => break Ok(src.position()),
                Err(e) => break Err(e),
            }
        };
        (got, r)
    };
    let (got, r) = read(5);
    assert_eq!((got, r.unwrap()), ((0..5).collect::<Vec<i64>>(), 5), "stops before the damaged record");
    let (got, r) = read(10);
    assert_eq!(got, (0..9).collect::<Vec<i64>>(), "the records before it are handed over");
    let e = r.unwrap_err();
    assert!(matches!(e, LogError { kind: LogErrorKind::Corrupt, .. }) && e.to_string().contains("offset 0"), "{e}");
}

/// Pages of each segment file of `dir` in the page cache now.
fn cached_pages(dir: &Path) -> Vec<usize> {
    let segs = segment::list_segments(dir).unwrap();
    segs.iter()
        .map(|s| page_cache::CacheFootprint::of(&fs::File::open(&s.path).unwrap()).map_or(0, |f| f.resident_pages()))
        .collect()
}

#[test]
fn a_restore_gives_back_the_page_cache_it_filled_and_keeps_what_was_cached_before() {
    // Under the crate, not /tmp: tmpfs keeps every page whatever the advice.
    let d = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
    {
        let log = Arc::new(Log::new(d.path(), cfg(1 << 20)).unwrap());
        let mut p = log.producer(None).unwrap();
        for i in 0..40_000i64 {
            p.send("t", 0, Some(format!("k{i}").as_bytes()), Some(&[i as u8; 100]), &[], None).unwrap();
            if i % 500 == 499 {
                p.flush().unwrap();
            }
        }
        log.close().unwrap();
    }
    let dir = d.path().join("t-0");
    let segs = segment::list_segments(&dir).unwrap();
    assert!(segs.len() >= 4, "{} segments", segs.len());
    let evict = || {
        for s in &segs {
            page_cache::evict(&fs::File::open(&s.path).unwrap());
        }
    };
    let read_all = || {
        let mut src = CommittedReader::open(&dir, 0).unwrap();
        assert_eq!(drain(&mut src, 40_000).len(), 40_000);
    };
    // A cold log: every segment the restore entered after the first is given back whole (the
    // first counts what was read to find the start offset as found).
    evict();
    assert!(cached_pages(&dir).iter().all(|&n| n == 0), "{:?}", cached_pages(&dir));
    read_all();
    let after = cached_pages(&dir);
    assert!(after[1..].iter().all(|&n| n == 0), "{after:?}");
    // A log cached before: it stays cached.
    for s in &segs {
        fs::read(&s.path).unwrap();
    }
    let before = cached_pages(&dir);
    read_all();
    assert_eq!(cached_pages(&dir), before);
    // The Python reader (PartitionReader alone) leaves what it reads.
    evict();
    let mut r = PartitionReader::open(&dir, 0, Isolation::ReadCommitted, 1 << 16).unwrap();
    while r.read(i64::MAX, 1 << 20, |_| true).unwrap() {}
    drop(r);
    assert!(cached_pages(&dir)[1..].iter().all(|&n| n > 0), "{:?}", cached_pages(&dir));
}
