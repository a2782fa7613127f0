//! The value of one key in one segment of a versioned store: every version of
//! the key whose validity ends in that segment's time range, in the byte
//! layout of Kafka Streams' `RocksDBVersionedStoreSegmentValueFormatter`
//! (written here from its description, not copied):
//!
//! ```text
//! next_ts (8 BE) ‖ min_ts (8 BE) ‖ [ts (8 BE) ‖ size (4 BE)] newest first ‖ values, oldest first
//! ```
//!
//! `next_ts` is the validTo of the newest version, `min_ts` the validFrom of
//! the oldest; each version is valid from its `ts` to the `ts` of the version
//! before it in the table (the newest to `next_ts`). A size of −1 is a
//! tombstone (no value bytes). A *degenerate* value has `next_ts == min_ts`
//! and holds a single tombstone: the latest version of a key is a delete and
//! its segment held nothing else for the key.
//!
//! [`SegmentValue`] keeps the versions decoded and re-encodes them in the
//! same canonical layout, so every operation gives the bytes Kafka Streams'
//! formatter gives; the operations and their edge cases (gaps that become
//! tombstones, replacing a version at its timestamp, the recovery that
//! truncates versions at or after a new latest one) follow Kafka's.

/// Bytes of a timestamp.
const TS: usize = 8;
/// Bytes of a value size.
const SIZE: usize = 4;
/// Bytes of the header (`next_ts ‖ min_ts`).
const HEADER: usize = 2 * TS;

/// One version: its validFrom and its value (None: a tombstone).
pub type Version = (i64, Option<Vec<u8>>);

/// A segment value's `next_ts` (the validTo of its newest version), if it is
/// long enough to have one.
pub fn next_timestamp(raw: &[u8]) -> Option<i64> {
    raw.get(..TS).map(|b| i64::from_be_bytes(b.try_into().expect("8 bytes")))
}

/// A segment value's `min_ts` (the validFrom of its oldest version).
pub fn min_timestamp(raw: &[u8]) -> Option<i64> {
    raw.get(TS..HEADER).map(|b| i64::from_be_bytes(b.try_into().expect("8 bytes")))
}

/// Where a timestamp falls among a segment value's versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Index of the version in the table (0 is the newest).
    pub index: usize,
    pub valid_from: i64,
    pub valid_to: i64,
    /// The version's value (None: a tombstone).
    pub value: Option<Vec<u8>>,
}

/// The versions of one key in one segment, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentValue {
    next_ts: i64,
    min_ts: i64,
    /// As Kafka's formatter tracks it: set when decoded or (re)initialised,
    /// `next_ts == min_ts` then.
    degenerate: bool,
    /// Newest first; timestamps strictly decreasing, the last one `min_ts`.
    versions: Vec<Version>,
}

impl SegmentValue {
    /// A value holding one version, valid from `valid_from` to `valid_to`
    /// (degenerate when they are equal: then `value` is a tombstone).
    pub fn with_record(value: Option<&[u8]>, valid_from: i64, valid_to: i64) -> Self {
        Self {
            next_ts: valid_to,
            min_ts: valid_from,
            degenerate: valid_to == valid_from,
            versions: vec![(valid_from, value.map(<[u8]>::to_vec))],
        }
    }

    /// Decode `raw`; an error says what is wrong with the bytes.
    pub fn decode(raw: &[u8]) -> Result<Self, String> {
        let bad = |what: &str| format!("a versioned segment value of {} bytes {what}", raw.len());
        let (Some(next_ts), Some(min_ts)) = (next_timestamp(raw), min_timestamp(raw)) else {
            return Err(bad("is shorter than its 16-byte header"));
        };
        let mut table = Vec::new();
        let mut at = HEADER;
        let mut value_bytes = 0usize;
        // Entries up to the one at min_ts, as Kafka's reader stops there.
        loop {
            let Some(entry) = raw.get(at..at + TS + SIZE) else {
                return Err(bad(&format!("ends before the version at its min timestamp {min_ts}")));
            };
            let ts = i64::from_be_bytes(entry[..TS].try_into().expect("8 bytes"));
            let size = i32::from_be_bytes(entry[TS..].try_into().expect("4 bytes"));
            if size < -1 {
                return Err(bad(&format!("has a value size of {size}")));
            }
            if let Some(&(prev, _)) = table.last() {
                if ts >= prev {
                    return Err(bad("has version timestamps out of order"));
                }
            }
            value_bytes += size.max(0) as usize;
            table.push((ts, size));
            at += TS + SIZE;
            if ts == min_ts {
                break;
            }
            if ts < min_ts {
                return Err(bad(&format!("has no version at its min timestamp {min_ts}")));
            }
        }
        if raw.len() != at + value_bytes {
            return Err(bad(&format!("should be {} bytes for its {} versions", at + value_bytes, table.len())));
        }
        // Values are stored oldest first: the newest version's value is last.
        let mut end = raw.len();
        let versions = table
            .into_iter()
            .map(|(ts, size)| {
                if size < 0 {
                    return (ts, None);
                }
                let start = end - size as usize;
                let v = raw[start..end].to_vec();
                end = start;
                (ts, Some(v))
            })
            .collect();
        Ok(Self { next_ts, min_ts, degenerate: next_ts == min_ts, versions })
    }

    /// The bytes of this value (Kafka's layout, see the module documentation).
    pub fn encode(&self) -> Vec<u8> {
        let values: usize = self.versions.iter().map(|(_, v)| v.as_ref().map_or(0, Vec::len)).sum();
        let mut out = Vec::with_capacity(HEADER + self.versions.len() * (TS + SIZE) + values);
        out.extend_from_slice(&self.next_ts.to_be_bytes());
        out.extend_from_slice(&self.min_ts.to_be_bytes());
        for (ts, v) in &self.versions {
            out.extend_from_slice(&ts.to_be_bytes());
            let size = v.as_ref().map_or(-1, |v| v.len() as i32);
            out.extend_from_slice(&size.to_be_bytes());
        }
        for (_, v) in self.versions.iter().rev() {
            if let Some(v) = v {
                out.extend_from_slice(v);
            }
        }
        out
    }

    pub fn next_ts(&self) -> i64 {
        self.next_ts
    }

    pub fn min_ts(&self) -> i64 {
        self.min_ts
    }

    /// The versions, newest first.
    pub fn versions(&self) -> &[Version] {
        &self.versions
    }

    /// The version valid at `ts` (`min_ts <= ts < next_ts`, else an error,
    /// as Kafka's formatter refuses it).
    pub fn find(&self, ts: i64) -> Result<Found, String> {
        if ts < self.min_ts || ts >= self.next_ts {
            return Err(format!(
                "timestamp {ts} is outside the segment value's range [{}, {})",
                self.min_ts, self.next_ts
            ));
        }
        let mut valid_to = self.next_ts;
        for (index, (from, value)) in self.versions.iter().enumerate() {
            if *from <= ts {
                return Ok(Found { index, valid_from: *from, valid_to, value: value.clone() });
            }
            valid_to = *from;
        }
        Err(format!("no version of the segment value is valid at {ts}"))
    }

    /// Add a version newer than all others, valid from `valid_from` to
    /// `valid_to`. A gap after the newest version becomes a tombstone; a
    /// `valid_from` before `next_ts` (a write Kafka Streams lost half-way)
    /// first drops the versions it overlaps, as Kafka's recovery does.
    pub fn insert_as_latest(&mut self, valid_from: i64, valid_to: i64, value: Option<&[u8]>) -> Result<(), String> {
        if valid_from < self.next_ts {
            self.truncate_to(valid_from)?;
        }
        if self.next_ts == valid_from {
            if self.degenerate {
                self.init(value, valid_from, valid_to);
            } else {
                self.insert_at(0, valid_from, value.map(<[u8]>::to_vec))?;
            }
        } else {
            if self.degenerate {
                let next = self.next_ts;
                self.init(None, next, valid_from);
            } else {
                self.insert_at(0, self.next_ts, None)?;
            }
            self.insert_at(0, valid_from, value.map(<[u8]>::to_vec))?;
        }
        self.next_ts = valid_to;
        Ok(())
    }

    /// Add a version older than all others, valid from `ts` to the oldest's
    /// validFrom (a degenerate value is replaced by it, valid to `next_ts`).
    pub fn insert_as_earliest(&mut self, ts: i64, value: Option<&[u8]>) -> Result<(), String> {
        if self.degenerate {
            let next = self.next_ts;
            self.init(value, ts, next);
            Ok(())
        } else {
            self.insert_at(self.versions.len(), ts, value.map(<[u8]>::to_vec))
        }
    }

    /// Add a version at `index` of the table (found by [`SegmentValue::find`]).
    pub fn insert(&mut self, ts: i64, value: Option<&[u8]>, index: usize) -> Result<(), String> {
        self.insert_at(index, ts, value.map(<[u8]>::to_vec))
    }

    /// Replace the version at `index` (its timestamp and value).
    pub fn update(&mut self, ts: i64, value: Option<&[u8]>, index: usize) -> Result<(), String> {
        if index >= self.versions.len() {
            return Err(format!("no version at index {index} of {}", self.versions.len()));
        }
        if index + 1 == self.versions.len() {
            self.min_ts = ts;
        }
        self.versions[index] = (ts, value.map(<[u8]>::to_vec));
        Ok(())
    }

    fn insert_at(&mut self, index: usize, ts: i64, value: Option<Vec<u8>>) -> Result<(), String> {
        if self.degenerate || index > self.versions.len() {
            return Err(format!("cannot insert at index {index} of a degenerate segment value or past its end"));
        }
        if index == self.versions.len() {
            self.min_ts = ts;
        }
        self.versions.insert(index, (ts, value));
        Ok(())
    }

    fn init(&mut self, value: Option<&[u8]>, valid_from: i64, valid_to: i64) {
        *self = Self::with_record(value, valid_from, valid_to);
    }

    /// Drop the versions valid at or after `ts` (they were written by a put
    /// that a newer version contradicts) and end the rest at `ts`.
    fn truncate_to(&mut self, ts: i64) -> Result<(), String> {
        if ts <= self.min_ts {
            self.init(None, ts, ts);
            return Ok(());
        }
        let found = self.find(ts)?;
        let drop = found.index + usize::from(found.valid_from == ts);
        self.versions.drain(..drop);
        self.next_ts = ts;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn be(ts: i64, size: i32) -> Vec<u8> {
        let mut v = ts.to_be_bytes().to_vec();
        v.extend_from_slice(&size.to_be_bytes());
        v
    }

    #[test]
    fn the_layout_is_header_table_newest_first_and_values_oldest_first() {
        let mut sv = SegmentValue::with_record(Some(b"a"), 10, 20);
        sv.insert_as_latest(20, 30, Some(b"bb")).unwrap();
        sv.insert_as_latest(30, 40, None).unwrap();
        let mut want = Vec::new();
        want.extend_from_slice(&40i64.to_be_bytes());
        want.extend_from_slice(&10i64.to_be_bytes());
        want.extend(be(30, -1));
        want.extend(be(20, 2));
        want.extend(be(10, 1));
        want.extend_from_slice(b"abb");
        assert_eq!(sv.encode(), want);
        assert_eq!(SegmentValue::decode(&want).unwrap(), sv);
        assert_eq!((next_timestamp(&want), min_timestamp(&want)), (Some(40), Some(10)));
    }

    #[test]
    fn find_gives_the_version_valid_at_a_time_and_refuses_times_outside() {
        let mut sv = SegmentValue::with_record(Some(b"a"), 10, 20);
        sv.insert_as_latest(25, 30, Some(b"c")).unwrap(); // a gap 20..25: a tombstone
        assert_eq!(sv.versions(), &[(25, Some(b"c".to_vec())), (20, None), (10, Some(b"a".to_vec()))]);
        assert_eq!(sv.find(12).unwrap(), Found { index: 2, valid_from: 10, valid_to: 20, value: Some(b"a".to_vec()) });
        assert_eq!(sv.find(20).unwrap(), Found { index: 1, valid_from: 20, valid_to: 25, value: None });
        assert_eq!(sv.find(29).unwrap().index, 0);
        assert!(sv.find(30).is_err() && sv.find(9).is_err());
    }

    #[test]
    fn earliest_insert_and_update_move_the_min_timestamp() {
        let mut sv = SegmentValue::with_record(Some(b"b"), 10, 20);
        sv.insert_as_earliest(5, Some(b"a")).unwrap();
        assert_eq!((sv.min_ts(), sv.next_ts()), (5, 20));
        sv.update(7, Some(b"A"), 1).unwrap();
        assert_eq!(sv.min_ts(), 7);
        sv.insert(15, None, 0).unwrap();
        assert_eq!(sv.versions(), &[(15, None), (10, Some(b"b".to_vec())), (7, Some(b"A".to_vec()))]);
        let round = SegmentValue::decode(&sv.encode()).unwrap();
        assert_eq!(round, sv);
    }

    #[test]
    fn a_degenerate_value_is_one_tombstone_and_is_replaced_by_what_follows() {
        let d = SegmentValue::with_record(None, 50, 50);
        assert_eq!(d.encode(), [50i64.to_be_bytes().to_vec(), 50i64.to_be_bytes().to_vec(), be(50, -1)].concat());
        let decoded = SegmentValue::decode(&d.encode()).unwrap();
        assert!(decoded.degenerate);
        // insert as latest at next_ts: the tombstone goes, the new version stays
        let mut a = decoded.clone();
        a.insert_as_latest(50, 60, Some(b"x")).unwrap();
        assert_eq!((a.versions(), a.min_ts(), a.next_ts()), (&[(50, Some(b"x".to_vec()))][..], 50, 60));
        // after a gap: the gap is the tombstone, valid from the old next_ts
        let mut b = decoded.clone();
        b.insert_as_latest(55, 60, Some(b"x")).unwrap();
        assert_eq!(b.versions(), &[(55, Some(b"x".to_vec())), (50, None)]);
        assert_eq!((b.min_ts(), b.next_ts()), (50, 60));
        // as earliest: one version, valid to the old next_ts
        let mut c = decoded;
        c.insert_as_earliest(40, Some(b"y")).unwrap();
        assert_eq!((c.versions(), c.min_ts(), c.next_ts()), (&[(40, Some(b"y".to_vec()))][..], 40, 50));
    }

    #[test]
    fn a_latest_insert_before_next_ts_truncates_as_kafka_recovers() {
        let mut sv = SegmentValue::with_record(Some(b"a"), 10, 20);
        sv.insert_as_latest(20, 30, Some(b"b")).unwrap();
        // a version from 25 contradicts the end at 30: b is cut at 25
        let mut cut = sv.clone();
        cut.insert_as_latest(25, 40, Some(b"c")).unwrap();
        assert_eq!(cut.versions(), &[(25, Some(b"c".to_vec())), (20, Some(b"b".to_vec())), (10, Some(b"a".to_vec()))]);
        // a version from 20 replaces b
        let mut replaced = sv.clone();
        replaced.insert_as_latest(20, 40, Some(b"c")).unwrap();
        assert_eq!(replaced.versions(), &[(20, Some(b"c".to_vec())), (10, Some(b"a".to_vec()))]);
        // at or before min_ts: nothing survives but the new version (after a degenerate reset)
        let mut all = sv;
        all.insert_as_latest(10, 40, Some(b"c")).unwrap();
        assert_eq!((all.versions(), all.min_ts()), (&[(10, Some(b"c".to_vec()))][..], 10));
    }

    #[test]
    fn bad_bytes_are_refused_with_what_is_wrong() {
        assert!(SegmentValue::decode(&[0; 15]).unwrap_err().contains("header"));
        let good = SegmentValue::with_record(Some(b"abc"), 1, 2).encode();
        assert!(SegmentValue::decode(&good[..good.len() - 1]).unwrap_err().contains("should be"));
        let mut no_min = good.clone();
        no_min[8..16].copy_from_slice(&0i64.to_be_bytes());
        assert!(SegmentValue::decode(&no_min).is_err());
        let mut bad_size = good;
        bad_size[24..28].copy_from_slice(&(-2i32).to_be_bytes());
        assert!(SegmentValue::decode(&bad_size).unwrap_err().contains("size"));
        let empty_value = SegmentValue::with_record(Some(b""), 1, 2);
        assert_eq!(SegmentValue::decode(&empty_value.encode()).unwrap(), empty_value, "an empty value is no tombstone");
    }
}
