//! The seam between the segment log (which reads changelogs) and the restore
//! engine (which writes stores): a read_committed cursor over one changelog
//! partition that hands out committed data records without any per-record
//! allocation or Python.
//!
//! Errors are [`LogError`]s whatever the changelog.
//!
//! A [`Changelog`] says where a partition's log starts and ends and opens a
//! [`ChangelogSource`] on it. `log` implements both for segment files, the
//! Python bindings for a changelog reached through Python; `replay` and `bulk`
//! consume them. Tests of the restore engine implement them over a vector.

pub use crate::codec::RawHeaders;
use crate::codec::RecordRef;
pub use crate::log::{LogError, LogErrorKind};

/// One committed changelog record. A `None` value is a tombstone; a `None`
/// key is skipped (and counted) by the restore engine.
#[derive(Debug, Clone, Copy)]
pub struct ChangeRecord<'a> {
    pub offset: i64,
    /// The record's timestamp (ms; CreateTime, or the batch's LogAppendTime):
    /// a timestamped store keeps it in front of the value.
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// The record's headers: a header-aware store keeps them in front of the
    /// value. A source that was not asked for them may leave them out.
    pub headers: RawHeaders<'a>,
}

impl<'a> ChangeRecord<'a> {
    /// A record without headers.
    pub fn new(offset: i64, timestamp: i64, key: Option<&'a [u8]>, value: Option<&'a [u8]>) -> Self {
        Self { offset, timestamp, key, value, headers: RawHeaders::NONE }
    }
}

/// Where bytes sit in a [`RecordChunk`]'s arena: `(start, end)`.
pub type Span = (usize, usize);

/// One record of a [`RecordChunk`].
#[derive(Debug, Clone, Copy)]
pub struct ChunkRecord {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<Span>,
    pub value: Option<Span>,
    /// Its headers: `headers[start..end]` of the chunk.
    pub headers: Span,
    /// Its headers in the record wire format (their count, and where they
    /// sit in the arena), as [`ChangeRecord::headers`] hands them on.
    pub raw_headers: (i32, Span),
}

/// Records copied out of a log, owned: their bytes in one arena. What comes
/// from a feed, goes to Python, or is held decoded for the write ceiling.
#[derive(Debug, Default, Clone)]
pub struct RecordChunk {
    pub data: Vec<u8>,
    pub records: Vec<ChunkRecord>,
    /// `(key, value)` of every header of every record, in record order.
    pub headers: Vec<(Span, Option<Span>)>,
}

impl RecordChunk {
    /// An empty chunk whose arena holds `bytes` without growing.
    pub fn with_capacity(bytes: usize) -> Self {
        Self { data: Vec::with_capacity(bytes), ..Self::default() }
    }

    pub fn clear(&mut self) {
        self.data.clear();
        self.records.clear();
        self.headers.clear();
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn put(&mut self, b: Option<&[u8]>) -> Option<Span> {
        b.map(|b| {
            let at = self.data.len();
            self.data.extend_from_slice(b);
            (at, self.data.len())
        })
    }

    /// Append a record (copies key, value and the raw headers it carries
    /// into the arena); [`RecordChunk::headers_of`] lists none for it.
    pub fn push(&mut self, r: ChangeRecord<'_>) {
        let (key, value) = (self.put(r.key), self.put(r.value));
        let raw = self.put(Some(r.headers.raw())).unwrap_or_default();
        let h = self.headers.len();
        self.records.push(ChunkRecord {
            offset: r.offset,
            timestamp: r.timestamp,
            key,
            value,
            headers: (h, h),
            raw_headers: (r.headers.count() as i32, raw),
        });
    }

    /// Append a record with its headers (`r`'s own raw headers are replaced
    /// by `headers`, in the wire format).
    pub fn push_with_headers<'h>(
        &mut self,
        r: ChangeRecord<'_>,
        headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>,
    ) {
        let (key, value) = (self.put(r.key), self.put(r.value));
        let h = self.headers.len();
        for (k, v) in headers {
            let (k, v) = (self.put(Some(k)).unwrap_or_default(), self.put(v));
            self.headers.push((k, v));
        }
        // The same headers in the wire format, encoded from the arena and appended to it.
        let mut raw = Vec::new();
        let n = RawHeaders::encode(
            self.headers[h..].iter().map(|&(k, v)| (&self.data[k.0..k.1], v.map(|(a, b)| &self.data[a..b]))),
            &mut raw,
        );
        let at = self.data.len();
        self.data.extend_from_slice(&raw);
        let headers = (h, self.headers.len());
        self.records.push(ChunkRecord {
            offset: r.offset,
            timestamp: r.timestamp,
            key,
            value,
            headers,
            raw_headers: (n, (at, self.data.len())),
        });
    }

    /// The bytes at `span`.
    pub fn bytes(&self, span: Option<Span>) -> Option<&[u8]> {
        span.map(|(a, b)| &self.data[a..b])
    }

    /// The `i`-th record, borrowed.
    pub fn get(&self, i: usize) -> ChangeRecord<'_> {
        let r = &self.records[i];
        let (count, (a, b)) = r.raw_headers;
        ChangeRecord {
            offset: r.offset,
            timestamp: r.timestamp,
            key: self.bytes(r.key),
            value: self.bytes(r.value),
            headers: RawHeaders::new(count, &self.data[a..b]),
        }
    }

    /// The records in order, borrowed.
    pub fn iter(&self) -> impl Iterator<Item = ChangeRecord<'_>> + '_ {
        (0..self.records.len()).map(|i| self.get(i))
    }

    /// The headers of the `i`-th record.
    pub fn headers_of(&self, i: usize) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> + '_ {
        let (a, b) = self.records[i].headers;
        self.headers[a..b].iter().map(|&(k, v)| (&self.data[k.0..k.1], self.bytes(v)))
    }
}

/// Records a source stepped over instead of yielding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SkipCounts {
    /// Data records of aborted transactions.
    pub aborted: u64,
    /// Control records (transaction markers).
    pub control: u64,
}

/// A read_committed cursor over one changelog partition.
///
/// Invariants: records are yielded in offset order, only committed data
/// records are yielded, and nothing at or beyond `end` (callers pass an end
/// no greater than the last stable offset) is yielded. `position()` is the
/// next offset to read: it steps over control batches and aborted records, so
/// "complete" is `position() >= end`, never "saw a record at end - 1".
pub trait ChangelogSource: Send {
    /// Next offset to read.
    fn position(&self) -> i64;

    /// Feed the committed records of the next chunk (about `max_bytes` of log)
    /// with offsets `< end` to `sink`, advancing `position()`. Returns
    /// `Ok(false)` once `position() >= end` or the log holds nothing more
    /// below `end`.
    fn next_chunk(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, LogError>;

    /// [`next_chunk`](Self::next_chunk) with the records handed over in
    /// slices rather than one by one: a consumer can then look ahead within a
    /// slice (the bulk collector asks memory for the keys of later records
    /// while it adds earlier ones) without copying the records first. A slice
    /// borrows the source's buffers, usually one fetch response or one
    /// decompressed batch; records come in offset order across slices, and
    /// records before an error are handed over before the error returns.
    ///
    /// The default copies each chunk once and hands it over as one slice;
    /// sources that hold their records in buffers of their own override it.
    fn next_records(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(&[ChangeRecord<'_>]),
    ) -> Result<bool, LogError> {
        let mut chunk = RecordChunk::default();
        let result = self.next_chunk(end, max_bytes, &mut |r| chunk.push(r));
        let records: Vec<ChangeRecord<'_>> = chunk.iter().collect();
        if !records.is_empty() {
            sink(&records);
        }
        result
    }

    /// The topic id the records handed out so far were read under (a Kafka
    /// topic's; `None`: none read, or a log without topic ids).
    fn topic_id(&self) -> Option<[u8; 16]> {
        None
    }

    /// What was stepped over so far.
    fn skipped(&self) -> SkipCounts;

    /// Bytes of log read so far.
    fn bytes_read(&self) -> u64;

    /// Whether the source already reads on a thread of its own (a Kafka
    /// fetch thread), so that a restore gains nothing from decoding on a
    /// further one: with the broker on the same cores, three busy threads
    /// were slower than two.
    fn reads_ahead(&self) -> bool {
        false
    }

    /// Start fetching records below `end` before the first read asks for
    /// them, where the source fetches on a thread of its own (a Kafka fetch
    /// thread sends its first request); the first read must then ask for the
    /// same `end`. Others do nothing.
    fn prime(&mut self, _end: i64) {}
}

/// Hands the slices of [`RecordRef`]s a decoder borrows from its buffers
/// over as slices of [`ChangeRecord`]s, built in one vector kept across
/// slices (for its allocation).
#[derive(Default)]
pub(crate) struct ChangeSlices {
    spare: Vec<ChangeRecord<'static>>,
}

impl ChangeSlices {
    /// Hand `records` to `sink` as change records.
    pub(crate) fn hand_over(&mut self, records: &[RecordRef<'_>], sink: &mut dyn FnMut(&[ChangeRecord<'_>])) {
        let mut slice: Vec<ChangeRecord<'_>> = recycle(std::mem::take(&mut self.spare));
        slice.extend(records.iter().map(ChangeRecord::from));
        sink(&slice);
        self.spare = recycle(slice);
    }
}

impl<'a> From<&RecordRef<'a>> for ChangeRecord<'a> {
    fn from(r: &RecordRef<'a>) -> Self {
        ChangeRecord { offset: r.offset, timestamp: r.timestamp, key: r.key, value: r.value, headers: r.raw_headers() }
    }
}

/// An emptied vector of borrowed records turned into one of another lifetime
/// (or type of the same size), keeping its allocation: a slice of records
/// borrowing one response is built in the vector that held the last one's.
pub(crate) fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    // Collecting an emptied vector's iterator reuses its buffer in place.
    v.into_iter().map(|_| unreachable!("the vector is empty")).collect()
}

/// Offsets of a changelog partition as its log reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// First offset still in the log.
    pub start: i64,
    /// Log end offset (next offset to be written).
    pub end: i64,
    /// Last stable offset: first offset of the oldest open transaction, else `end`.
    pub last_stable: i64,
}

/// A partition a `restore_many` job restores ([`Changelog::read_ahead`]),
/// and the offset its restore will start from when that is known before the
/// job (a store kept open between the state updater's rounds holds its offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPart {
    pub topic: String,
    pub partition: i32,
    pub start: Option<i64>,
}

/// Where changelog partitions come from: the segment log, a Kafka cluster,
/// or a test double. One value serves every partition of its changelogs.
pub trait Changelog: Sync {
    /// Start, end and last stable offset of `topic`-`partition`.
    fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError>;
    /// A read_committed cursor on `topic`-`partition` positioned at `start`.
    fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError>;

    /// [`open`](Self::open) for a store whose records were read under topic
    /// id `held` (a Kafka topic's, [`ChangelogSource::topic_id`]): a read
    /// going on from the store's offset that finds the topic under another
    /// id (deleted and recreated) fails as out of range. Logs without topic
    /// ids ignore it.
    fn open_held(
        &self,
        topic: &str,
        partition: i32,
        start: i64,
        _held: Option<[u8; 16]>,
    ) -> Result<Box<dyn ChangelogSource>, LogError> {
        self.open(topic, partition, start)
    }

    /// A token, cheap next to [`bounds`](Self::bounds), that changes
    /// whenever `topic`-`partition` does: equal tokens taken before and
    /// after a call of `bounds` say its answer still holds. `None`: this
    /// log cannot tell (a Kafka cluster is asked again).
    fn stamp(&self, _topic: &str, _partition: i32) -> Option<u64> {
        None
    }

    /// Bytes of fetched log a source of this changelog holds beside a
    /// restore's own chunks (a Kafka fetcher's responses in flight): a
    /// replay's shares of its memory budget leave them room
    /// (`restore::ReplayMemory`).
    fn buffered_bytes(&self) -> usize {
        0
    }

    /// Whether a restore's first steps with this log (its bounds, opening a
    /// cursor) may be taken on another thread ahead of the restore's turn
    /// (`restore_many` prepares the next restore while others run). A log
    /// served by Python code is called from the restore threads only.
    fn prepares_ahead(&self) -> bool {
        true
    }

    /// Read what the restores of a job will ask for, for all of them at
    /// once, where that saves round trips (a Kafka job's
    /// [`crate::kafka::client::SessionLog`]: the bounds of every partition in
    /// three requests per broker, for the restores' [`bounds`](Self::bounds)
    /// to take; the first records of the partitions whose restore starts at a
    /// known offset a few records from the end, in one Fetch per broker, for
    /// their [`open`](Self::open)). Others do nothing.
    fn read_ahead(&self, _parts: &[JobPart]) {}

    /// The changelog the restores of one job (`restore_many`) read
    /// through, sharing what reads can share -- the Kafka fetcher's fetch
    /// session: one Fetch per broker for all the job's partitions it leads;
    /// `None`: this one, as it is.
    fn for_job(&self) -> Option<Box<dyn Changelog + Send>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_hands_records_on_with_their_raw_headers() {
        let mut raw = Vec::new();
        let n = RawHeaders::encode([(&b"a"[..], Some(&b"x"[..])), (b"n", None)], &mut raw);
        let mut r = ChangeRecord::new(5, 50, Some(b"k"), Some(b"v"));
        r.headers = RawHeaders::new(n, &raw);
        let mut chunk = RecordChunk::default();
        chunk.push(r);
        chunk.push(ChangeRecord::new(6, 60, Some(b"k2"), None));
        chunk.push_with_headers(
            ChangeRecord::new(7, 70, None, Some(b"v3")),
            [(&b"a"[..], Some(&b"x"[..])), (b"n", None)],
        );
        let got: Vec<ChangeRecord<'_>> = chunk.iter().collect();
        assert_eq!(got[0].headers, RawHeaders::new(2, &raw));
        assert_eq!(got[1].headers, RawHeaders::NONE);
        assert_eq!(got[2].headers, RawHeaders::new(2, &raw), "listed headers are encoded as the wire has them");
        assert_eq!(chunk.headers_of(2).collect::<Vec<_>>(), vec![(&b"a"[..], Some(&b"x"[..])), (&b"n"[..], None)]);
        assert_eq!((got[2].key, got[2].value, got[2].timestamp), (None, Some(&b"v3"[..]), 70));
    }
}
