//! Kafka Streams' versioned key-value stores
//! (`Stores.persistentVersionedKeyValueStore(name, historyRetention[, segmentInterval])`):
//! every version of a key within the history retention, queryable as of a
//! time.
//!
//! On disk it is one RocksDB at `<task>/rocksdb/<store>` with the column
//! families `default` and `offsets`, like a plain key-value store; its
//! *logical* segments are key prefixes in `default`: `segmentId (8 bytes BE)
//! ‖ key`. The latest value of a key sits under the reserved segment −1
//! (prefix FF×8) as `ts (8 BE) ‖ value`; older versions sit in the segment of
//! their validTo (`validTo / segmentInterval`), in the layout of
//! [`segment_value`]. The changelog holds the raw key, the raw value (or a
//! tombstone) and the version's timestamp as the record timestamp.
//!
//! A changelog cannot be restored by "last value per key": where a version
//! goes depends on every record before it and on stream time. So a versioned
//! store is restored by replaying each record through [`put::Versioned`], a
//! port of Kafka's put logic, record by record in offset order -- exactly
//! what the store's own `put` wrote while the application processed those
//! records. Kafka Streams' restore decides which segments are live with the
//! stream time at the end of each restored batch (its consumer's poll), so
//! it may leave out versions whose validTo is already older than stream time
//! − history retention; such versions are expired history no query returns,
//! and the latest value of every key and every version a query within the
//! history retention sees are the same either way (`put::tests`).
//!
//! The bytes of a versioned store do not tell it from a plain key-value
//! store (same column families; only the key prefixes differ), so its format
//! is an input, as a window store's retention is.
//!
//! The format and the put logic need no RocksDB (the fuzz target
//! `versioned_segment` runs them without it); [`VersionedStore`], the store
//! a restore writes, is behind the feature `store`.

pub mod put;
pub mod segment_value;
#[cfg(feature = "store")]
mod store;

pub use put::{default_segment_interval, Backing, Put, Versioned, LATEST_SEGMENT};
#[cfg(feature = "store")]
pub use store::VersionedStore;

/// History retention and segment interval of a versioned store (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History {
    pub history_retention_ms: i64,
    pub segment_interval_ms: i64,
}

impl History {
    /// The history retention and segment interval (None: Kafka's default for
    /// the retention, [`default_segment_interval`]); the retention must be
    /// at least 0 and the interval positive, as Kafka requires.
    pub fn new(history_retention_ms: i64, segment_interval_ms: Option<i64>) -> Result<Self, String> {
        let segment_interval_ms = segment_interval_ms.unwrap_or_else(|| default_segment_interval(history_retention_ms));
        if history_retention_ms < 0 || segment_interval_ms <= 0 {
            return Err(format!(
                "a versioned store's history retention ({history_retention_ms} ms) must be >= 0 and its segment \
                 interval ({segment_interval_ms} ms) > 0"
            ));
        }
        Ok(Self { history_retention_ms, segment_interval_ms })
    }
}
