//! The on-disk shape of a statestore store, shared by every writer.
//!
//! A store is a plain RocksDB (bytewise comparator) with two column families:
//! `default` holds the data, `offsets` holds the changelog offset of the last
//! applied record per topic partition (`"<topic>-<partition>"` -> 8-byte
//! big-endian signed) and a `status` marker (8-byte `1` open, `0` closed
//! cleanly). Both families are flushed together (`atomic_flush`), and every
//! offset is written in the same `WriteBatch` as the data it describes, so
//! data and offset never disagree on disk.
//!
//! [`StoreFormat::Timestamped`] is Kafka Streams' timestamped key-value store
//! (the DSL default): the data lives in the column family
//! `keyValueWithTimestamp` as the 8-byte big-endian record timestamp followed
//! by the value, and `default` exists but stays empty (Kafka Streams reads a
//! non-empty `default` as data of an older, plain store to migrate).
//!
//! The header-aware formats (Kafka Streams 4.3+, `dsl.store.format=headers`)
//! keep the changelog record's headers too: [`StoreFormat::TimestampedHeaders`]
//! in `keyValueWithTimestampAndHeaders` as `varint(len H) ‖ H ‖ timestamp ‖
//! value`, a header-aware session segment in `sessionKeyValueWithHeaders` as
//! `varint(len H) ‖ H ‖ value`, where H is the headers as Kafka Streams'
//! `HeadersSerializer` writes them (see [`StoreFormat::encode_value`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, CompactOptions, FlushOptions, IteratorMode, LogLevel, Options, WriteBatch,
    WriteOptions, DB,
};

use crate::codec::RawHeaders;
use crate::offsets::{decode_entry, OffsetsEntry};
pub use crate::offsets::{decode_i64, encode_i64, OFFSETS_CF, STATUS_CLOSED, STATUS_KEY, STATUS_OPEN};
pub use crate::segments::KeySchema;

/// A store could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[error("store {path}: {message}")]
pub struct StoreError {
    /// Directory of the store.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
    /// The store's files are damaged (RocksDB reported `Corruption`, or the
    /// offsets column family holds bytes statestore never writes): the state
    /// cannot be trusted and the task must be wiped and restored, as opposed
    /// to an I/O error or a lock, which say nothing about the files.
    pub corruption: bool,
}

impl StoreError {
    pub fn new(path: &Path, message: impl Into<String>) -> Self {
        Self { path: path.to_path_buf(), message: message.into(), corruption: false }
    }

    /// Damaged files: the store must be wiped and restored.
    pub fn corrupt(path: &Path, message: impl Into<String>) -> Self {
        Self { corruption: true, ..Self::new(path, message) }
    }

    /// A RocksDB error while doing `what`; `Corruption` (a bad checksum, a
    /// truncated or missing table file, a damaged MANIFEST, or a background
    /// compaction that read one) marks the error as corruption.
    pub fn rocksdb(path: &Path, what: &str, e: &rocksdb::Error) -> Self {
        let message = format!("{what}: {e}");
        if is_corruption(e) {
            Self::corrupt(path, message)
        } else {
            Self::new(path, message)
        }
    }
}

/// How RocksDB's status text of damaged files begins (`Corruption: block
/// checksum mismatch ...`, `Corruption: Bad table magic number ...`). Python
/// sees RocksDB errors only as that text (rocksdict), so it checks this
/// prefix, exported as `_native.CORRUPTION_PREFIX`; [`is_corruption`] checks
/// the same.
pub const CORRUPTION_PREFIX: &str = "Corruption:";

/// Whether RocksDB reports damaged files (its `Corruption` status, the text
/// starting with [`CORRUPTION_PREFIX`], which is also how the `rocksdb`
/// crate's `Error::kind` finds it).
pub fn is_corruption(e: &rocksdb::Error) -> bool {
    e.as_ref().trim_start().starts_with(CORRUPTION_PREFIX)
}

/// Column family of a timestamped store's data.
pub const TIMESTAMPED_CF: &str = "keyValueWithTimestamp";

/// Column family of a header-aware timestamped store's data (Kafka Streams'
/// `RocksDBTimestampedStoreWithHeaders`; also each segment of a header-aware
/// window store, `TimestampedSegmentWithHeaders`).
pub const TIMESTAMPED_HEADERS_CF: &str = "keyValueWithTimestampAndHeaders";

/// Column family of a header-aware session store segment's data (Kafka
/// Streams' `RocksDBMigratingSessionStoreWithHeaders`, `SessionSegmentWithHeaders`).
pub const SESSION_HEADERS_CF: &str = "sessionKeyValueWithHeaders";

/// Column family of a header-aware emit-final window store segment's data
/// (Kafka Streams' `RocksDBMigratingWindowStoreWithHeaders`, `WindowSegmentWithHeaders`).
pub const WINDOW_HEADERS_CF: &str = "windowKeyValueWithHeaders";

/// How a store lays out its data: which column family holds it and what a
/// value is, and for Kafka Streams' window and session stores the key schema
/// that puts each record into a time segment (one RocksDB per segment, see
/// [`crate::segments`]). One value is passed down from the caller to every
/// writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreFormat {
    /// `default` holds the changelog value as is (Kafka Streams'
    /// `Stores.persistentKeyValueStore`).
    #[default]
    Plain,
    /// `keyValueWithTimestamp` holds the record timestamp (8 bytes, big-endian)
    /// followed by the value (Kafka Streams' `persistentTimestampedKeyValueStore`,
    /// the store of DSL aggregations such as `count()`).
    Timestamped,
    /// A window store of plain segments: key `key ‖ window start ‖ seqnum`,
    /// the changelog value as is in `default` (`Stores.persistentWindowStore`,
    /// the stores of a stream-stream join, with duplicates).
    Window,
    /// A window store of timestamped segments: the value as [`StoreFormat::Timestamped`]
    /// keeps it (`Stores.persistentTimestampedWindowStore`, the store of
    /// `windowedBy(...).count()` and the DSL's other windowed aggregations).
    TimestampedWindow,
    /// A session store: key `key ‖ session end ‖ session start`, segmented by
    /// the end, the changelog value as is in `default`
    /// (`Stores.persistentSessionStore`, the store of session-windowed aggregations).
    Session,
    /// A versioned key-value store (`Stores.persistentVersionedKeyValueStore`):
    /// one RocksDB with the column families of a plain store, every version
    /// of a key in logical segments (key prefixes) of `default`, restored by
    /// replaying Kafka's put logic ([`crate::versioned`]); needs its history
    /// retention.
    Versioned,
    /// A header-aware timestamped key-value store: `keyValueWithTimestampAndHeaders`
    /// holds `varint(len H) ‖ H ‖ timestamp ‖ value`
    /// (`Stores.persistentTimestampedKeyValueStoreWithHeaders`, the DSL's
    /// key-value store under `dsl.store.format=headers`).
    TimestampedHeaders,
    /// A window store of header-aware timestamped segments, each a
    /// [`StoreFormat::TimestampedHeaders`] RocksDB
    /// (`Stores.persistentTimestampedWindowStoreWithHeaders`, the DSL's window
    /// store under `dsl.store.format=headers`).
    TimestampedWindowHeaders,
    /// A session store of header-aware segments: `sessionKeyValueWithHeaders`
    /// holds `varint(len H) ‖ H ‖ value` (`Stores.persistentSessionStoreWithHeaders`,
    /// the DSL's session store under `dsl.store.format=headers`). Its segment
    /// is a RocksDB of this format too (there is no key-value store like it).
    SessionHeaders,
    /// An emit-final window store (`emitStrategy(EmitStrategy.onWindowClose())`
    /// of a tumbling or hopping window, Kafka Streams'
    /// `RocksDbIndexedTimeOrderedWindowBytesStoreSupplier` without index):
    /// plain segments whose `default` holds `0x00 ‖ window start ‖ key ‖
    /// seqnum` -> `timestamp ‖ value` ([`KeySchema::TimeOrderedWindow`]).
    EmitFinalWindow,
    /// [`StoreFormat::EmitFinalWindow`] of sliding windows
    /// (`windowedBy(SlidingWindows).emitStrategy(onWindowClose())`, the
    /// supplier with its index): the same rows, and an index row `0x01 ‖ key
    /// ‖ window start ‖ seqnum` -> empty per window.
    EmitFinalSlidingWindow,
    /// [`StoreFormat::EmitFinalWindow`] under `dsl.store.format=headers`
    /// (`RocksDbIndexedTimeOrderedWindowBytesStoreWithHeadersSupplier`): its
    /// segments' `windowKeyValueWithHeaders` holds `varint(len H) ‖ H ‖
    /// timestamp ‖ value`, and, whatever the windows, an index row `0x01 ‖
    /// key ‖ window start ‖ seqnum` -> empty per window. Its segment is a
    /// RocksDB of this format too.
    EmitFinalWindowHeaders,
    /// An emit-final session store (`windowedBy(SessionWindows)
    /// .emitStrategy(EmitStrategy.onWindowClose())`, Kafka Streams'
    /// `RocksDbTimeOrderedSessionBytesStoreSupplier` with its index): plain
    /// segments whose `default` holds `0x00 ‖ session end ‖ session start ‖
    /// key` -> the value as logged, and `0x01 ‖ key ‖ session end ‖ session
    /// start` -> empty ([`KeySchema::TimeOrderedSession`]).
    EmitFinalSession,
    /// [`StoreFormat::EmitFinalSession`] under `dsl.store.format=headers`
    /// (`RocksDbTimeOrderedSessionHeadersBytesStoreSupplier`): the same rows
    /// in segments of `sessionKeyValueWithHeaders` (each a
    /// [`StoreFormat::SessionHeaders`] RocksDB), the value as logged, without
    /// headers: Kafka Streams 4.4 wraps that store in one that does not say it
    /// is header-aware, so neither its processing nor its restore puts
    /// headers there (seen on Kafka Streams itself).
    EmitFinalSessionHeaders,
}

impl StoreFormat {
    /// Every format, in the order names are listed to users (the one list:
    /// `_native.STORE_FORMATS` and every "use one of" message come from it).
    pub const ALL: [StoreFormat; 14] = [
        StoreFormat::Plain,
        StoreFormat::Timestamped,
        StoreFormat::Window,
        StoreFormat::TimestampedWindow,
        StoreFormat::Session,
        StoreFormat::Versioned,
        StoreFormat::TimestampedHeaders,
        StoreFormat::TimestampedWindowHeaders,
        StoreFormat::SessionHeaders,
        StoreFormat::EmitFinalWindow,
        StoreFormat::EmitFinalSlidingWindow,
        StoreFormat::EmitFinalWindowHeaders,
        StoreFormat::EmitFinalSession,
        StoreFormat::EmitFinalSessionHeaders,
    ];

    /// The format named `s` (one of [`StoreFormat::ALL`]'s names), else a
    /// message naming the formats there are.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|f| f.name()).collect();
            format!("unknown store format {s:?}: use one of {}", names.join(", "))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            StoreFormat::Plain => "plain",
            StoreFormat::Timestamped => "timestamped",
            StoreFormat::Window => "window",
            StoreFormat::TimestampedWindow => "timestamped-window",
            StoreFormat::Session => "session",
            StoreFormat::Versioned => "versioned",
            StoreFormat::TimestampedHeaders => "timestamped-headers",
            StoreFormat::TimestampedWindowHeaders => "timestamped-window-headers",
            StoreFormat::SessionHeaders => "session-headers",
            StoreFormat::EmitFinalWindow => "emit-final-window",
            StoreFormat::EmitFinalSlidingWindow => "emit-final-sliding-window",
            StoreFormat::EmitFinalWindowHeaders => "emit-final-window-headers",
            StoreFormat::EmitFinalSession => "emit-final-session",
            StoreFormat::EmitFinalSessionHeaders => "emit-final-session-headers",
        }
    }

    /// The key schema of a segmented store (window or session), None for a
    /// key-value store.
    pub fn key_schema(self) -> Option<KeySchema> {
        match self {
            StoreFormat::Plain
            | StoreFormat::Timestamped
            | StoreFormat::TimestampedHeaders
            | StoreFormat::Versioned => None,
            StoreFormat::Window | StoreFormat::TimestampedWindow | StoreFormat::TimestampedWindowHeaders => {
                Some(KeySchema::Window)
            }
            StoreFormat::Session | StoreFormat::SessionHeaders => Some(KeySchema::Session),
            StoreFormat::EmitFinalWindow
            | StoreFormat::EmitFinalSlidingWindow
            | StoreFormat::EmitFinalWindowHeaders => Some(KeySchema::TimeOrderedWindow),
            StoreFormat::EmitFinalSession | StoreFormat::EmitFinalSessionHeaders => Some(KeySchema::TimeOrderedSession),
        }
    }

    /// The format of one RocksDB of the store: the store's own for a
    /// key-value store, a segment's for a segmented one (a segment is a
    /// plain, timestamped or header-aware timestamped key-value RocksDB, or
    /// a header-aware session or emit-final window segment, the format
    /// itself). It says the column families, not what a value is: an
    /// emit-final window store's plain segments hold timestamped values.
    pub fn db_format(self) -> StoreFormat {
        match self {
            StoreFormat::Plain
            | StoreFormat::Window
            | StoreFormat::Session
            | StoreFormat::EmitFinalWindow
            | StoreFormat::EmitFinalSlidingWindow
            | StoreFormat::EmitFinalSession
            | StoreFormat::Versioned => StoreFormat::Plain,
            StoreFormat::Timestamped | StoreFormat::TimestampedWindow => StoreFormat::Timestamped,
            StoreFormat::TimestampedHeaders | StoreFormat::TimestampedWindowHeaders => StoreFormat::TimestampedHeaders,
            StoreFormat::SessionHeaders | StoreFormat::EmitFinalSessionHeaders => StoreFormat::SessionHeaders,
            StoreFormat::EmitFinalWindowHeaders => StoreFormat::EmitFinalWindowHeaders,
        }
    }

    /// The segmented formats whose segments are RocksDBs of `db_format`: what
    /// a segmented store's bytes say it may be (timestamped segments: a
    /// timestamped window store; plain ones: a window or a session store,
    /// which the bytes do not tell apart).
    pub fn segmented_of(db_format: StoreFormat) -> Vec<StoreFormat> {
        Self::ALL.into_iter().filter(|f| f.key_schema().is_some() && f.db_format() == db_format).collect()
    }

    /// Whether the store keeps versions ([`crate::versioned`]): restored by
    /// replaying Kafka's put logic, never in bulk.
    pub fn is_versioned(self) -> bool {
        self == StoreFormat::Versioned
    }

    /// Whether the store is one RocksDB of one row per key (neither
    /// segmented nor versioned): its last operation per key is all a restore
    /// needs of a key.
    pub fn is_key_value(self) -> bool {
        !self.is_versioned() && self.key_schema().is_none()
    }

    /// Whether a stored value holds the record's timestamp.
    pub fn is_timestamped(self) -> bool {
        matches!(
            self,
            StoreFormat::Timestamped
                | StoreFormat::TimestampedWindow
                | StoreFormat::TimestampedHeaders
                | StoreFormat::TimestampedWindowHeaders
                | StoreFormat::EmitFinalWindow
                | StoreFormat::EmitFinalSlidingWindow
                | StoreFormat::EmitFinalWindowHeaders
        )
    }

    /// Whether a stored value holds the record's headers (Kafka Streams 4.3+,
    /// `dsl.store.format=headers`).
    pub fn has_headers(self) -> bool {
        matches!(
            self,
            StoreFormat::TimestampedHeaders
                | StoreFormat::TimestampedWindowHeaders
                | StoreFormat::SessionHeaders
                | StoreFormat::EmitFinalWindowHeaders
        )
    }

    /// Whether a stored value is the changelog value as is (so a restore
    /// needs neither the record's timestamp nor its headers).
    pub fn stores_value_as_is(self) -> bool {
        !self.is_timestamped() && !self.has_headers()
    }

    /// Name of the column family that holds the data (of each segment).
    pub fn data_cf(self) -> &'static str {
        match self.db_format() {
            StoreFormat::Timestamped => TIMESTAMPED_CF,
            StoreFormat::TimestampedHeaders => TIMESTAMPED_HEADERS_CF,
            StoreFormat::SessionHeaders => SESSION_HEADERS_CF,
            StoreFormat::EmitFinalWindowHeaders => WINDOW_HEADERS_CF,
            _ => rocksdb::DEFAULT_COLUMN_FAMILY_NAME,
        }
    }

    /// Every column family a RocksDB of this format has (exactly those Kafka
    /// Streams opens for the matching store type, or segment).
    pub fn column_families(self) -> &'static [&'static str] {
        use rocksdb::DEFAULT_COLUMN_FAMILY_NAME as DEFAULT;
        match self.db_format() {
            StoreFormat::Timestamped => &[DEFAULT, TIMESTAMPED_CF, OFFSETS_CF],
            StoreFormat::TimestampedHeaders => &[DEFAULT, TIMESTAMPED_HEADERS_CF, OFFSETS_CF],
            StoreFormat::SessionHeaders => &[DEFAULT, SESSION_HEADERS_CF, OFFSETS_CF],
            StoreFormat::EmitFinalWindowHeaders => &[DEFAULT, WINDOW_HEADERS_CF, OFFSETS_CF],
            _ => &[DEFAULT, OFFSETS_CF],
        }
    }

    /// Append the store key of changelog key `key` to `out` (see
    /// [`KeySchema::store_key`]: an emit-final window store's is time first).
    #[inline]
    pub fn encode_key(self, key: &[u8], out: &mut Vec<u8>) {
        match self.key_schema() {
            Some(schema) => schema.store_key(key, out),
            None => out.extend_from_slice(key),
        }
    }

    /// Whether a store key differs from its changelog key.
    pub fn rewrites_key(self) -> bool {
        self.key_schema().is_some_and(KeySchema::rewrites_key)
    }

    /// Whether each record also has an index row ([`KeySchema::index_key`]):
    /// Kafka Streams 4.4 gives one to an emit-final session store, to an
    /// emit-final window store of sliding windows and to a header-aware
    /// emit-final window store (whatever its windows), not to an emit-final
    /// window store of tumbling or hopping windows.
    pub fn has_index(self) -> bool {
        matches!(
            self,
            StoreFormat::EmitFinalSlidingWindow
                | StoreFormat::EmitFinalWindowHeaders
                | StoreFormat::EmitFinalSession
                | StoreFormat::EmitFinalSessionHeaders
        )
    }

    /// The stored form of a changelog value written at `timestamp` with
    /// `headers`, appended to `out`, as Kafka Streams' restore builds it
    /// (`RecordConverters`):
    ///
    /// - plain: the value itself;
    /// - timestamped: `timestamp (8 bytes BE) ‖ value`;
    /// - header-aware timestamped (`reconstructFromRaw`):
    ///   `varint(len H) ‖ H ‖ timestamp ‖ value`;
    /// - header-aware session (`reconstructSessionFromRaw`): `varint(len H) ‖ H ‖ value`;
    ///
    /// where varint is Kafka's zig-zag varint and H is `HeadersSerializer`'s
    /// output: nothing without headers, else `varint(count)` and the headers
    /// in the record wire format (`varint(key length) key varint(value length,
    /// -1 for null) value` each) -- the record's own headers, whatever they
    /// are (Kafka Streams' restore keeps its internal ones too, such as the
    /// `v`/`c` position headers of the IQ consistency vector).
    pub fn encode_value(self, timestamp: i64, headers: RawHeaders<'_>, value: &[u8], out: &mut Vec<u8>) {
        if self.has_headers() {
            encode_headers(headers, out);
        }
        if self.is_timestamped() {
            out.extend_from_slice(&timestamp.to_be_bytes());
        }
        out.extend_from_slice(value);
    }

    /// The format of one RocksDB whose column families `present` are, if
    /// any (a key-value store's format, or a segment's: a header-aware
    /// session segment is [`StoreFormat::SessionHeaders`]): a store
    /// statestore did not write may be of another kind and must not be
    /// opened for writing. Column families of two formats at once (Kafka
    /// Streams' upgrade from one format to the next, not finished) are
    /// refused too.
    pub fn detect(present: &[String]) -> Result<Self, String> {
        let known = [TIMESTAMPED_CF, TIMESTAMPED_HEADERS_CF, SESSION_HEADERS_CF, WINDOW_HEADERS_CF];
        let data: Vec<&str> = present.iter().map(String::as_str).filter(|cf| known.contains(cf)).collect();
        let unknown: Vec<&str> = present
            .iter()
            .map(String::as_str)
            .filter(|cf| ![rocksdb::DEFAULT_COLUMN_FAMILY_NAME, OFFSETS_CF].contains(cf) && !known.contains(cf))
            .collect();
        if !unknown.is_empty() {
            let what = "a store type statestore does not know (written by another tool or a newer Kafka Streams)";
            return Err(format!("{what}: unexpected column families {}", unknown.join(", ")));
        }
        match data[..] {
            [] => Ok(StoreFormat::Plain),
            [TIMESTAMPED_CF] => Ok(StoreFormat::Timestamped),
            [TIMESTAMPED_HEADERS_CF] => Ok(StoreFormat::TimestampedHeaders),
            [SESSION_HEADERS_CF] => Ok(StoreFormat::SessionHeaders),
            [WINDOW_HEADERS_CF] => Ok(StoreFormat::EmitFinalWindowHeaders),
            _ => Err(format!(
                "a store in the middle of Kafka Streams' upgrade from one format to another (column families {}), \
                 which statestore does not write",
                data.join(", ")
            )),
        }
    }
}

/// Append H, `varint(len H) ‖ H`, of a header-aware stored value (see
/// [`StoreFormat::encode_value`]): `varint(0)` without headers, else H =
/// `varint(count) ‖ headers` with the headers as the record carries them
/// (the wire format Kafka Streams' `HeadersSerializer` writes too).
fn encode_headers(headers: RawHeaders<'_>, out: &mut Vec<u8>) {
    use crate::codec::varint::{varlong_len, write_varint};
    if headers.is_empty() {
        write_varint(out, 0);
        return;
    }
    let count = headers.count() as i32;
    let h_len = varlong_len(count as i64) + headers.raw().len();
    write_varint(out, h_len as i32);
    write_varint(out, count);
    out.extend_from_slice(headers.raw());
}

/// Table `format_version` of every SST file written: Kafka Streams 4.4's
/// rocksdbjni 10.1 reads at most 6 (RocksDB 11 writes 7 by default).
pub const KAFKA_STREAMS_FORMAT_VERSION: i32 = 6;

/// Bytes of the block cache every store this process opens shares: RocksDB's
/// own default for one table factory.
const BLOCK_CACHE_BYTES: usize = 32 << 20;

/// Table options every SST file is written with: Kafka Streams' RocksDB must
/// read them (`format_version` <= 6; bytewise comparator and no merge
/// operator are RocksDB's defaults and never changed here).
///
/// Their block cache is one for the whole process. Left unset, RocksDB makes
/// a new cache of 64 shards for every table factory, a few a store, and
/// frees it again when the store closes: a few percent of the CPU of a job
/// that creates 1,024 small stores, and up to 32 MiB a column family of every
/// open store. A restore reads few blocks (compactions read each input
/// table's index once), so stores restored side by side share it well.
pub fn kafka_streams_table() -> rocksdb::BlockBasedOptions {
    static CACHE: std::sync::OnceLock<rocksdb::Cache> = std::sync::OnceLock::new();
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_format_version(KAFKA_STREAMS_FORMAT_VERSION);
    table.set_block_cache(CACHE.get_or_init(|| rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES)));
    table
}

/// Memtables the offsets column family may hold: at least as many as the data's (atomic flush
/// switches them together), so it never stops writes the data's own limit would let through.
const OFFSETS_MEMTABLES: i32 = 16;
/// Level-0 files of the offsets column family (a key per partition each) at which RocksDB would
/// slow writes: far above what a long compaction lets pile up.
const OFFSETS_LEVEL0_STALL_FILES: i32 = 1 << 10;

/// Level-0 files in one column family at which RocksDB's defaults stop writes
/// (`level0_stop_writes_trigger`; they slow them from 20). Kafka Streams and
/// [`store_options`] keep the defaults, so no restore hands over a store with
/// this many ([`Store::settle_level0`]): the application's first write would
/// wait for a compaction of gigabytes.
pub const DEFAULT_LEVEL0_STOP_FILES: u64 = 36;

/// How often [`Store::settle_level0`] looks at level 0 while RocksDB compacts it.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(10);
/// How long [`Store::settle_level0`] waits for a compaction to start: RocksDB
/// schedules the next one within milliseconds of the last while one is due.
const SETTLE_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// The environment variable that sets what a store's RocksDB writes to its
/// `LOG`: `debug`, `info`, `warn` (the default) or `error`.
pub const ROCKSDB_LOG_ENV: &str = "STATESTORE_ROCKSDB_LOG";

/// What a store's RocksDB writes to its `LOG` ([`ROCKSDB_LOG_ENV`]; any other
/// value is the default). Warnings by default: stalled and stopped writes, and
/// errors. Not the dump of every option (some 280 lines, ~38 KB a store)
/// formatted at every open, which was ~10% of the CPU of creating 1,024 small
/// stores, nor every flush and compaction; `info` brings those back to
/// diagnose a slow store. Kafka Streams logs errors only.
pub fn rocksdb_log_level() -> LogLevel {
    match std::env::var(ROCKSDB_LOG_ENV).as_deref() {
        Ok("debug") => LogLevel::Debug,
        Ok("info") => LogLevel::Info,
        Ok("error") => LogLevel::Error,
        _ => LogLevel::Warn,
    }
}

/// Options every statestore store is opened with.
pub fn store_options(create: bool) -> Options {
    let mut o = Options::default();
    o.set_block_based_table_factory(&kafka_streams_table());
    o.create_if_missing(create);
    o.create_missing_column_families(true);
    o.set_atomic_flush(true);
    o.set_log_level(rocksdb_log_level());
    o
}

/// An open store: the RocksDB handle plus its path for error messages.
pub struct Store {
    db: DB,
    path: PathBuf,
    format: StoreFormat,
}

impl Store {
    /// Open (or, with `create`, create) the store at `path` in the format
    /// found on disk (a new store is plain).
    pub fn open(path: &Path, create: bool) -> Result<Self, StoreError> {
        let format = Self::detect_format(path)?.unwrap_or_default();
        Self::open_format(path, store_options(create), format)
    }

    /// Open an existing store without taking its lock or writing anything, so
    /// tools can look at a store that a running processor holds open.
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        if !path.is_dir() {
            return Err(StoreError::new(path, "no store here (directory missing)"));
        }
        let opts = store_options(false);
        // A process killed while creating the store can leave it without the
        // offsets family; such a store claims no offset, it is not an error.
        let present = match Self::column_families(path)? {
            Some(p) => p,
            None => {
                DB::list_cf(&opts, path).map_err(|e| StoreError::rocksdb(path, "cannot open RocksDB read-only", &e))?
            }
        };
        let format = StoreFormat::detect(&present).map_err(|m| StoreError::new(path, m))?;
        let cfs: Vec<&str> =
            format.column_families().iter().copied().filter(|cf| present.iter().any(|p| p == cf)).collect();
        let db = DB::open_cf_for_read_only(&opts, path, cfs, false)
            .map_err(|e| StoreError::rocksdb(path, "cannot open RocksDB read-only", &e))?;
        Ok(Self { db, path: path.to_path_buf(), format })
    }

    /// The column families of the RocksDB at `path`, or None when there is
    /// no RocksDB there yet.
    /// A directory that holds RocksDBs one level down (Kafka Streams'
    /// segmented stores: window and session stores) is an error naming them.
    pub fn column_families(path: &Path) -> Result<Option<Vec<String>>, StoreError> {
        if !path.join("CURRENT").exists() {
            let mut inner: Vec<String> = std::fs::read_dir(path)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.path().join("CURRENT").exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            if !inner.is_empty() {
                inner.sort();
                return Err(StoreError::new(
                    path,
                    format!(
                        "a segmented store (Kafka Streams' window or session store: RocksDBs {}), \
                         not one RocksDB; left untouched",
                        inner.join(", ")
                    ),
                ));
            }
            return Ok(None);
        }
        DB::list_cf(&Options::default(), path)
            .map(Some)
            .map_err(|e| StoreError::rocksdb(path, "cannot list column families", &e))
    }

    /// The format of the store at `path` as found on disk (None: no store
    /// yet); an error names column families that belong to no known format.
    pub fn detect_format(path: &Path) -> Result<Option<StoreFormat>, StoreError> {
        Self::column_families(path)?
            .map(|present| StoreFormat::detect(&present).map_err(|m| StoreError::new(path, m)))
            .transpose()
    }

    /// Open with caller-tuned options (restore paths tune write buffers).
    /// `atomic_flush` and the column families are always enforced.
    pub fn open_with(path: &Path, opts: Options) -> Result<Self, StoreError> {
        Self::open_format(path, opts, StoreFormat::Plain)
    }

    /// [`Store::open_with`] for a store of `format`. An existing store of
    /// another format, or with column families of no known format, is
    /// refused before anything is written: opening it would add families
    /// (Kafka Streams then refuses the store) or misread its values.
    /// A segmented format is refused: such a store is a directory of
    /// RocksDBs ([`crate::segments::SegmentedStore`]), each opened in its
    /// [`StoreFormat::db_format`].
    pub fn open_format(path: &Path, opts: Options, format: StoreFormat) -> Result<Self, StoreError> {
        if format.key_schema().is_some() {
            return Err(StoreError::new(
                path,
                format!("a {} store is a directory of segments, not one RocksDB", format.name()),
            ));
        }
        Self::open_db(path, opts, format)
    }

    /// Open (or create) one segment of a segmented store of `format`: a
    /// RocksDB in the format's [`StoreFormat::db_format`], refused as
    /// [`Store::open_format`] refuses a store of another format.
    pub fn open_segment(path: &Path, opts: Options, format: StoreFormat) -> Result<Self, StoreError> {
        Self::open_db(path, opts, format.db_format())
    }

    fn open_db(path: &Path, mut opts: Options, format: StoreFormat) -> Result<Self, StoreError> {
        opts.set_atomic_flush(true);
        opts.create_missing_column_families(true);
        if !path.exists() && !crate::fileio::parent_of(path).is_dir() {
            return Err(StoreError::new(path, "parent directory does not exist"));
        }
        if let Some(present) = Self::column_families(path)? {
            let found = StoreFormat::detect(&present)
                .map_err(|m| StoreError::new(path, format!("{m}; statestore leaves it untouched")))?;
            // A RocksDB with `default` alone was killed while being created: no conflict.
            // A versioned store has a plain store's column families (the bytes cannot tell them apart).
            let conflict = found != format.db_format() && present.len() > 1;
            if conflict {
                return Err(StoreError::new(
                    path,
                    format!(
                        "the store on disk is {} (column families {}), not {}; statestore leaves it untouched \
                         (choose the store's format, or wipe it to restore it in the other one)",
                        found.name(),
                        present.join(", "),
                        format.name()
                    ),
                ));
            }
        }
        let mut offsets_opts = Options::default();
        offsets_opts.set_block_based_table_factory(&kafka_streams_table());
        // Atomic flush switches and flushes this column family's memtable with the data's, one
        // tiny memtable and level-0 file per flush. With RocksDB's defaults (two memtables, writes
        // slowed at 20 level-0 files and stopped at 36) those stopped and slowed the writes to the
        // data while a long compaction held the one compaction thread: a replay of 100M records
        // was stopped 236 times and slowed to 16 MiB/s 147 times (benches/notes.md).
        offsets_opts.set_max_write_buffer_number(OFFSETS_MEMTABLES);
        offsets_opts.set_level_zero_slowdown_writes_trigger(OFFSETS_LEVEL0_STALL_FILES);
        offsets_opts.set_level_zero_stop_writes_trigger(2 * OFFSETS_LEVEL0_STALL_FILES);
        let cfs: Vec<ColumnFamilyDescriptor> = format
            .column_families()
            .iter()
            .map(|&cf| {
                let o = if cf == OFFSETS_CF { offsets_opts.clone() } else { opts.clone() };
                ColumnFamilyDescriptor::new(cf, o)
            })
            .collect();
        let db = DB::open_cf_descriptors(&opts, path, cfs)
            .map_err(|e| StoreError::rocksdb(path, "cannot open RocksDB", &e))?;
        Ok(Self { db, path: path.to_path_buf(), format })
    }

    /// How this store lays out its data.
    pub fn format(&self) -> StoreFormat {
        self.format
    }

    /// Handle of the column family that holds the data.
    pub fn data_cf(&self) -> &ColumnFamily {
        self.db.cf_handle(self.format.data_cf()).expect("the data column family is created at open")
    }

    /// Directory of the store.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The underlying RocksDB handle.
    pub fn db(&self) -> &DB {
        &self.db
    }

    /// Handle of the offsets column family.
    pub fn offsets_cf(&self) -> &ColumnFamily {
        self.db.cf_handle(OFFSETS_CF).expect("offsets column family is created at open")
    }

    fn err(&self, what: &str, e: rocksdb::Error) -> StoreError {
        StoreError::rocksdb(&self.path, what, &e)
    }

    /// Whether the store has an `offsets` column family (Kafka Streams 4.3+'s
    /// layout; 3.6 - 4.2 keep offsets in the task's `.checkpoint`).
    pub fn has_offsets_family(&self) -> bool {
        self.db.cf_handle(OFFSETS_CF).is_some()
    }

    /// Every entry of the offsets column family except the status marker.
    /// A value that is not 8 bytes long is an error naming the key.
    pub fn offsets(&self) -> Result<BTreeMap<String, i64>, StoreError> {
        let mut out = BTreeMap::new();
        let Some(cf) = self.db.cf_handle(OFFSETS_CF) else { return Ok(out) };
        for item in self.db.iterator_cf(cf, IteratorMode::Start) {
            let (k, v) = item.map_err(|e| self.err("reading offsets", e))?;
            if &*k == STATUS_KEY {
                continue;
            }
            match decode_entry(&k, &v).map_err(|m| StoreError::corrupt(&self.path, m))? {
                OffsetsEntry::Offset(key, off) => out.insert(key, off),
                OffsetsEntry::Status(_) | OffsetsEntry::Position => None,
            };
        }
        Ok(out)
    }

    /// The offset recorded for one topic partition (`"<topic>-<partition>"`).
    pub fn offset(&self, tp: &str) -> Result<Option<i64>, StoreError> {
        let Some(cf) = self.db.cf_handle(OFFSETS_CF) else { return Ok(None) };
        let v = self.db.get_cf(cf, tp.as_bytes()).map_err(|e| self.err("reading offset", e))?;
        v.map(|v| {
            decode_i64(&v).ok_or_else(|| {
                StoreError::corrupt(&self.path, format!("offset of {tp} is {} bytes, expected 8", v.len()))
            })
        })
        .transpose()
    }

    /// The status marker, if one was ever written.
    pub fn status(&self) -> Result<Option<i64>, StoreError> {
        let Some(cf) = self.db.cf_handle(OFFSETS_CF) else { return Ok(None) };
        let v = self.db.get_cf(cf, STATUS_KEY).map_err(|e| self.err("reading status", e))?;
        v.map(|v| {
            decode_i64(&v).ok_or_else(|| {
                StoreError::corrupt(&self.path, format!("status marker is {} bytes, expected 8", v.len()))
            })
        })
        .transpose()
    }

    /// Read every block of both column families with checksums verified (not
    /// through the block cache), so damage that opening the store does not
    /// notice -- a data block -- is found. Returns the number of data entries.
    pub fn check_blocks(&self) -> Result<u64, StoreError> {
        let mut n = 0;
        for cf in self.format.column_families().iter().filter_map(|name| self.db.cf_handle(name)) {
            let mut ro = rocksdb::ReadOptions::default();
            ro.fill_cache(false);
            ro.set_verify_checksums(true);
            for item in self.db.iterator_cf_opt(cf, ro, IteratorMode::Start) {
                item.map_err(|e| self.err("checking blocks", e))?;
                n += 1;
            }
        }
        Ok(n)
    }

    /// True when the data column family holds no key.
    pub fn is_data_empty(&self) -> bool {
        self.db.iterator_cf(self.data_cf(), IteratorMode::Start).next().is_none()
    }

    /// Add `tp -> offset` to `batch` (in the offsets family).
    pub fn put_offset(&self, batch: &mut WriteBatch, tp: &str, offset: i64) {
        batch.put_cf(self.offsets_cf(), tp.as_bytes(), encode_i64(offset));
    }

    /// Add the status marker to `batch`.
    pub fn put_status(&self, batch: &mut WriteBatch, status: i64) {
        batch.put_cf(self.offsets_cf(), STATUS_KEY, encode_i64(status));
    }

    /// Apply `batch` atomically; `wal` false skips the write-ahead log (the
    /// caller then flushes before claiming durability).
    pub fn write(&self, batch: WriteBatch, wal: bool) -> Result<(), StoreError> {
        let mut wo = WriteOptions::default();
        wo.disable_wal(!wal);
        self.db.write_opt(batch, &wo).map_err(|e| self.err("write", e))
    }

    /// Bytes the memtables of every column family hold, flushing ones included.
    pub fn memtable_bytes(&self) -> u64 {
        let bytes = |cf| self.db.property_int_value_cf(cf, "rocksdb.cur-size-all-mem-tables").ok().flatten();
        let families = self.format.column_families().iter().filter_map(|cf| self.db.cf_handle(cf));
        families.filter_map(bytes).sum()
    }

    /// The most level-0 files any column family holds.
    pub fn level0_files(&self) -> u64 {
        let files = |cf| self.db.property_int_value_cf(cf, "rocksdb.num-files-at-level0").ok().flatten();
        let families = self.format.column_families().iter().filter_map(|cf| self.db.cf_handle(cf));
        families.filter_map(files).max().unwrap_or(0)
    }

    /// Wait, while RocksDB's own compactions run, until no column family holds
    /// `files` level-0 files or more. A large replay writes faster than one
    /// compaction merges level 0 into the levels below, and ends with up to
    /// tens of level-0 files: handed over as they are, they would stop the
    /// writes of the application that opens the store next until its own
    /// compactions caught up (a stream thread blocked in a write for longer
    /// than its poll interval leaves the group). Waiting here puts that cost in
    /// the restore, whose time the user sees and measures. Returns at once when level 0 is below
    /// `files`, and stops waiting once no compaction has run for
    /// [`SETTLE_IDLE`] (a background error, or compactions turned off): the
    /// store is valid either way.
    pub fn settle_level0(&self, files: u64) {
        let mut idle = std::time::Duration::ZERO;
        while self.level0_files() >= files && idle < SETTLE_IDLE {
            let int = |name| self.db.property_int_value(name).ok().flatten().unwrap_or(0);
            if int("rocksdb.background-errors") > 0 {
                break;
            }
            idle =
                if int("rocksdb.num-running-compactions") > 0 { std::time::Duration::ZERO } else { idle + SETTLE_POLL };
            std::thread::sleep(SETTLE_POLL);
        }
    }

    /// Compact every column family into one sorted run at RocksDB's last
    /// level, then let RocksDB's own compactions run again: how a replay that
    /// deferred them ([`crate::restore::deferred_compaction_options`]) ends,
    /// its level 0 holding every memtable it flushed. Each record is merged
    /// once, on every core (subcompactions), instead of again at each level
    /// while the replay writes; the application gets a store with no
    /// compaction left to do. A compaction that fails (out of disk) leaves
    /// the files it would have merged: the store is complete either way.
    pub fn compact_all(&self) -> Result<(), StoreError> {
        let mut co = CompactOptions::default();
        co.set_exclusive_manual_compaction(true);
        for name in self.format.column_families() {
            let Some(cf) = self.db.cf_handle(name) else { continue };
            self.db.compact_range_cf_opt(cf, None::<&[u8]>, None::<&[u8]>, &co);
            self.db.set_options_cf(cf, &[("disable_auto_compactions", "false")]).map_err(|e| self.err("compact", e))?;
        }
        match self.db.property_int_value("rocksdb.background-errors") {
            Ok(Some(n)) if n > 0 => Err(StoreError::new(
                &self.path,
                "compacting the replayed store failed (see its RocksDB LOG; out of disk?): it holds every \
                 record replayed, with its offset, in files not yet merged",
            )),
            _ => Ok(()),
        }
    }

    /// Flush both column families together and wait for it.
    pub fn flush(&self) -> Result<(), StoreError> {
        let mut fo = FlushOptions::default();
        fo.set_wait(true);
        let cfs = [self.data_cf(), self.offsets_cf()];
        self.db.flush_cfs_opt(&cfs, &fo).map_err(|e| self.err("flush", e))
    }
}

/// How two stores compare: a digest of each one's data, and the first key at
/// which they differ (in key order), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    pub expected_digest: String,
    pub actual_digest: String,
    pub expected_entries: u64,
    pub actual_entries: u64,
    /// `(key, expected value, actual value)`; a missing side is `None`.
    pub first_difference: Option<Difference>,
}

/// `(key, expected value, actual value)`; a missing side is `None`.
pub type Difference = (Vec<u8>, Option<Vec<u8>>, Option<Vec<u8>>);

type RawEntry = Result<(Box<[u8]>, Box<[u8]>), rocksdb::Error>;

fn digest_entry(h: &mut sha2::Sha256, k: &[u8], v: &[u8]) {
    use sha2::Digest;
    h.update((k.len() as u64).to_be_bytes());
    h.update(k);
    h.update((v.len() as u64).to_be_bytes());
    h.update(v);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Walk both stores' data in key order at once: digest each (SHA-256 over
/// length-prefixed keys and values) and note the first difference.
pub fn compare(expected: &Store, actual: &Store) -> Result<Comparison, StoreError> {
    use sha2::Digest;
    let read = |s: &Store, item: RawEntry| item.map_err(|e| StoreError::rocksdb(s.path(), "reading data", &e));
    let mut ia = expected.db.iterator_cf(expected.data_cf(), IteratorMode::Start);
    let mut ib = actual.db.iterator_cf(actual.data_cf(), IteratorMode::Start);
    let (mut ha, mut hb) = (sha2::Sha256::new(), sha2::Sha256::new());
    let (mut na, mut nb) = (0u64, 0u64);
    let mut first = None;
    let mut a = ia.next().map(|i| read(expected, i)).transpose()?;
    let mut b = ib.next().map(|i| read(actual, i)).transpose()?;
    loop {
        let order = match (&a, &b) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((ka, _)), Some((kb, _))) => ka.cmp(kb),
        };
        let (take_a, take_b) = match order {
            std::cmp::Ordering::Less => (true, false),
            std::cmp::Ordering::Greater => (false, true),
            std::cmp::Ordering::Equal => (true, true),
        };
        if first.is_none() {
            match (&a, &b, order) {
                (Some((k, va)), Some((_, vb)), std::cmp::Ordering::Equal) if va != vb => {
                    first = Some((k.to_vec(), Some(va.to_vec()), Some(vb.to_vec())))
                }
                (Some((k, va)), _, std::cmp::Ordering::Less) => first = Some((k.to_vec(), Some(va.to_vec()), None)),
                (_, Some((k, vb)), std::cmp::Ordering::Greater) => first = Some((k.to_vec(), None, Some(vb.to_vec()))),
                _ => {}
            }
        }
        if take_a {
            let (k, v) = a.take().expect("present");
            digest_entry(&mut ha, &k, &v);
            na += 1;
            a = ia.next().map(|i| read(expected, i)).transpose()?;
        }
        if take_b {
            let (k, v) = b.take().expect("present");
            digest_entry(&mut hb, &k, &v);
            nb += 1;
            b = ib.next().map(|i| read(actual, i)).transpose()?;
        }
    }
    Ok(Comparison {
        expected_digest: hex(&ha.finalize()),
        actual_digest: hex(&hb.finalize()),
        expected_entries: na,
        actual_entries: nb,
        first_difference: first,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_round_trip_with_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        {
            let s = Store::open(&p, true).unwrap();
            assert!(s.is_data_empty());
            let mut b = WriteBatch::default();
            b.put(b"k", b"v");
            s.put_offset(&mut b, "app-s-changelog-3", 41);
            s.put_status(&mut b, STATUS_OPEN);
            s.write(b, false).unwrap();
            s.flush().unwrap();
        }
        let s = Store::open(&p, false).unwrap();
        assert_eq!(s.offset("app-s-changelog-3").unwrap(), Some(41));
        assert_eq!(s.status().unwrap(), Some(STATUS_OPEN));
        assert_eq!(s.offsets().unwrap().into_iter().collect::<Vec<_>>(), vec![("app-s-changelog-3".into(), 41)]);
        assert!(!s.is_data_empty());
    }

    #[test]
    fn bad_offset_length_is_an_error_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let s = Store::open(&p, true).unwrap();
        let mut b = WriteBatch::default();
        b.put_cf(s.offsets_cf(), b"t-0", b"xyz");
        s.write(b, true).unwrap();
        let e = s.offsets().unwrap_err().to_string();
        assert!(e.contains("t-0") && e.contains("3 bytes"), "{e}");
    }

    fn store_with(dir: &Path, name: &str, kv: &[(&[u8], &[u8])]) -> Store {
        let s = Store::open(&dir.join(name), true).unwrap();
        let mut b = WriteBatch::default();
        for (k, v) in kv {
            b.put(k, v);
        }
        s.write(b, true).unwrap();
        s
    }

    #[test]
    fn compare_finds_first_difference_in_key_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = store_with(dir.path(), "a", &[(b"a", b"1"), (b"b", b"2"), (b"d", b"4")]);
        let same = store_with(dir.path(), "same", &[(b"a", b"1"), (b"b", b"2"), (b"d", b"4")]);
        let c = compare(&a, &same).unwrap();
        assert_eq!(c.expected_digest, c.actual_digest);
        assert_eq!((c.expected_entries, c.first_difference), (3, None));

        let changed = store_with(dir.path(), "changed", &[(b"a", b"1"), (b"b", b"X"), (b"d", b"4")]);
        let c = compare(&a, &changed).unwrap();
        assert_ne!(c.expected_digest, c.actual_digest);
        assert_eq!(c.first_difference, Some((b"b".to_vec(), Some(b"2".to_vec()), Some(b"X".to_vec()))));

        let extra = store_with(dir.path(), "extra", &[(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"d", b"4")]);
        let c = compare(&a, &extra).unwrap();
        assert_eq!(c.first_difference, Some((b"c".to_vec(), None, Some(b"3".to_vec()))));
        assert_eq!((c.expected_entries, c.actual_entries), (3, 4));

        let missing = store_with(dir.path(), "missing", &[(b"a", b"1")]);
        let c = compare(&a, &missing).unwrap();
        assert_eq!(c.first_difference, Some((b"b".to_vec(), Some(b"2".to_vec()), None)));
    }

    #[test]
    fn read_only_open_sees_offsets_while_another_handle_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let s = Store::open(&p, true).unwrap();
        let mut b = WriteBatch::default();
        s.put_offset(&mut b, "t-0", 7);
        s.write(b, true).unwrap();
        s.flush().unwrap();
        let ro = Store::open_read_only(&p).unwrap();
        assert_eq!(ro.offset("t-0").unwrap(), Some(7));
    }

    #[test]
    fn settling_level0_stops_waiting_when_rocksdb_runs_no_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        crate::restore::testing::store_with_level0_files(&p, 40);
        let mut o = crate::restore::restore_options();
        o.set_disable_auto_compactions(true);
        let s = Store::open_with(&p, o).unwrap();
        let t0 = std::time::Instant::now();
        s.settle_level0(DEFAULT_LEVEL0_STOP_FILES);
        assert!(t0.elapsed() < SETTLE_IDLE * 3, "{:?}", t0.elapsed());
        assert_eq!(s.level0_files(), 40);
        s.settle_level0(41); // below already: returns at once
    }

    #[test]
    fn read_only_open_of_a_store_without_offsets_family_claims_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        {
            // a store as a process killed between creating the DB and its offsets family leaves it
            let mut o = Options::default();
            o.create_if_missing(true);
            let db = DB::open(&o, &p).unwrap();
            db.put(b"k", b"v").unwrap();
        }
        let ro = Store::open_read_only(&p).unwrap();
        assert_eq!(ro.offsets().unwrap().len(), 0);
        assert_eq!(ro.status().unwrap(), None);
        assert_eq!(ro.offset("t-0").unwrap(), None);
        drop(ro);
        let rw = Store::open(&p, false).unwrap();
        assert_eq!(rw.offset("t-0").unwrap(), None, "a read-write open adds the family");
    }

    #[test]
    fn formats_are_told_apart_by_their_column_families_and_unknown_ones_refused() {
        let cfs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(StoreFormat::detect(&cfs(&["default", "offsets"])), Ok(StoreFormat::Plain));
        assert_eq!(StoreFormat::detect(&cfs(&["default"])), Ok(StoreFormat::Plain));
        assert_eq!(
            StoreFormat::detect(&cfs(&["default", "keyValueWithTimestamp", "offsets"])),
            Ok(StoreFormat::Timestamped)
        );
        assert_eq!(
            StoreFormat::detect(&cfs(&["default", "keyValueWithTimestampAndHeaders", "offsets"])),
            Ok(StoreFormat::TimestampedHeaders)
        );
        assert_eq!(
            StoreFormat::detect(&cfs(&["default", "sessionKeyValueWithHeaders", "offsets"])),
            Ok(StoreFormat::SessionHeaders),
            "a header-aware session segment"
        );
        assert_eq!(
            StoreFormat::detect(&cfs(&["default", "windowKeyValueWithHeaders", "offsets"])),
            Ok(StoreFormat::EmitFinalWindowHeaders),
            "a header-aware emit-final window segment"
        );
        let e = StoreFormat::detect(&cfs(&["default", "keyValueWithTimestamp", "keyValueWithTimestampAndHeaders"]))
            .unwrap_err();
        assert!(e.contains("upgrade") && e.contains("keyValueWithTimestamp, keyValueWithTimestampAndHeaders"), "{e}");
        let e = StoreFormat::detect(&cfs(&["default", "whatever"])).unwrap_err();
        assert!(e.contains("statestore does not know") && e.contains("whatever"), "{e}");

        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("win");
        std::fs::create_dir(&seg).unwrap();
        Store::open(&seg.join("win.1700000000000"), true).unwrap();
        let e = Store::open_read_only(&seg).err().unwrap().to_string();
        assert!(e.contains("segmented store") && e.contains("win.1700000000000"), "{e}");
        assert!(Store::open(&seg, true).is_err(), "never opened for writing");
        assert!(!seg.join("CURRENT").exists());

        let mut out = Vec::new();
        StoreFormat::Timestamped.encode_value(0x0102, RawHeaders::NONE, b"v", &mut out);
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 1, 2, b'v']);
    }

    /// `headers` in the record wire format, as the codec hands them over.
    fn wire(headers: &[(&[u8], Option<&[u8]>)]) -> (i32, Vec<u8>) {
        let mut raw = Vec::new();
        let n = RawHeaders::encode(headers.iter().copied(), &mut raw);
        (n, raw)
    }

    #[test]
    fn header_aware_values_are_kafka_streams_reconstruct_from_raw() {
        // Bytes as Kafka Streams 4.4's RecordConverters build them (zig-zag varints:
        // 0 -> 00, 1 -> 02, 2 -> 04, -1 -> 01; 3 -> 06 ...).
        let ts = 0x0102i64;
        let ts_bytes = [0, 0, 0, 0, 0, 0, 1, 2];
        let encode = |f: StoreFormat, h: &(i32, Vec<u8>), v: &[u8]| {
            let mut out = b"prefix".to_vec(); // appended, never cleared
            f.encode_value(ts, RawHeaders::new(h.0, &h.1), v, &mut out);
            assert_eq!(&out[..6], b"prefix");
            out[6..].to_vec()
        };
        let none = wire(&[]);
        // no headers: H is empty, varint(0)
        assert_eq!(encode(StoreFormat::TimestampedHeaders, &none, b"v"), [&[0u8][..], &ts_bytes, b"v"].concat());
        assert_eq!(encode(StoreFormat::SessionHeaders, &none, b"agg"), [&[0u8][..], b"agg"].concat());
        // one header k=v: H = count 1, key len 1, "k", value len 1, "v" = 02 02 6b 02 76 (5 bytes)
        let one = wire(&[(b"k", Some(b"v"))]);
        let h1 = [2u8, 2, b'k', 2, b'v'];
        assert_eq!(
            encode(StoreFormat::TimestampedHeaders, &one, b"val"),
            [&[10u8][..], &h1, &ts_bytes, b"val"].concat(),
            "varint(5) = 0a"
        );
        assert_eq!(
            encode(StoreFormat::TimestampedWindowHeaders, &one, b"val"),
            encode(StoreFormat::TimestampedHeaders, &one, b"val")
        );
        assert_eq!(encode(StoreFormat::SessionHeaders, &one, b"agg"), [&[10u8][..], &h1, b"agg"].concat());
        // several, a null value (-1 -> 01) and an empty one
        let several = wire(&[(b"a", Some(b"x")), (b"n", None), (b"e", Some(b""))]);
        let h3 = [6u8, 2, b'a', 2, b'x', 2, b'n', 1, 2, b'e', 0];
        assert_eq!(h3.len(), 11);
        assert_eq!(
            encode(StoreFormat::TimestampedHeaders, &several, b""),
            [&[22u8][..], &h3, &ts_bytes].concat(),
            "varint(11) = 16; an empty value"
        );
        // a long header: len H = 1 + 1 + 3 + 2 + 200 = 207 takes two varint bytes (zig-zag 414 = 9e 03)
        let long_value = vec![b'z'; 200];
        let long = wire(&[(b"big", Some(&long_value))]);
        let out = encode(StoreFormat::SessionHeaders, &long, b"");
        assert_eq!(&out[..4], &[0x9e, 0x03, 2, 6]);
        assert_eq!(out.len(), 2 + 207);
        // formats without headers ignore them
        assert_eq!(encode(StoreFormat::Timestamped, &one, b"v"), [&ts_bytes[..], b"v"].concat());
        assert_eq!(encode(StoreFormat::Session, &one, b"v"), b"v");
    }

    #[test]
    fn header_aware_stores_have_kafka_streams_column_families() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kv");
        Store::open_format(&p, store_options(true), StoreFormat::TimestampedHeaders).unwrap();
        let mut cfs = DB::list_cf(&Options::default(), &p).unwrap();
        cfs.sort();
        assert_eq!(cfs, ["default", "keyValueWithTimestampAndHeaders", "offsets"]);
        assert_eq!(Store::detect_format(&p).unwrap(), Some(StoreFormat::TimestampedHeaders));
        let e = Store::open_format(&p, store_options(false), StoreFormat::Timestamped).err().unwrap().to_string();
        assert!(e.contains("timestamped-headers"), "{e}");
        // a session segment: a RocksDB only as a segment, never as a store
        let seg = dir.path().join("sess.0");
        assert!(Store::open_format(&seg, store_options(true), StoreFormat::SessionHeaders).is_err());
        let s = Store::open_segment(&seg, store_options(true), StoreFormat::SessionHeaders).unwrap();
        assert_eq!(s.format(), StoreFormat::SessionHeaders);
        drop(s);
        let mut cfs = DB::list_cf(&Options::default(), &seg).unwrap();
        cfs.sort();
        assert_eq!(cfs, ["default", "offsets", "sessionKeyValueWithHeaders"]);
        let w = dir.path().join("win.0");
        Store::open_segment(&w, store_options(true), StoreFormat::TimestampedWindowHeaders).unwrap();
        assert_eq!(Store::detect_format(&w).unwrap(), Some(StoreFormat::TimestampedHeaders));
        // emit-final window segments: plain ones holding timestamped values, or windowKeyValueWithHeaders
        let e = dir.path().join("ef.0");
        Store::open_segment(&e, store_options(true), StoreFormat::EmitFinalWindow).unwrap();
        assert_eq!(Store::detect_format(&e).unwrap(), Some(StoreFormat::Plain));
        let eh = dir.path().join("efh.0");
        Store::open_segment(&eh, store_options(true), StoreFormat::EmitFinalWindowHeaders).unwrap();
        let mut cfs = DB::list_cf(&Options::default(), &eh).unwrap();
        cfs.sort();
        assert_eq!(cfs, ["default", "offsets", "windowKeyValueWithHeaders"]);
        assert_eq!(Store::detect_format(&eh).unwrap(), Some(StoreFormat::EmitFinalWindowHeaders));
    }

    #[test]
    fn emit_final_window_rows_are_time_first_with_timestamped_values() {
        let changelog_key = [b"k".as_slice(), &0x0102i64.to_be_bytes(), &3i32.to_be_bytes()].concat();
        let one = (1, vec![2u8, b'h', 2, b'x']);
        for (f, value) in [
            (StoreFormat::EmitFinalWindow, [&[0u8, 0, 0, 0, 0, 0, 0, 9][..], b"v"].concat()),
            (
                StoreFormat::EmitFinalWindowHeaders,
                [&[10u8, 2, 2, b'h', 2, b'x'][..], &[0, 0, 0, 0, 0, 0, 0, 9], b"v"].concat(),
            ),
        ] {
            let mut key = Vec::new();
            f.encode_key(&changelog_key, &mut key);
            assert_eq!(key, [&[0u8][..], &0x0102i64.to_be_bytes(), b"k", &3i32.to_be_bytes()].concat(), "{f:?}");
            let mut out = Vec::new();
            f.encode_value(9, RawHeaders::new(one.0, &one.1), b"v", &mut out);
            assert_eq!(out, value, "{f:?}");
            assert!(f.rewrites_key() && f.is_timestamped() && !f.stores_value_as_is());
        }
        // index rows: Kafka Streams 4.4 gives them to the header-aware window store, whatever its windows
        assert!(StoreFormat::EmitFinalWindowHeaders.has_index() && !StoreFormat::EmitFinalWindow.has_index());
        assert!(StoreFormat::EmitFinalSlidingWindow.has_index());
        assert!(StoreFormat::EmitFinalSession.has_index() && StoreFormat::EmitFinalSession.stores_value_as_is());
        // the header-aware emit-final session store: sessionKeyValueWithHeaders, but no headers in its values
        let f = StoreFormat::EmitFinalSessionHeaders;
        assert!(f.has_index() && f.stores_value_as_is() && !f.has_headers());
        assert_eq!((f.db_format(), f.data_cf()), (StoreFormat::SessionHeaders, "sessionKeyValueWithHeaders"));
        let mut same = Vec::new();
        StoreFormat::TimestampedWindow.encode_key(&changelog_key, &mut same);
        assert_eq!(same, changelog_key, "other formats keep the changelog key");
    }

    #[test]
    fn segments_say_which_segmented_formats_a_store_may_be() {
        assert_eq!(StoreFormat::segmented_of(StoreFormat::Timestamped), vec![StoreFormat::TimestampedWindow]);
        assert_eq!(
            StoreFormat::segmented_of(StoreFormat::Plain),
            vec![
                StoreFormat::Window,
                StoreFormat::Session,
                StoreFormat::EmitFinalWindow,
                StoreFormat::EmitFinalSlidingWindow,
                StoreFormat::EmitFinalSession
            ]
        );
        assert_eq!(
            StoreFormat::segmented_of(StoreFormat::SessionHeaders),
            vec![StoreFormat::SessionHeaders, StoreFormat::EmitFinalSessionHeaders]
        );
        assert_eq!(
            StoreFormat::segmented_of(StoreFormat::TimestampedHeaders),
            vec![StoreFormat::TimestampedWindowHeaders]
        );
    }

    #[test]
    fn formats_parse_from_the_one_list_and_name_it_when_unknown() {
        for f in StoreFormat::ALL {
            assert_eq!(StoreFormat::parse(f.name()), Ok(f));
        }
        assert_eq!(
            StoreFormat::parse("versioned2").unwrap_err(),
            "unknown store format \"versioned2\": use one of plain, timestamped, window, timestamped-window, session, \
             versioned, timestamped-headers, timestamped-window-headers, session-headers, emit-final-window, \
             emit-final-sliding-window, emit-final-window-headers, emit-final-session, emit-final-session-headers"
        );
    }

    #[test]
    fn a_damaged_table_file_is_corruption_by_its_status_text() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        {
            let s = Store::open(&p, true).unwrap();
            let mut b = WriteBatch::default();
            for i in 0..5000u32 {
                b.put_cf(s.data_cf(), format!("key-{i:08}"), [i as u8; 100]);
            }
            s.write(b, false).unwrap();
            s.flush().unwrap();
        }
        let sst = std::fs::read_dir(&p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|f| f.extension().is_some_and(|x| x == "sst") && std::fs::metadata(f).unwrap().len() > 4096)
            .expect("a table file of the data");
        let mut bytes = std::fs::read(&sst).unwrap();
        bytes[100..200].fill(0xa5);
        std::fs::write(&sst, bytes).unwrap();
        let e = Store::open_read_only(&p).and_then(|s| s.check_blocks()).unwrap_err();
        assert!(e.corruption, "{e}");
        assert!(e.message.contains(CORRUPTION_PREFIX), "{e}");
    }

    #[test]
    fn missing_parent_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Store::open(&dir.path().join("a/b/c"), true).is_err());
        assert!(!dir.path().join("a").exists());
    }
}
