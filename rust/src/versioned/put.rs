//! Kafka Streams' put procedure of a versioned key-value store
//! (`RocksDBVersionedStore.doPut` and the restore path around it), written
//! in Rust from its description: which version goes where when a record
//! arrives in order, out of order, as a tombstone, or too late.
//!
//! The store keeps, per key, the latest version in the reserved segment −1
//! (`ts ‖ value`; a latest tombstone is no entry there) and every older
//! version in the segment of its validTo (`validTo / segmentInterval`), in a
//! [`SegmentValue`]. Stream time is the largest timestamp put; a record
//! older than stream time − history retention (the grace period, equal to it)
//! is dropped, and segments older than `segmentId(streamTime − historyRetention)`
//! are dropped whole (Kafka deletes their key range).
//!
//! Kafka Streams keeps two things in memory only, and [`Versioned`] keeps
//! them the same way: stream time (from −1 at open) and the set of segments
//! it created since open; a put consults only those, and only those are
//! dropped when they expire (segments written before a restart are neither
//! read nor dropped until a put creates their id again).
//!
//! The store is read and written through [`Backing`] (a RocksDB with a
//! write overlay in [`super::VersionedStore`], a map in the tests), with
//! physical keys `segmentId (8 bytes BE) ‖ key`.

use std::collections::BTreeSet;

use super::segment_value::{min_timestamp, next_timestamp, SegmentValue};

/// Segment id of the latest values (Kafka's reserved segment −1, prefix FF×8).
pub const LATEST_SEGMENT: i64 = -1;

/// The physical key of `key` in segment `id`.
pub fn physical_key(id: i64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// Where a versioned store's rows are read and written.
pub trait Backing {
    /// The value at a physical key.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String>;
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>);
    fn delete(&mut self, key: Vec<u8>);
    /// Delete every row of segment `id` (Kafka's `deleteRange` over its prefix).
    fn drop_segment(&mut self, id: i64);
}

/// A changelog record of a versioned store: key, value (None: a tombstone), timestamp.
pub type Record<'a> = (&'a [u8], Option<&'a [u8]>, i64);

/// What a put did with its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Written (into the latest values or a segment).
    Written,
    /// Older than stream time − grace: never written (as Kafka Streams drops it).
    Expired,
    /// It could only go to a segment that has expired: nothing written.
    NotPut,
}

/// The put logic and the state Kafka Streams keeps in memory for a store.
#[derive(Debug, Clone)]
pub struct Versioned {
    history_retention_ms: i64,
    segment_interval_ms: i64,
    /// Kafka's `observedStreamTime` (−1, `NO_TIMESTAMP`, at open).
    stream_time: i64,
    /// Segments created since open (Kafka's in-memory segment map).
    segments: BTreeSet<i64>,
}

/// The default segment interval of `Stores.persistentVersionedKeyValueStore`
/// for a history retention (Kafka's `RocksDbVersionedKeyValueBytesStoreSupplier`).
pub fn default_segment_interval(history_retention_ms: i64) -> i64 {
    let hr = history_retention_ms;
    if hr <= 60_000 {
        (hr / 3).max(2_000)
    } else if hr <= 300_000 {
        (hr / 5).max(20_000)
    } else if hr <= 3_600_000 {
        (hr / 12).max(60_000)
    } else {
        (hr / 24).max(300_000)
    }
}

impl Versioned {
    /// A store just opened: no stream time, no segment known.
    pub fn new(history_retention_ms: i64, segment_interval_ms: i64) -> Self {
        Self { history_retention_ms, segment_interval_ms, stream_time: -1, segments: BTreeSet::new() }
    }

    pub fn stream_time(&self) -> i64 {
        self.stream_time
    }

    pub fn segment_id(&self, ts: i64) -> i64 {
        ts / self.segment_interval_ms
    }

    /// Restore one batch of changelog records `(key, value or tombstone,
    /// timestamp)` in offset order, as Kafka Streams' `restoreBatch` does:
    /// stream time at the batch's end decides which segments are live for
    /// every put of the batch, the drop of a late record uses stream time as
    /// it advances record by record. A batch of one record is exactly what
    /// the store's own `put` wrote while processing.
    pub fn restore_batch(&mut self, b: &mut dyn Backing, records: &[Record<'_>]) -> Result<Vec<Put>, String> {
        let end_of_batch = records.iter().fold(self.stream_time, |t, r| t.max(r.2));
        let mut out = Vec::with_capacity(records.len());
        for &(key, value, ts) in records {
            if ts < self.stream_time.saturating_sub(self.history_retention_ms) {
                out.push(Put::Expired);
                continue;
            }
            self.stream_time = self.stream_time.max(ts);
            out.push(self.do_put(b, end_of_batch, key, value, ts)?);
        }
        Ok(out)
    }

    /// Put one record as the store's `put`/`delete` does while processing.
    pub fn put(&mut self, b: &mut dyn Backing, key: &[u8], value: Option<&[u8]>, ts: i64) -> Result<Put, String> {
        Ok(self.restore_batch(b, &[(key, value, ts)])?[0])
    }

    fn min_live_segment(&self, stream_time: i64) -> i64 {
        self.segment_id(stream_time.saturating_sub(self.history_retention_ms))
    }

    /// Kafka's `getOrCreateSegmentIfLive`: the segment, known from now on,
    /// or None when it has expired at `stream_time`.
    fn live_segment(&mut self, id: i64, stream_time: i64) -> Result<Option<i64>, String> {
        if id < self.min_live_segment(stream_time) {
            return Ok(None);
        }
        if id < 0 {
            return Err(format!("a record before the epoch (segment {id}) has no segment in a versioned store"));
        }
        self.segments.insert(id);
        Ok(Some(id))
    }

    fn drop_expired(&mut self, b: &mut dyn Backing, stream_time: i64) {
        let live = self.segments.split_off(&self.min_live_segment(stream_time));
        for id in std::mem::replace(&mut self.segments, live) {
            b.drop_segment(id);
        }
    }

    fn do_put(
        &mut self,
        b: &mut dyn Backing,
        stream_time: i64,
        key: &[u8],
        value: Option<&[u8]>,
        ts: i64,
    ) -> Result<Put, String> {
        self.drop_expired(b, stream_time);
        // The latest value: a newer record replaces it and moves it to the segment of its new validTo.
        let latest_key = physical_key(LATEST_SEGMENT, key);
        let mut found_ts: Option<i64> = None;
        if let Some(latest) = b.get(&latest_key)? {
            let latest_ts = i64::from_be_bytes(
                latest.get(..8).ok_or("a latest value shorter than its timestamp")?.try_into().expect("8 bytes"),
            );
            if ts >= latest_ts {
                if ts > latest_ts {
                    if let Some(id) = self.live_segment(self.segment_id(ts), stream_time)? {
                        let seg_key = physical_key(id, key);
                        let moved = Some(&latest[8..]);
                        let sv = match b.get(&seg_key)? {
                            None => SegmentValue::with_record(moved, latest_ts, ts),
                            Some(raw) => {
                                let mut sv = SegmentValue::decode(&raw)?;
                                sv.insert_as_latest(latest_ts, ts, moved)?;
                                sv
                            }
                        };
                        b.put(seg_key, sv.encode());
                    }
                }
                match value {
                    Some(v) => b.put(latest_key, latest_value(ts, v)),
                    None => b.delete(latest_key),
                }
                return Ok(Put::Written);
            }
            found_ts = Some(latest_ts);
        }
        // Older than the latest value (or no latest value): search the segments, newest first.
        let from = self.segment_id(ts);
        let candidates: Vec<i64> = self.segments.range(from..).rev().copied().collect();
        for id in candidates {
            let seg_key = physical_key(id, key);
            let Some(raw) = b.get(&seg_key)? else { continue };
            let (next, min) = header(&raw)?;
            if next <= ts {
                break; // neither this segment nor an older one holds a version the record splits
            }
            if min <= ts {
                return self.put_into(b, stream_time, id, &raw, key, value, ts);
            }
            if min < stream_time.saturating_sub(self.history_retention_ms) {
                return Ok(Put::NotPut); // it would only make expired history
            }
            found_ts = Some(min);
        }
        self.finish(b, stream_time, key, value, ts, found_ts)
    }

    /// The record falls within the versions of segment `id` (`min <= ts < next`).
    #[allow(clippy::too_many_arguments)]
    fn put_into(
        &mut self,
        b: &mut dyn Backing,
        stream_time: i64,
        id: i64,
        raw: &[u8],
        key: &[u8],
        value: Option<&[u8]>,
        ts: i64,
    ) -> Result<Put, String> {
        let own = self.segment_id(ts);
        let mut sv = SegmentValue::decode(raw)?;
        let found = sv.find(ts)?;
        if found.valid_from == ts {
            // a new value for an existing version: nothing moves
            sv.update(ts, value, found.index)?;
        } else if own != id {
            // the version the record splits now ends at ts: it belongs to an older segment
            if let Some(older) = self.live_segment(own, stream_time)? {
                let older_key = physical_key(older, key);
                let osv = match b.get(&older_key)? {
                    None => SegmentValue::with_record(found.value.as_deref(), found.valid_from, ts),
                    Some(oraw) => {
                        let mut osv = SegmentValue::decode(&oraw)?;
                        osv.insert_as_latest(found.valid_from, ts, found.value.as_deref())?;
                        osv
                    }
                };
                b.put(older_key, osv.encode());
            }
            sv.update(ts, value, found.index)?;
        } else {
            sv.insert(ts, value, found.index)?;
        }
        b.put(physical_key(id, key), sv.encode());
        Ok(Put::Written)
    }

    /// No segment holds a version the record splits: it is the latest
    /// (`found_ts` None) or valid up to `found_ts`, the oldest validFrom seen.
    fn finish(
        &mut self,
        b: &mut dyn Backing,
        stream_time: i64,
        key: &[u8],
        value: Option<&[u8]>,
        ts: i64,
        found_ts: Option<i64>,
    ) -> Result<Put, String> {
        match found_ts {
            None => {
                if let Some(v) = value {
                    b.put(physical_key(LATEST_SEGMENT, key), latest_value(ts, v));
                    return Ok(Put::Written);
                }
                // A latest tombstone lives in the segment of its own timestamp.
                let Some(id) = self.live_segment(self.segment_id(ts), stream_time)? else {
                    return Ok(Put::NotPut);
                };
                let seg_key = physical_key(id, key);
                let sv = match b.get(&seg_key)? {
                    None => SegmentValue::with_record(None, ts, ts),
                    Some(raw) => {
                        let (next, _) = header(&raw)?;
                        if next == ts {
                            return Ok(Put::Written); // the segment already ends at this tombstone
                        }
                        let mut sv = SegmentValue::decode(&raw)?;
                        sv.insert_as_latest(next, ts, None)?;
                        sv
                    }
                };
                b.put(seg_key, sv.encode());
            }
            Some(valid_to) => {
                let Some(id) = self.live_segment(self.segment_id(valid_to), stream_time)? else {
                    return Ok(Put::NotPut);
                };
                let seg_key = physical_key(id, key);
                let sv = match b.get(&seg_key)? {
                    None => SegmentValue::with_record(value, ts, valid_to),
                    Some(raw) => {
                        let (next, _) = header(&raw)?;
                        let mut sv = SegmentValue::decode(&raw)?;
                        if next <= ts {
                            // after a degenerate value's gap: the newest of the segment
                            sv.insert_as_latest(ts, valid_to, value)?;
                        } else {
                            sv.insert_as_earliest(ts, value)?;
                        }
                        sv
                    }
                };
                b.put(seg_key, sv.encode());
            }
        }
        Ok(Put::Written)
    }
}

/// A latest value: `ts (8 BE) ‖ value`.
fn latest_value(ts: i64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + value.len());
    v.extend_from_slice(&ts.to_be_bytes());
    v.extend_from_slice(value);
    v
}

fn header(raw: &[u8]) -> Result<(i64, i64), String> {
    match (next_timestamp(raw), min_timestamp(raw)) {
        (Some(n), Some(m)) => Ok((n, m)),
        _ => Err(format!("a versioned segment value of {} bytes is shorter than its header", raw.len())),
    }
}

/// A versioned store's rows in a map (the tests' and the fuzz target's store).
#[cfg(any(test, feature = "fuzzing"))]
#[derive(Default, Clone, PartialEq, Eq, Debug)]
pub struct MemoryBacking(pub std::collections::BTreeMap<Vec<u8>, Vec<u8>>);

#[cfg(any(test, feature = "fuzzing"))]
impl Backing for MemoryBacking {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Ok(self.0.get(key).cloned())
    }
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.0.insert(key, value);
    }
    fn delete(&mut self, key: Vec<u8>) {
        self.0.remove(&key);
    }
    fn drop_segment(&mut self, id: i64) {
        let prefix = id.to_be_bytes();
        self.0.retain(|k, _| !k.starts_with(&prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Map = MemoryBacking;

    /// What a query sees.
    impl MemoryBacking {
        fn latest(&self, key: &[u8]) -> Option<(i64, Vec<u8>)> {
            self.0
                .get(&physical_key(LATEST_SEGMENT, key))
                .map(|v| (i64::from_be_bytes(v[..8].try_into().unwrap()), v[8..].to_vec()))
        }
        fn segment(&self, id: i64, key: &[u8]) -> Option<SegmentValue> {
            self.0.get(&physical_key(id, key)).map(|raw| SegmentValue::decode(raw).unwrap())
        }
        fn segment_ids(&self) -> Vec<i64> {
            let mut ids: Vec<i64> = self.0.keys().map(|k| i64::from_be_bytes(k[..8].try_into().unwrap())).collect();
            ids.dedup();
            ids
        }
        /// The value valid at `as_of` (Kafka's `get(key, asOfTimestamp)` within history retention).
        fn get_as_of(&self, key: &[u8], as_of: i64) -> Option<Vec<u8>> {
            if let Some((ts, v)) = self.latest(key) {
                if ts <= as_of {
                    return Some(v);
                }
            }
            let mut ids = self.segment_ids();
            ids.retain(|&id| id >= 0);
            for id in ids.into_iter().rev() {
                let Some(sv) = self.segment(id, key) else { continue };
                if sv.next_ts() <= as_of {
                    return None;
                }
                if sv.min_ts() > as_of {
                    continue;
                }
                return sv.find(as_of).unwrap().value;
            }
            None
        }
    }

    fn v(s: &str) -> Option<&[u8]> {
        Some(s.as_bytes())
    }

    #[test]
    fn in_order_puts_move_each_latest_value_to_the_segment_of_its_valid_to() {
        let (mut m, mut s) = (Map::default(), Versioned::new(10_000, 1_000));
        for (ts, val) in [(100, "a"), (600, "b"), (1_500, "c"), (1_700, "d")] {
            assert_eq!(s.put(&mut m, b"k", v(val), ts).unwrap(), Put::Written);
        }
        assert_eq!(m.latest(b"k"), Some((1_700, b"d".to_vec())));
        assert_eq!(m.segment(0, b"k").unwrap().versions(), &[(100, Some(b"a".to_vec()))], "a ended at 600");
        let s1 = m.segment(1, b"k").unwrap();
        assert_eq!(s1.versions(), &[(1_500, Some(b"c".to_vec())), (600, Some(b"b".to_vec()))]);
        assert_eq!((s1.min_ts(), s1.next_ts()), (600, 1_700));
        for (at, want) in [(99, None), (100, v("a")), (599, v("a")), (600, v("b")), (1_600, v("c")), (9_999, v("d"))] {
            assert_eq!(m.get_as_of(b"k", at).as_deref(), want, "as of {at}");
        }
    }

    #[test]
    fn out_of_order_puts_land_between_versions_and_in_older_segments() {
        let (mut m, mut s) = (Map::default(), Versioned::new(10_000, 1_000));
        s.put(&mut m, b"k", v("a"), 100).unwrap();
        s.put(&mut m, b"k", v("c"), 2_500).unwrap();
        // older than the latest: a ends at 1_200 now, so goes to segment 1
        s.put(&mut m, b"k", v("b"), 1_200).unwrap();
        // older than everything: valid until 100
        s.put(&mut m, b"k", v("z"), 50).unwrap();
        // the same timestamp as an existing version replaces its value
        s.put(&mut m, b"k", v("B"), 1_200).unwrap();
        for (at, want) in [(49, None), (50, v("z")), (100, v("a")), (1_199, v("a")), (1_200, v("B")), (2_500, v("c"))] {
            assert_eq!(m.get_as_of(b"k", at).as_deref(), want, "as of {at}");
        }
        // a put splitting a version of segment 2 whose own segment is 1: the split version moves to 1
        let (mut m2, mut s2) = (Map::default(), Versioned::new(10_000, 1_000));
        s2.put(&mut m2, b"k", v("a"), 500).unwrap();
        s2.put(&mut m2, b"k", v("b"), 2_100).unwrap(); // a: 500..2_100 in segment 2
        s2.put(&mut m2, b"k", v("c"), 3_000).unwrap();
        s2.put(&mut m2, b"k", v("x"), 1_100).unwrap(); // a now ends at 1_100 -> segment 1
        assert_eq!(m2.segment(1, b"k").unwrap().versions(), &[(500, Some(b"a".to_vec()))]);
        assert_eq!(m2.segment(3, b"k").unwrap().versions(), &[(2_100, Some(b"b".to_vec()))]);
        assert_eq!(m2.segment(2, b"k").unwrap().versions(), &[(1_100, Some(b"x".to_vec()))]);
        for (at, want) in [(500, v("a")), (1_100, v("x")), (2_099, v("x")), (2_100, v("b")), (3_000, v("c"))] {
            assert_eq!(m2.get_as_of(b"k", at).as_deref(), want, "as of {at}");
        }
    }

    #[test]
    fn tombstones_end_versions_and_a_latest_tombstone_is_a_degenerate_segment_value() {
        let (mut m, mut s) = (Map::default(), Versioned::new(10_000, 1_000));
        s.put(&mut m, b"k", None, 1_300).unwrap(); // nothing before: degenerate in segment 1
        let d = m.segment(1, b"k").unwrap();
        assert_eq!((d.min_ts(), d.next_ts(), d.versions()), (1_300, 1_300, &[(1_300, None)][..]));
        s.put(&mut m, b"k", None, 1_300).unwrap(); // the same tombstone again: unchanged
        assert_eq!(m.segment(1, b"k").unwrap(), d);
        s.put(&mut m, b"k", v("a"), 1_100).unwrap(); // earlier than the tombstone: valid until 1_300
        assert_eq!(m.segment(1, b"k").unwrap().versions(), &[(1_100, Some(b"a".to_vec()))]);
        s.put(&mut m, b"k", v("b"), 1_400).unwrap(); // after it: latest, the gap stays a tombstone
        s.put(&mut m, b"k", None, 1_600).unwrap(); // delete: b moves into segment 1, no latest value
        assert_eq!(m.latest(b"k"), None);
        for (at, want) in [(1_099, None), (1_100, v("a")), (1_300, None), (1_400, v("b")), (1_600, None)] {
            assert_eq!(m.get_as_of(b"k", at).as_deref(), want, "as of {at}");
        }
        // a tombstone after a segment's versions, with no latest value: the gap becomes a tombstone
        s.put(&mut m, b"k", None, 1_900).unwrap();
        assert_eq!(m.segment(1, b"k").unwrap().next_ts(), 1_900);
    }

    #[test]
    fn late_records_are_dropped_and_expired_segments_deleted() {
        let (mut m, mut s) = (Map::default(), Versioned::new(2_000, 1_000));
        s.put(&mut m, b"k", v("a"), 100).unwrap();
        s.put(&mut m, b"k", v("b"), 500).unwrap(); // a -> segment 0
        s.put(&mut m, b"j", v("x"), 900).unwrap();
        assert!(m.segment(0, b"k").is_some());
        s.put(&mut m, b"k", v("c"), 3_500).unwrap(); // stream time 3_500: segment 0 (< 1) dropped
        assert_eq!(m.segment(0, b"k"), None, "segment 0 expired and was deleted");
        assert_eq!(m.latest(b"j"), Some((900, b"x".to_vec())), "latest values never expire");
        assert_eq!(s.put(&mut m, b"k", v("late"), 1_400).unwrap(), Put::Expired, "older than 3_500 - 2_000");
        assert_eq!(m.segment(3, b"k").unwrap().versions(), &[(500, Some(b"b".to_vec()))]);
        // within grace but splitting history that would land in an expired segment: b's tail
        s.put(&mut m, b"k", v("d"), 1_600).unwrap();
        assert_eq!(m.get_as_of(b"k", 1_600).as_deref(), v("d"));
        assert_eq!(m.segment(1, b"k").unwrap().versions(), &[(500, Some(b"b".to_vec()))], "b moved to segment 1");
    }

    #[test]
    fn segments_roll_over_as_stream_time_advances() {
        let (mut m, mut s) = (Map::default(), Versioned::new(3_000, 1_000));
        for i in 0..50i64 {
            s.put(&mut m, b"k", Some(format!("{i}").as_bytes()), i * 250).unwrap();
        }
        // stream time 12_250: live segments >= (12_250 - 3_000) / 1_000 = 9
        let ids = m.segment_ids();
        assert_eq!(ids, vec![9, 10, 11, 12, LATEST_SEGMENT], "the latest values' prefix FF×8 sorts last");
        for at in [9_250, 10_000, 12_000] {
            assert_eq!(m.get_as_of(b"k", at), Some(format!("{}", at / 250).into_bytes()), "as of {at}");
        }
    }

    #[test]
    fn a_batch_differs_from_record_by_record_only_in_expired_history() {
        // Kafka's restore decides liveness with the stream time at the batch's end.
        let recs: Vec<(Vec<u8>, Option<Vec<u8>>, i64)> = (0..400)
            .map(|i: i64| {
                let ts = i * 37 + (i % 7) * 400 - (i % 5) * 900; // out of order
                let val = if i % 11 == 0 { None } else { Some(format!("v{i}").into_bytes()) };
                (format!("k{}", i % 9).into_bytes(), val, ts.max(0))
            })
            .collect();
        let view: Vec<Record<'_>> = recs.iter().map(|(k, v, t)| (&k[..], v.as_deref(), *t)).collect();
        let (mut one, mut by_one) = (Map::default(), Versioned::new(2_500, 800));
        for r in &view {
            by_one.restore_batch(&mut one, std::slice::from_ref(r)).unwrap();
        }
        for size in [7, 64, 400] {
            let (mut m, mut s) = (Map::default(), Versioned::new(2_500, 800));
            for batch in view.chunks(size) {
                s.restore_batch(&mut m, batch).unwrap();
            }
            assert_eq!(s.stream_time(), by_one.stream_time());
            let horizon = s.stream_time() - 2_500;
            for k in 0..9 {
                let key = format!("k{k}").into_bytes();
                assert_eq!(m.latest(&key), one.latest(&key), "batches of {size}: latest of k{k}");
                for at in horizon..=s.stream_time() + 10 {
                    assert_eq!(m.get_as_of(&key, at), one.get_as_of(&key, at), "batches of {size}: k{k} as of {at}");
                }
            }
        }
    }

    #[test]
    fn a_batch_leaves_out_a_version_that_is_expired_at_its_end() {
        let recs: [Record<'_>; 4] =
            [(b"k", v("a"), 1_500), (b"k", v("b"), 1_800), (b"k", v("x"), 1_200), (b"j", v("z"), 2_600)];
        let (mut one, mut by_one) = (Map::default(), Versioned::new(1_000, 1_000));
        for r in &recs {
            by_one.restore_batch(&mut one, std::slice::from_ref(r)).unwrap();
        }
        let (mut two, mut batches) = (Map::default(), Versioned::new(1_000, 1_000));
        batches.restore_batch(&mut two, &recs[..2]).unwrap();
        // x (1_200..1_500) ends before 2_600 - 1_000: not put with the batch's stream time
        assert_eq!(batches.restore_batch(&mut two, &recs[2..]).unwrap(), vec![Put::NotPut, Put::Written]);
        assert_eq!(
            one.segment(1, b"k").unwrap().versions(),
            &[(1_500, Some(b"a".to_vec())), (1_200, Some(b"x".to_vec()))]
        );
        assert_eq!(two.segment(1, b"k").unwrap().versions(), &[(1_500, Some(b"a".to_vec()))]);
        for at in 1_600..2_700 {
            assert_eq!(one.get_as_of(b"k", at), two.get_as_of(b"k", at), "as of {at}");
        }
    }

    #[test]
    fn the_default_segment_interval_follows_kafka() {
        for (hr, want) in [
            (1_000, 2_000),
            (60_000, 20_000),
            (61_000, 20_000),
            (300_000, 60_000),
            (600_000, 60_000),
            (3_600_000, 300_000),
            (86_400_000, 3_600_000),
        ] {
            assert_eq!(default_segment_interval(hr), want, "history retention {hr}");
        }
    }
}
