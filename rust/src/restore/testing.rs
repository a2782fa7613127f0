//! A vector-backed [`ChangelogSource`] and a model of the committed log,
//! for the restore engine's own tests.

use std::collections::BTreeMap;

use super::Dest;
use crate::segments::{KeySchema, Segmentation};
use crate::source::{ChangeRecord, ChangelogSource, LogError, LogErrorKind, RawHeaders, SkipCounts};
use crate::store::{Store, StoreFormat};

/// The timestamp a [`VecSource`] gives the record at `offset`.
pub fn ts_of(offset: i64) -> i64 {
    1_700_000_000_000 + offset * 7
}

/// The headers a [`VecSource`] gives the record at `offset` (count, wire
/// format), so header-aware stores see none, one, several and a null value:
/// none; `trace: <offset>`; `a: x, n: null`; `empty: ""`.
pub fn headers_of(offset: i64) -> (i32, Vec<u8>) {
    let trace = offset.to_string();
    let headers: Vec<(&[u8], Option<&[u8]>)> = match offset % 4 {
        0 => vec![],
        1 => vec![(b"trace", Some(trace.as_bytes()))],
        2 => vec![(b"a", Some(b"x")), (b"n", None)],
        _ => vec![(b"empty", Some(b""))],
    };
    let mut raw = Vec::new();
    let n = RawHeaders::encode(headers, &mut raw);
    (n, raw)
}

/// The value a store of `format` holds for `value` written at `offset` of a
/// [`VecSource`] (its timestamp [`ts_of`], its headers [`headers_of`]).
pub fn stored_value(format: StoreFormat, offset: i64, value: &[u8]) -> Vec<u8> {
    let (n, raw) = headers_of(offset);
    let mut stored = Vec::new();
    format.encode_value(ts_of(offset), RawHeaders::new(n, &raw), value, &mut stored);
    stored
}

/// One log entry as the source sees it.
#[derive(Debug, Clone)]
pub enum Entry {
    Data { key: Option<Vec<u8>>, value: Option<Vec<u8>> },
    Aborted,
    Control,
}

pub struct VecSource {
    pub log: Vec<Entry>,
    pub pos: i64,
    pub skipped: SkipCounts,
    pub bytes: u64,
    /// Fail with a corrupt-log error when reaching this offset.
    pub fail_at: Option<i64>,
}

impl VecSource {
    pub fn new(log: Vec<Entry>, start: i64) -> Self {
        Self { log, pos: start, skipped: SkipCounts::default(), bytes: 0, fail_at: None }
    }
}

impl ChangelogSource for VecSource {
    fn position(&self) -> i64 {
        self.pos
    }
    fn next_chunk(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, LogError> {
        let end = end.min(self.log.len() as i64);
        let mut used = 0usize;
        while self.pos < end && used < max_bytes.max(1) {
            if self.fail_at == Some(self.pos) {
                return Err(LogError::new(LogErrorKind::Corrupt, format!("bad batch at offset {}", self.pos)));
            }
            match &self.log[self.pos as usize] {
                Entry::Data { key, value } => {
                    used += 16 + key.as_ref().map_or(0, Vec::len) + value.as_ref().map_or(0, Vec::len);
                    let (n, raw) = headers_of(self.pos);
                    let mut r = ChangeRecord::new(self.pos, ts_of(self.pos), key.as_deref(), value.as_deref());
                    r.headers = RawHeaders::new(n, &raw);
                    sink(r);
                }
                Entry::Aborted => {
                    used += 16;
                    self.skipped.aborted += 1;
                }
                Entry::Control => {
                    used += 16;
                    self.skipped.control += 1;
                }
            }
            self.pos += 1;
        }
        self.bytes += used as u64;
        Ok(self.pos < end)
    }
    fn skipped(&self) -> SkipCounts {
        self.skipped
    }
    fn bytes_read(&self) -> u64 {
        self.bytes
    }
}

/// The store a committed log prefix `[0, end)` must produce, and its offset.
pub fn model(log: &[Entry], end: i64) -> (BTreeMap<Vec<u8>, Vec<u8>>, Option<i64>) {
    let mut m = BTreeMap::new();
    let mut last = None;
    for (off, e) in log.iter().enumerate().take(end as usize) {
        if let Entry::Data { key, value } = e {
            last = Some(off as i64);
            match (key, value) {
                (Some(k), Some(v)) => {
                    m.insert(k.clone(), v.clone());
                }
                (Some(k), None) => {
                    m.remove(k);
                }
                (None, _) => {}
            }
        }
    }
    (m, last)
}

/// `n` records of distinct keys with values of `value_len` bytes.
pub fn unique_log(n: usize, value_len: usize) -> Vec<Entry> {
    (0..n)
        .map(|i| Entry::Data { key: Some(format!("k{i:08}").into_bytes()), value: Some(vec![b'v'; value_len]) })
        .collect()
}

/// A deterministic pseudo-random log with overwrites, tombstones, null
/// keys, aborted records and markers.
pub fn random_log(n: usize, keys: u64, seed: u64) -> Vec<Entry> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|_| {
            let r = next();
            match r % 100 {
                0..=4 => Entry::Aborted,
                5..=7 => Entry::Control,
                8 => Entry::Data { key: None, value: Some(b"nk".to_vec()) },
                9..=20 => Entry::Data { key: Some(format!("k{:05}", next() % keys).into_bytes()), value: None },
                _ => {
                    let len = (next() % 40) as usize;
                    Entry::Data {
                        key: Some(format!("k{:05}", next() % keys).into_bytes()),
                        value: Some(vec![(r >> 8) as u8; len]),
                    }
                }
            }
        })
        .collect()
}

/// Everything in a store's data column family.
/// [`model`] as a timestamped store holds it: each value behind its record's timestamp.
pub fn model_timestamped(log: &[Entry], end: i64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    model_format(log, end, StoreFormat::Timestamped)
}

/// [`model`] as a key-value store of `format` holds it ([`stored_value`]).
pub fn model_format(log: &[Entry], end: i64, format: StoreFormat) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for (off, e) in log.iter().enumerate().take(end as usize) {
        if let Entry::Data { key: Some(k), value } = e {
            match value {
                Some(v) => {
                    m.insert(k.clone(), stored_value(format, off as i64, v));
                }
                None => {
                    m.remove(k);
                }
            }
        }
    }
    m
}

/// The data column family of `store`, in key order.
/// A key-value store as a test holds it: the store itself or a restore's [`Dest`].
pub trait AsStore {
    fn store(&self) -> &Store;
}

impl AsStore for Store {
    fn store(&self) -> &Store {
        self
    }
}

impl AsStore for Dest {
    fn store(&self) -> &Store {
        match self {
            Dest::Store(s) => s,
            Dest::Versioned(v) => v.store(),
            Dest::Segmented(s) => panic!("{} is segmented", s.path().display()),
        }
    }
}

pub fn dump(store: &impl AsStore) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let store = store.store();
    store
        .db()
        .iterator_cf(store.data_cf(), rocksdb::IteratorMode::Start)
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// The contents of a segmented store: segment id -> key -> stored value.
pub type Segments = BTreeMap<i64, BTreeMap<Vec<u8>, Vec<u8>>>;

/// `log` as a window (or session) store's changelog: each key `k` becomes
/// `k ‖ window start ‖ seqnum 0` (a session store's `k ‖ end ‖ start`), the
/// time chosen by the key (one of 40 windows, 30 s apart) so keys repeat.
pub fn segmented_log(log: &[Entry], schema: KeySchema) -> Vec<Entry> {
    let time_of = |k: &[u8]| {
        let n: u64 = std::str::from_utf8(&k[1..]).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
        1_700_000_000_000 + (n % 40) as i64 * 30_000
    };
    let rekey = |k: &Vec<u8>| -> Vec<u8> {
        let t = time_of(k);
        match schema {
            KeySchema::Window | KeySchema::TimeOrderedWindow => {
                [k.as_slice(), &t.to_be_bytes(), &0i32.to_be_bytes()].concat()
            }
            KeySchema::Session | KeySchema::TimeOrderedSession => {
                [k.as_slice(), &t.to_be_bytes(), &(t - 5_000).to_be_bytes()].concat()
            }
        }
    };
    log.iter()
        .map(|e| match e {
            Entry::Data { key, value } => Entry::Data { key: key.as_ref().map(rekey), value: value.clone() },
            other => other.clone(),
        })
        .collect()
}

/// The segments a segmented store restored from `[0, end)` of `log` must
/// hold (segment id -> key -> stored value), and its offset: every operation
/// applied in log order, then only the segments live at the largest
/// segment timestamp seen kept.
pub fn model_segmented(log: &[Entry], end: i64, format: StoreFormat, seg: Segmentation) -> (Segments, Option<i64>) {
    let schema = format.key_schema().expect("a segmented format");
    let (mut m, mut last, mut stream_time) = (BTreeMap::new(), None, i64::MIN);
    for (off, e) in log.iter().enumerate().take(end as usize) {
        if let Entry::Data { key, value } = e {
            last = Some(off as i64);
            let Some(changelog_key) = key else { continue };
            let mut stored_key = Vec::new();
            format.encode_key(changelog_key, &mut stored_key);
            let k = &stored_key;
            let id = seg.segment_id(schema.segment_timestamp(k).unwrap());
            stream_time = stream_time.max(schema.segment_timestamp(k).unwrap());
            let s: &mut BTreeMap<Vec<u8>, Vec<u8>> = m.entry(id).or_default();
            if format.has_index() {
                let mut index = Vec::new();
                schema.index_key(changelog_key, &mut index);
                match value {
                    Some(_) => s.insert(index, Vec::new()),
                    None => s.remove(&index),
                };
            }
            match value {
                Some(v) => {
                    s.insert(k.clone(), stored_value(format, off as i64, v));
                }
                None => {
                    s.remove(k);
                }
            }
        }
    }
    if stream_time != i64::MIN {
        let min_live = seg.min_live_segment(stream_time);
        m.retain(|&id, _| id >= min_live);
    }
    (m, last)
}

/// Create a store at `path` whose data holds `files` level-0 files of ~100 KB
/// each (written with compactions off, every one across the whole key range,
/// no key in two), as a large replay leaves it.
pub fn store_with_level0_files(path: &std::path::Path, files: u64) {
    let mut o = super::restore_options();
    o.set_disable_auto_compactions(true);
    let s = Store::open_with(path, o).unwrap();
    for f in 0..files {
        let mut b = rocksdb::WriteBatch::default();
        (0..1_000).for_each(|i| b.put(format!("k{i:06}{f:03}").as_bytes(), [b'v'; 80]));
        s.write(b, false).unwrap();
        s.flush().unwrap();
    }
    assert_eq!(s.level0_files(), files);
}

/// A listener that counts the batches a restore writes; its clones share
/// the count, so one can be handed to a restore that takes it away.
#[derive(Clone, Default)]
pub struct Batches(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Batches {
    /// The batches counted so far.
    pub fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl super::Listener for Batches {
    fn on_start(&mut self, _: i64, _: i64) -> Result<(), String> {
        Ok(())
    }
    fn on_batch(&mut self, _: i64, _: u64) -> Result<(), String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
    fn on_end(&mut self, _: u64) -> Result<(), String> {
        Ok(())
    }
}
