//! A versioned store opened for restoring ([`VersionedStore`]): the RocksDB,
//! written a chunk at a time through the put logic of [`super::put`].

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use rocksdb::{Options, WriteBatch};

use super::put::{Backing, Versioned};
use super::History;
use crate::restore::chunk::ChunkOps;
use crate::store::{Store, StoreError, StoreFormat};

/// What a restore holds between chunks: the put logic's in-memory state.
struct State {
    logic: Versioned,
}

/// A versioned store opened for restoring: the RocksDB and the put logic's
/// state, which lives as long as this handle (Kafka Streams' lives as long
/// as the store is open: from −1 stream time and no known segment).
pub struct VersionedStore {
    pub(crate) store: Store,
    history: History,
    state: Mutex<State>,
}

/// Reads through a chunk's writes to the RocksDB; what the chunk wrote and
/// the segments it dropped become one `WriteBatch`.
struct Overlay<'a> {
    store: &'a Store,
    writes: HashMap<Vec<u8>, Option<Vec<u8>>>,
    dropped: Vec<i64>,
    error: Option<String>,
}

impl Backing for Overlay<'_> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        self.store.db().get_cf(self.store.data_cf(), key).map_err(|e| format!("reading the store: {e}"))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.writes.insert(key, Some(value));
    }

    fn delete(&mut self, key: Vec<u8>) {
        self.writes.insert(key, None);
    }

    fn drop_segment(&mut self, id: i64) {
        let prefix = id.to_be_bytes();
        self.writes.retain(|k, _| !k.starts_with(&prefix));
        self.dropped.push(id);
    }
}

impl VersionedStore {
    /// Open (or create) the versioned store at `path`.
    pub fn open(path: &Path, opts: Options, history: History) -> Result<Self, StoreError> {
        let store = Store::open_format(path, opts, StoreFormat::Versioned)?;
        let logic = Versioned::new(history.history_retention_ms, history.segment_interval_ms);
        Ok(Self { store, history, state: Mutex::new(State { logic }) })
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn history(&self) -> History {
        self.history
    }

    /// Put every record of `ops` (in offset order, each with its timestamp)
    /// through the put logic, record by record, then write what changed and
    /// `tp -> offset` in one `WriteBatch`: expired segments' key ranges
    /// deleted first, then the rows in key order.
    pub fn write_chunk(&self, ops: &ChunkOps, tp: &str, offset: i64) -> Result<(), StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut overlay = Overlay { store: &self.store, writes: HashMap::new(), dropped: Vec::new(), error: None };
        for i in 0..ops.len() {
            let (key, value) = ops.get(i);
            let ts = ops.timestamp(i);
            if let Err(m) = state.logic.put(&mut overlay, key, value, ts) {
                overlay.error = Some(m);
                break;
            }
        }
        if let Some(m) = overlay.error {
            return Err(StoreError::new(
                self.store.path(),
                format!("versioned store: {m} (restoring {tp} in the chunk ending at offset {offset})"),
            ));
        }
        let cf = self.store.data_cf();
        let mut batch = WriteBatch::default();
        for id in &overlay.dropped {
            if let Some(next) = id.checked_add(1) {
                batch.delete_range_cf(cf, id.to_be_bytes(), next.to_be_bytes());
            }
        }
        let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = overlay.writes.into_iter().collect();
        writes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (k, v) in writes {
            match v {
                Some(v) => batch.put_cf(cf, k, v),
                None => batch.delete_cf(cf, k),
            }
        }
        self.store.put_offset(&mut batch, tp, offset);
        self.store.write(batch, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::restore_options;
    use crate::versioned::{put, segment_value};

    #[test]
    fn a_chunk_is_put_record_by_record_and_written_with_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("v");
        let h = History::new(2_000, Some(1_000)).unwrap();
        let vs = VersionedStore::open(&p, restore_options(), h).unwrap();
        let mut ops = ChunkOps::default();
        for (k, v, ts) in [("k", Some("a"), 100), ("k", Some("b"), 500), ("k", Some("c"), 3_500), ("k", None, 3_600)] {
            ops.push_versioned(k.as_bytes(), v.map(str::as_bytes), ts);
        }
        vs.write_chunk(&ops, "t-0", 3).unwrap();
        let rows: Vec<(Vec<u8>, Vec<u8>)> = vs
            .store()
            .db()
            .iterator_cf(vs.store().data_cf(), rocksdb::IteratorMode::Start)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap())
            .collect();
        // a went to segment 0, dropped once stream time reached 3_500; b (500..3_500) and
        // c (3_500..3_600) sit in segment 3; the delete left no latest value
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].0, put::physical_key(3, b"k"));
        let sv = segment_value::SegmentValue::decode(&rows[0].1).unwrap();
        assert_eq!(sv.versions(), &[(3_500, Some(b"c".to_vec())), (500, Some(b"b".to_vec()))]);
        assert_eq!(sv.next_ts(), 3_600);
        assert_eq!(vs.store().offset("t-0").unwrap(), Some(3));
        assert!(History::new(-1, None).is_err() && History::new(10, Some(0)).is_err());
        assert_eq!(History::new(60_000, None).unwrap().segment_interval_ms, 20_000);
    }
}
