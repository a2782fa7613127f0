//! Fuzz harnesses: one function per fuzz target of `../fuzz`, each taking the
//! fuzzer's bytes. They feed hostile bytes to every parser of external data
//! and check, beyond "no panic, no hang", that what is decoded is consistent:
//! nothing made up (re-encoding decoded records gives the same records,
//! readers only hand out increasing offsets) and nothing lost (a writer's
//! recovery of a partition keeps every record a reader could read before it).
//!
//! Compiled for the fuzz crate (feature `fuzzing`) and for unit tests, which
//! replay the committed seed corpus (`fuzz/corpus/<target>/`) through the same
//! functions, so `cargo test` catches a regression without cargo-fuzz.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::codec::{self, BatchBuilder, BatchHeader, BatchMeta, Compression, HEADER_LEN, LOG_OVERHEAD};
use crate::log::reader::{offsets_of, Isolation, PartitionReader};
use crate::log::segment::{list_segments, read_index, scan_segment, BatchCursor};
use crate::log::txn::TxnStateFile;
use crate::log::writer::{PartitionWriter, WriterConfig};
use crate::offsets::{decode_entry, encode_i64, OffsetsEntry};

/// A directory removed on drop. In `/dev/shm` when it exists (the segment
/// harness writes files on every run), else in the system temp dir;
/// `STATESTORE_FUZZ_TMP` overrides both.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new() -> Self {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let base = std::env::var_os("STATESTORE_FUZZ_TMP").map(PathBuf::from).unwrap_or_else(|| {
            let shm = Path::new("/dev/shm");
            if shm.is_dir() {
                shm.to_path_buf()
            } else {
                std::env::temp_dir()
            }
        });
        let p = base.join(format!("statestore-fuzz-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("create fuzz scratch directory");
        ScratchDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for ScratchDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------- batch codec

/// Target `batch`: the bytes are one record batch (possibly followed by junk).
pub fn batch(data: &[u8]) {
    let Ok(h) = BatchHeader::parse(data) else { return };
    if data.len() < h.total_len() {
        return;
    }
    let batch = &data[..h.total_len()];
    let _ = codec::verify_crc(&h, batch);
    if h.is_control() {
        let _ = codec::control_type(&h, batch);
    }
    let mut scratch = Vec::new();
    let Ok(records) = codec::batch_records(&h, batch, &mut scratch) else { return };
    let mut decoded = Vec::new();
    let mut prev = None;
    for r in records {
        let Ok(r) = r else { return };
        // Nothing made up: offsets inside the batch's range, increasing.
        assert!(
            r.offset >= h.base_offset && r.offset <= h.last_offset(),
            "record offset {} outside the batch",
            r.offset
        );
        assert!(prev.is_none_or(|p| r.offset > p), "record offsets go back");
        prev = Some(r.offset);
        let headers: Vec<(Vec<u8>, Option<Vec<u8>>)> =
            r.headers().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect();
        assert_eq!(headers.len(), r.header_count());
        decoded.push((r.offset, r.timestamp, r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec), headers));
    }
    // Re-encode what was decoded: it must decode to the same records.
    let meta = BatchMeta {
        producer_id: h.producer_id,
        producer_epoch: h.producer_epoch,
        base_sequence: h.base_sequence,
        transactional: h.is_transactional(),
        control: h.is_control(),
        partition_leader_epoch: h.partition_leader_epoch,
    };
    let mut b = BatchBuilder::new(h.base_offset, meta);
    let first_ts = decoded.first().map_or(0, |r| r.1);
    if decoded.iter().any(|r| r.1.checked_sub(first_ts).is_none()) {
        return; // timestamps too far apart for one batch's deltas
    }
    for (off, ts, k, v, hs) in &decoded {
        let hs: Vec<(&[u8], Option<&[u8]>)> = hs.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
        b.append(*off, *ts, k.as_deref(), v.as_deref(), &hs);
    }
    let again = b.finish(Compression::None);
    let h2 = BatchHeader::parse(&again).expect("a re-encoded batch parses");
    codec::verify_crc(&h2, &again).expect("a re-encoded batch has a good CRC");
    let mut s2 = Vec::new();
    let back: Vec<_> = codec::batch_records(&h2, &again, &mut s2)
        .expect("re-encoded records")
        .map(|r| {
            let r = r.expect("a re-encoded record decodes");
            let hs: Vec<(Vec<u8>, Option<Vec<u8>>)> =
                r.headers().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect();
            (r.offset, r.key.map(<[u8]>::to_vec), r.value.map(<[u8]>::to_vec), hs)
        })
        .collect();
    let want: Vec<_> = decoded.into_iter().map(|(o, _, k, v, hs)| (o, k, v, hs)).collect();
    assert_eq!(back, want, "re-encoded records differ");
}

// ------------------------------------------------------------ segment reader

/// One file of a packed directory: kind, base offset, contents.
pub type PackedFile<'a> = (u8, i64, &'a [u8]);

/// Bytes of a segment-directory fuzz input: a flags byte, then entries of
/// `kind u8 | base offset i64 BE | length u16 LE | bytes` (the last entry may
/// be short). Kind 0 is a `.log`, 1 an `.index`, anything else a stray file.
/// Flags bit 0: recompute the CRC of every complete batch of the logs (so the
/// fuzzer gets past the CRC to the structure); bits 1-3 pick where readers start.
pub fn pack_dir(flags: u8, files: &[PackedFile<'_>]) -> Vec<u8> {
    let mut out = vec![flags];
    for (kind, base, bytes) in files {
        out.push(*kind);
        out.extend_from_slice(&base.to_be_bytes());
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

fn unpack_dir(data: &[u8]) -> Option<(u8, Vec<PackedFile<'_>>)> {
    let (&flags, mut rest) = data.split_first()?;
    let mut files = Vec::new();
    while rest.len() >= 11 && files.len() < 16 {
        let kind = rest[0];
        let base = i64::from_be_bytes(rest[1..9].try_into().unwrap());
        let len = u16::from_le_bytes([rest[9], rest[10]]) as usize;
        let body = &rest[11..];
        let n = len.min(body.len());
        files.push((kind, base, &body[..n]));
        rest = &body[n..];
    }
    Some((flags, files))
}

fn fix_crcs(log: &mut [u8]) {
    let mut pos = 0;
    while let Some((_, len)) = codec::peek_offset_and_length(&log[pos..]) {
        let total = len as i64 + LOG_OVERHEAD as i64;
        if len < (HEADER_LEN - LOG_OVERHEAD) as i32 || pos as i64 + total > log.len() as i64 {
            break;
        }
        let batch = &mut log[pos..pos + total as usize];
        let crc = codec::batch_crc(batch);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
        pos += total as usize;
    }
}

/// Write the files of a packed directory into `dir`; returns the flags.
pub fn write_dir(dir: &Path, data: &[u8]) -> Option<u8> {
    let (flags, files) = unpack_dir(data)?;
    for (i, (kind, base, bytes)) in files.into_iter().enumerate() {
        // A negative base gives a name the log does not list (a stray file).
        let stem = if base >= 0 { format!("{base:020}") } else { format!("{base:+020}") };
        let name = match kind {
            0 => format!("{stem}.log"),
            1 => format!("{stem}.index"),
            _ => format!("stray-{i}.log"),
        };
        let mut bytes = bytes.to_vec();
        if kind == 0 && flags & 1 != 0 {
            fix_crcs(&mut bytes);
        }
        fs::write(dir.join(name), bytes).expect("write fuzz file");
    }
    Some(flags)
}

type Rec = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

/// Read every record a reader hands out, or the error that stopped it.
fn read_all(dir: &Path, start: i64, isolation: Isolation, chunk: usize) -> Result<Vec<Rec>, String> {
    let mut r = PartitionReader::open(dir, start, isolation, chunk).map_err(|e| e.to_string())?;
    let mut out: Vec<Rec> = Vec::new();
    // Each call consumes at least one batch or record, so this bounds the
    // calls by the bytes present (and catches a reader that stops moving).
    for _ in 0..100_000 {
        let before = r.position();
        let more = r
            .read(i64::MAX, 1, |rec| {
                out.push((rec.offset, rec.key.map(<[u8]>::to_vec), rec.value.map(<[u8]>::to_vec)));
                true
            })
            .map_err(|e| e.to_string())?;
        if !more {
            break;
        }
        assert!(r.position() > before, "reader does not move on from {before}");
    }
    for w in out.windows(2) {
        assert!(w[1].0 > w[0].0, "reader hands out offset {} after {}", w[1].0, w[0].0);
    }
    assert!(out.first().is_none_or(|f| f.0 >= start), "reader hands out an offset before its start");
    Ok(out)
}

/// The first batch a cursor positioned at `start` sees, or its error.
fn first_batch(dir: &Path, start: i64) -> Result<Option<(i64, u64, usize)>, String> {
    let mut c = BatchCursor::open(dir, start, 4096, true).map_err(|e| e.to_string())?;
    Ok(c.peek().map_err(|e| e.to_string())?.map(|p| (p.header.base_offset, p.position, p.segment)))
}

/// Target `segment`: a partition directory built from the bytes. Reads it
/// with both isolation levels, checks that the index is only ever a hint,
/// computes the offsets, then recovers it as a writer does on open (torn-tail
/// cut, index rebuild) and checks that nothing readable was lost and that an
/// append lands after it.
pub fn segment(data: &[u8]) {
    let tmp = ScratchDir::new();
    let dir = tmp.path();
    let Some(flags) = write_dir(dir, data) else { return };
    let segs = list_segments(dir).expect("list a readable directory");
    let starts = [0, 1, 2, 5, 17, 100, 1000, i64::MAX];
    let start = starts[(flags as usize >> 1) & 7].max(segs.first().map_or(0, |s| s.base));

    let _ = offsets_of(dir);
    for seg in &segs {
        let _ = read_index(seg);
        let _ = scan_segment(seg);
    }
    let committed = read_all(dir, start, Isolation::ReadCommitted, 4096);
    let all = read_all(dir, 0, Isolation::ReadUncommitted, 4096);
    if let (Ok(c), Ok(a)) = (&committed, &all) {
        // read_committed hands out a subset of everything written.
        let mut it = a.iter();
        for r in c {
            assert!(it.any(|x| x == r), "read_committed made up record at offset {}", r.0);
        }
    }

    // The index is a hint: with or without it a cursor finds the same batch.
    let indexes: Vec<PathBuf> = segs.iter().map(|s| s.index_path()).filter(|p| p.is_file()).collect();
    if !indexes.is_empty() {
        let with_index = first_batch(dir, start);
        let aside = |p: &Path| p.with_extension("index-aside");
        for p in &indexes {
            fs::rename(p, aside(p)).expect("move an index aside");
        }
        let without_index = first_batch(dir, start);
        if let (Ok(a), Ok(b)) = (&with_index, &without_index) {
            assert_eq!(a, b, "the index changed where a cursor starts ({start})");
        }
        // Put the indexes back so that recovery sees them.
        for p in &indexes {
            fs::rename(aside(p), p).expect("put an index back");
        }
    }

    // Recovery: what a writer keeps must be everything a reader read.
    let cfg = WriterConfig { sync: false, ..Default::default() };
    let Ok(mut w) = PartitionWriter::open(dir, cfg) else { return };
    let next = w.next_offset();
    let appended = w.send(BatchMeta::default(), 1, Some(b"fuzz-k"), Some(b"fuzz-v"), &[]);
    let flushed = w.flush(false);
    drop(w);
    for seg in list_segments(dir).expect("list") {
        let idx = read_index(&seg);
        assert!(idx.windows(2).all(|p| p[1].0 > p[0].0 && p[1].1 > p[0].1), "rebuilt index is not increasing");
    }
    let Ok(before) = all else { return };
    let after = match read_all(dir, 0, Isolation::ReadUncommitted, 4096) {
        Ok(a) => a,
        Err(e) => panic!("the recovered partition is unreadable: {e}"),
    };
    assert!(after.len() >= before.len() && after[..before.len()] == before[..], "recovery lost or changed records");
    if let (Ok(off), Ok(())) = (appended, flushed) {
        assert_eq!(off, next);
        assert!(before.last().is_none_or(|l| off > l.0), "append at {off} does not follow the log");
        assert_eq!(after.len(), before.len() + 1, "the appended record is not read back");
        assert_eq!(after.last().map(|r| r.0), Some(off), "the appended record is not the last one");
    }
}

// ------------------------------------------------------- offsets / status

/// Target `offsets`: one entry of a store's offsets column family; the first
/// byte is the key length.
pub fn offsets(data: &[u8]) {
    let Some((&n, rest)) = data.split_first() else { return };
    let n = (n as usize).min(rest.len());
    let (key, value) = rest.split_at(n);
    match decode_entry(key, value) {
        Ok(OffsetsEntry::Offset(k, v)) => {
            assert_eq!(k.as_bytes(), key);
            assert_eq!(encode_i64(v), value);
        }
        Ok(OffsetsEntry::Status(v)) => assert_eq!(encode_i64(v), value),
        Ok(OffsetsEntry::Position) => assert_eq!(key, crate::offsets::POSITION_KEY),
        Err(m) => assert!(!m.is_empty()),
    }
}

// ------------------------------------------------------ producer state file

/// Target `txn_state`: the transaction coordinator's state file. Whatever
/// parses must render to a file that parses again.
pub fn txn_state(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("/fuzz/transactions.state");
    if let Ok(st) = TxnStateFile::parse(path, text) {
        let again = TxnStateFile::parse(path, &st.render()).expect("a rendered state file parses");
        assert_eq!(again.next_producer_id, st.next_producer_id);
        assert_eq!(again.entries.keys().collect::<Vec<_>>(), st.entries.keys().collect::<Vec<_>>());
    }
}

// ------------------------------------------------------------ fetch responses

/// Target `fetch_response`: a Fetch response as a broker sends it -- the
/// first byte picks the version (4..=12), the rest is the frame after its
/// length (response header with correlation id 1, then the body) -- decoded
/// with the `kafka-protocol` crate, then walked batch by batch as a restore
/// does. Invariants: every batch handed out lies inside the records, in
/// order, with a valid CRC; the walk never goes backwards.
pub fn fetch_response(data: &[u8]) {
    use crate::kafka::fetch::{Batches, Fate};
    use kafka_protocol::messages::FetchRequest;

    let Some((&v, frame)) = data.split_first() else { return };
    let version = 4 + (v % 9) as i16;
    let frame = bytes::Bytes::copy_from_slice(frame);
    let Ok(resp) = crate::kafka::conn::decode_response::<FetchRequest>(frame, 1, version) else { return };
    for t in &resp.responses {
        for p in &t.partitions {
            let records = p.records.clone().unwrap_or_default();
            let aborted = p.aborted_transactions.iter().flatten().map(|a| (a.producer_id.0, a.first_offset));
            let mut batches = Batches::new(&records, aborted);
            let mut at = 0usize;
            while let Some(b) = batches.next_batch() {
                let Ok(b) = b else { break };
                assert!(batches.position() > at && batches.position() <= records.len());
                assert_eq!(batches.position() - at, b.bytes.len());
                at = batches.position();
                assert!(codec::verify_crc(&b.header, b.bytes).is_ok(), "a batch with a bad CRC was handed out");
                if b.fate == Fate::Data {
                    let mut scratch = Vec::new();
                    if let Ok(recs) = codec::batch_records(&b.header, b.bytes, &mut scratch) {
                        for r in recs {
                            if r.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
            let _ = Batches::plan(&records);
        }
    }
}

/// A Fetch response frame for the `fetch_response` target: `version`, then the frame.
pub fn fetch_response_seed(version: i16, records: &[u8], aborted: &[(i64, i64)]) -> Vec<u8> {
    use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{ApiKey, FetchResponse, ProducerId, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    let mut out = vec![(version - 4) as u8];
    ResponseHeader::default()
        .with_correlation_id(1)
        .encode(&mut out, ApiKey::Fetch.response_header_version(version))
        .expect("encodes");
    let p = PartitionData::default()
        .with_partition_index(0)
        .with_high_watermark(100)
        .with_last_stable_offset(100)
        .with_aborted_transactions(Some(
            aborted
                .iter()
                .map(|&(pid, first)| {
                    AbortedTransaction::default().with_producer_id(ProducerId(pid)).with_first_offset(first)
                })
                .collect(),
        ))
        .with_records(Some(bytes::Bytes::copy_from_slice(records)));
    FetchResponse::default()
        .with_responses(vec![FetchableTopicResponse::default()
            .with_topic(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![p])])
        .encode(&mut out, version)
        .expect("encodes");
    out
}

// ------------------------------------------------------ versioned segment values

/// Target `versioned_segment`: one row of a versioned store's segment, as a
/// restore reads it from a store on disk. A value that decodes re-encodes to
/// the same bytes (the layout is canonical: nothing made up, nothing lost);
/// the formatter's operations and the put logic over a store holding the
/// value (as a segment row and, from its first bytes, as a latest value)
/// either work or refuse with a message, never panic.
pub fn versioned_segment(data: &[u8]) {
    use crate::versioned::put::{physical_key, MemoryBacking, LATEST_SEGMENT};
    use crate::versioned::segment_value::SegmentValue;
    use crate::versioned::Versioned;

    if let Ok(sv) = SegmentValue::decode(data) {
        assert_eq!(sv.encode(), data, "a decoded segment value re-encodes to its bytes");
        let (next, min) = (sv.next_ts(), sv.min_ts());
        let _ = sv.find(min);
        let _ = sv.clone().insert_as_latest(next, next.saturating_add(1), Some(b"x"));
        let _ = sv.clone().insert_as_latest(min, next.saturating_add(1), None);
        let _ = sv.clone().insert_as_earliest(min.saturating_sub(1), Some(b""));
        let _ = sv.clone().update(min, None, sv.versions().len().saturating_sub(1));
    }
    // the put logic over a store holding these bytes, in segment 0 and as the latest value
    let mut rows = MemoryBacking::default();
    rows.0.insert(physical_key(0, b"k"), data.to_vec());
    rows.0.insert(physical_key(LATEST_SEGMENT, b"k"), data.iter().take(12).copied().collect());
    let mut logic = Versioned::new(1_000, 100);
    let ts = |i: usize| i64::from(*data.get(i).unwrap_or(&0)) * 7;
    for (i, value) in [Some(&b"a"[..]), None, Some(b"b"), None].into_iter().enumerate() {
        if logic.put(&mut rows, b"k", value, ts(i)).is_err() {
            break;
        }
    }
}

// ------------------------------------------------------------- seed corpus

/// The seed corpus: `(target, file name, bytes)`. Written to
/// `fuzz/corpus/<target>/` by the `write_seed_corpus` test below.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    // Fetch responses: plain data, an aborted transaction with its marker, a batch cut at the end.
    {
        let meta = |pid| BatchMeta {
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: 0,
            transactional: true,
            ..Default::default()
        };
        let mut plain = BatchBuilder::new(0, BatchMeta::default());
        plain.append(0, 1_700_000_000_000, Some(b"k0"), Some(b"v0"), &[]);
        plain.append(1, 1_700_000_000_001, Some(b"k1"), None, &[(b"h", Some(b"x"))]);
        let mut aborted = BatchBuilder::new(2, meta(5));
        aborted.append(2, 1_700_000_000_002, Some(b"k2"), Some(b"aborted"), &[]);
        let mut committed = BatchBuilder::new(3, meta(6));
        committed.append(3, 1_700_000_000_003, Some(b"k3"), Some(b"committed"), &[]);
        let records = [
            plain.finish(Compression::None),
            aborted.finish(Compression::Lz4),
            committed.finish(Compression::Zstd),
            codec::control_batch(4, 5, 0, false, 1_700_000_000_004, 0),
            codec::control_batch(5, 6, 0, true, 1_700_000_000_005, 0),
        ]
        .concat();
        for version in [4i16, 11, 12] {
            out.push(("fetch_response", format!("v{version}"), fetch_response_seed(version, &records, &[(5, 2)])));
        }
        let cut = &records[..records.len() - 9];
        out.push(("fetch_response", "v12-cut".to_string(), fetch_response_seed(12, cut, &[(5, 2)])));
    }
    // Batches of every codec, plain, transactional, with headers and nulls, and control batches.
    for codec in [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
        for (name, meta) in [
            ("plain", BatchMeta::default()),
            (
                "txn",
                BatchMeta {
                    producer_id: 7,
                    producer_epoch: 2,
                    base_sequence: 0,
                    transactional: true,
                    ..Default::default()
                },
            ),
        ] {
            let mut b = BatchBuilder::new(40, meta);
            b.append(40, 1_700_000_000_000, Some(b"key-1"), Some(b"value value value value"), &[]);
            b.append(
                41,
                1_700_000_000_005,
                None,
                Some(b"value value value value 2"),
                &[(b"h1", Some(b"x")), (b"h2", None)],
            );
            b.append(43, 1_699_999_999_999, Some(b"key-3"), None, &[]);
            out.push(("batch", format!("{}-{name}", codec.name()), b.finish(codec)));
        }
    }
    out.push(("batch", "control-commit".into(), codec::control_batch(9, 7, 2, true, 5, 3)));
    out.push(("batch", "control-abort".into(), codec::control_batch(9, 7, 2, false, 5, 3)));
    out.push(("batch", "empty".into(), BatchBuilder::new(0, BatchMeta::default()).finish(Compression::None)));

    for (name, dir) in seed_dirs() {
        out.push(("segment", name, dir));
    }

    out.push(("offsets", "offset".into(), [&[3u8][..], b"t-0", &encode_i64(41)].concat()));
    out.push(("offsets", "status".into(), [&[6u8][..], b"status", &encode_i64(1)].concat()));
    out.push(("offsets", "short".into(), [&[3u8][..], b"t-0", b"xyz"].concat()));

    {
        use crate::versioned::segment_value::SegmentValue;
        let mut three = SegmentValue::with_record(Some(b"a"), 10, 20);
        three.insert_as_latest(25, 30, Some(b"bb")).expect("a gap, then a version");
        out.push(("versioned_segment", "three".into(), three.encode()));
        out.push(("versioned_segment", "degenerate".into(), SegmentValue::with_record(None, 50, 50).encode()));
        out.push(("versioned_segment", "empty-value".into(), SegmentValue::with_record(Some(b""), 1, 2).encode()));
    }
    out.push(("txn_state", "empty".into(), b"statestore-transactions 1\nnext-producer-id 0\n".to_vec()));
    out.push((
        "txn_state",
        "open".into(),
        b"statestore-transactions 1\nnext-producer-id 3\ntxn 6170702d31 0 4 ongoing 1700000000000 0@t,3@u\n\
          txn 6170702d32 1 0 prepare-commit 1700000000001 1@t\ntxn 6170702d33 2 9 empty -1 -\n"
            .to_vec(),
    ));
    out
}

/// Seed partition directories, written by the real writer and packed.
fn seed_dirs() -> Vec<(String, Vec<u8>)> {
    use crate::log::Log;
    use std::sync::Arc;
    let mut out = Vec::new();
    let pack = |dir: &Path, flags: u8| {
        let mut files = Vec::new();
        for seg in list_segments(dir).unwrap() {
            files.push((0u8, seg.base, fs::read(&seg.path).unwrap()));
            if let Ok(idx) = fs::read(seg.index_path()) {
                files.push((1u8, seg.base, idx));
            }
        }
        let refs: Vec<PackedFile<'_>> = files.iter().map(|(k, b, v)| (*k, *b, &v[..])).collect();
        pack_dir(flags, &refs)
    };
    for (name, codec, segment_bytes) in [
        ("plain", Compression::None, 6000u64),
        ("gzip", Compression::Gzip, 1 << 20),
        ("zstd-rolled", Compression::Zstd, 1500),
    ] {
        let tmp = ScratchDir::new();
        let log =
            Arc::new(Log::new(tmp.path(), WriterConfig { segment_bytes, sync: false, compression: codec }).unwrap());
        let mut plain = log.producer(None).unwrap();
        let mut tx = log.producer(Some("app-1")).unwrap();
        for i in 0..60u32 {
            let v = vec![b'a' + (i % 26) as u8; 90];
            plain.send("t", 0, Some(format!("k{i}").as_bytes()), Some(&v), &[], Some(i as i64)).unwrap();
            if i % 9 == 0 {
                plain.flush().unwrap();
                tx.begin().unwrap();
                tx.send("t", 0, Some(b"tk"), Some(format!("tv{i}").as_bytes()), &[], Some(i as i64)).unwrap();
                if i % 2 == 0 {
                    tx.commit().unwrap();
                } else {
                    tx.abort().unwrap();
                }
            }
        }
        plain.flush().unwrap();
        // An open transaction at the end (the last stable offset).
        tx.begin().unwrap();
        tx.send("t", 0, Some(b"open"), Some(b"open"), &[], Some(99)).unwrap();
        tx.flush().unwrap();
        let dir = tmp.path().join("t-0");
        out.push((name.to_string(), pack(&dir, 0)));
        out.push((format!("{name}-fixcrc-start"), pack(&dir, 1 | (3 << 1))));
        drop(tx);
        drop(plain);
        log.close().unwrap();
    }
    // A torn tail: the last batch cut short.
    let tmp = ScratchDir::new();
    let log = Arc::new(Log::new(tmp.path(), WriterConfig { sync: false, ..Default::default() }).unwrap());
    let mut p = log.producer(None).unwrap();
    for i in 0..5 {
        p.send("t", 0, Some(b"k"), Some(format!("v{i}").as_bytes()), &[], Some(0)).unwrap();
        p.flush().unwrap();
    }
    drop(p);
    log.close().unwrap();
    let seg = &list_segments(&tmp.path().join("t-0")).unwrap()[0];
    let bytes = fs::read(&seg.path).unwrap();
    out.push(("torn-tail".into(), pack_dir(0, &[(0, 0, &bytes[..bytes.len() - 7])])));
    out.push(("zero-tail".into(), pack_dir(0, &[(0, 0, &[&bytes[..], &[0u8; 64][..]].concat())])));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
    }

    /// A fuzz target: its name, its harness and its mutations per round.
    type Target = (&'static str, fn(&[u8]), usize);

    /// Every fuzz target of `../fuzz` (the one list the tests below go
    /// through): its name, its harness, and how many blind mutations
    /// [`mutated_corpus_runs_cleanly`] sends through it per round.
    const TARGETS: [Target; 6] = [
        ("batch", batch, 20_000),
        ("offsets", offsets, 20_000),
        ("txn_state", txn_state, 10_000),
        ("segment", segment, 1_500),
        ("fetch_response", fetch_response, 20_000),
        ("versioned_segment", versioned_segment, 20_000),
    ];

    fn target(name: &str) -> fn(&[u8]) {
        TARGETS
            .iter()
            .find(|(t, _, _)| *t == name)
            .map(|&(_, f, _)| f)
            .unwrap_or_else(|| panic!("no fuzz target {name}"))
    }

    /// The fuzz crate builds exactly the targets listed here (so `make fuzz`
    /// and the corpus replay cover the same ones).
    #[test]
    fn every_fuzz_binary_is_a_listed_target() {
        let manifest = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/Cargo.toml")).unwrap();
        let mut bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.trim().strip_prefix("name = \""))
            .map(|n| n.trim_end_matches('"'))
            .filter(|n| *n != "statestore-fuzz")
            .collect();
        let mut listed: Vec<&str> = TARGETS.iter().map(|t| t.0).collect();
        bins.sort_unstable();
        listed.sort_unstable();
        assert_eq!(bins, listed);
    }

    /// Regenerate the committed seed corpus:
    /// `STATESTORE_WRITE_CORPUS=1 cargo test --release fuzzing -- --ignored`.
    #[test]
    #[ignore]
    fn write_seed_corpus() {
        if std::env::var_os("STATESTORE_WRITE_CORPUS").is_none() {
            return;
        }
        for (t, name, bytes) in seed_corpus() {
            let d = corpus_dir().join(t);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join(format!("seed-{name}")), bytes).unwrap();
        }
    }

    /// Every committed corpus file (seeds and the inputs of fixed crashes)
    /// goes through its target, and so do the generated seeds.
    #[test]
    fn corpus_replays_cleanly() {
        for (t, _, bytes) in seed_corpus() {
            target(t)(&bytes);
        }
        let mut n = 0;
        for (t, _, _) in TARGETS {
            let Ok(entries) = fs::read_dir(corpus_dir().join(t)) else { continue };
            for e in entries {
                let p = e.unwrap().path();
                target(t)(&fs::read(&p).unwrap());
                n += 1;
            }
        }
        assert!(n > 0 || !corpus_dir().exists(), "the corpus directory holds no inputs");
    }

    /// A small deterministic mutator (xorshift): the short fuzz run of
    /// `make test`, without libFuzzer. `make fuzz` is the coverage-guided one.
    struct Mutator(u64);

    impl Mutator {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }

        /// One to four edits of the kinds that break parsers: bit flips,
        /// boundary integers over length and offset fields, truncation,
        /// inserted or duplicated bytes, and a splice with another input.
        fn mutate(&mut self, input: &[u8], other: &[u8]) -> Vec<u8> {
            const EDGES: [u64; 8] = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF_FFFF, 0xFFFF_FFFF, u64::MAX];
            let mut d = input.to_vec();
            for _ in 0..1 + self.below(4) {
                let at = self.below(d.len() + 1);
                match self.below(7) {
                    0 if !d.is_empty() => {
                        let i = self.below(d.len());
                        d[i] ^= 1 << self.below(8);
                    }
                    1 if d.len() >= 8 => {
                        let i = self.below(d.len() - 7);
                        let w = 1 << self.below(4); // 1, 2, 4 or 8 bytes, big-endian as Kafka writes them
                        let v = EDGES[self.below(EDGES.len())].to_be_bytes();
                        d[i..i + w.min(8)].copy_from_slice(&v[8 - w.min(8)..]);
                    }
                    2 => d.truncate(at),
                    3 => {
                        let n = 1 + self.below(16);
                        let bytes: Vec<u8> = (0..n).map(|_| self.next() as u8).collect();
                        d.splice(at..at, bytes);
                    }
                    4 if !d.is_empty() => {
                        let from = self.below(d.len());
                        let to = (from + 1 + self.below(64)).min(d.len());
                        let chunk = d[from..to].to_vec();
                        d.splice(at..at, chunk);
                    }
                    5 if !other.is_empty() => {
                        let from = self.below(other.len());
                        d.truncate(at);
                        d.extend_from_slice(&other[from..]);
                    }
                    _ => {
                        if !d.is_empty() {
                            let i = self.below(d.len());
                            d[i] = self.next() as u8;
                        }
                    }
                }
            }
            d
        }
    }

    /// A short blind-mutation fuzz run of every target from its corpus, in
    /// `cargo test`: any panic (an invariant of the target or a crash) fails
    /// it. `STATESTORE_FUZZ_SEED` picks another seed; `STATESTORE_FUZZ_ROUNDS`
    /// scales the run.
    #[test]
    fn mutated_corpus_runs_cleanly() {
        let seed = std::env::var("STATESTORE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_F00D_u64);
        let scale: usize = std::env::var("STATESTORE_FUZZ_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
        for (t, _, rounds) in TARGETS {
            let mut inputs: Vec<Vec<u8>> =
                seed_corpus().into_iter().filter(|(name, _, _)| *name == t).map(|(_, _, b)| b).collect();
            if let Ok(entries) = fs::read_dir(corpus_dir().join(t)) {
                inputs.extend(entries.filter_map(|e| fs::read(e.ok()?.path()).ok()));
            }
            assert!(!inputs.is_empty(), "no corpus for {t}");
            let mut m = Mutator(seed ^ (t.len() as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for i in 0..rounds * scale {
                let a = &inputs[m.below(inputs.len())];
                let b = &inputs[m.below(inputs.len())];
                let input = m.mutate(a, b);
                let r = std::panic::catch_unwind(|| target(t)(&input));
                assert!(r.is_ok(), "fuzz target {t} failed on mutation {i} (seed {seed:#x}); input: {input:?}");
            }
        }
    }

    #[test]
    fn seed_dirs_are_readable_and_hold_records() {
        for (name, data) in seed_dirs() {
            let tmp = ScratchDir::new();
            write_dir(tmp.path(), &data).unwrap();
            let recs = read_all(tmp.path(), 0, Isolation::ReadUncommitted, 4096).unwrap();
            assert!(recs.len() >= 4, "{name}: {} records", recs.len());
        }
    }
}
