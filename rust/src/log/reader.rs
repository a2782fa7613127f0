//! Readers of a partition: the read_committed cursor the restore engine
//! consumes ([`CommittedReader`], a [`ChangelogSource`]), the general reader
//! behind `SegmentLog.read` ([`PartitionReader`]), and the offsets of a partition.
//!
//! Transaction outcomes come from the log itself, as Kafka's consumer gets
//! them: a transactional data batch belongs to the transaction that the next
//! control batch of the same producer id ends. A [`TxnResolver`] looks ahead
//! over batch headers (a second cursor that reads only headers and markers)
//! to find that marker; a batch with no marker yet is an open transaction,
//! which is where the last stable offset is, so read_committed stops there.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::segment::{
    check_below_next_segment, damaged_length, list_segments, not_a_torn_tail, valid_batch_after, BatchCursor, Segment,
    DEFAULT_CHUNK, MAX_TORN_TAIL,
};
use super::{LogError, LogErrorKind};
use crate::codec::{self, BatchHeader, ControlType, RecordRef, HEADER_LEN};
use crate::source::{recycle, Bounds, ChangeRecord, ChangeSlices, ChangelogSource, SkipCounts};

/// What became of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    Aborted,
    /// No marker yet: the transaction is still open.
    Open,
}

/// Read size of a header scan among small batches: many headers per read.
const SCAN_CHUNK: usize = 256 * 1024;
/// Where batches average at least this size, the scan steps over each by
/// reading the next header alone: a read of 61 bytes costs less than copying
/// the batch (a 16 KiB batch, a Java producer's default, would cost the chunk
/// read 16 KiB of copy per header).
const HEADER_ONLY_FROM: u64 = 8 * 1024;

/// A header-only walk over the log, for finding markers ahead of a reader and
/// for computing offsets. Reads the files in chunks, parses each batch header
/// and skips its records (the whole batch is decoded only for control
/// batches, which are tiny); a batch larger than a chunk costs one read.
struct HeaderScan {
    dir: PathBuf,
    segments: Vec<Segment>,
    seg: usize,
    file: Option<File>,
    file_len: u64,
    pos: u64,
    buf: Vec<u8>,
    buf_pos: u64,
    buf_len: usize,
    /// Moving average of the batch sizes seen (a few small batches among
    /// large ones, such as markers, do not switch the reads back to chunks).
    mean_batch: u64,
    /// Bytes read from the files so far.
    copied: u64,
}

impl HeaderScan {
    fn new(dir: &Path, segments: Vec<Segment>, seg: usize, pos: u64) -> Result<Self, LogError> {
        let mut s = HeaderScan {
            dir: dir.to_path_buf(),
            segments,
            seg,
            file: None,
            file_len: 0,
            pos,
            buf: Vec::new(),
            buf_pos: 0,
            buf_len: 0,
            mean_batch: 0,
            copied: 0,
        };
        if !s.segments.is_empty() {
            s.open()?;
        }
        Ok(s)
    }

    fn open(&mut self) -> Result<(), LogError> {
        let p = &self.segments[self.seg].path;
        self.file = Some(File::open(p).map_err(|e| LogError::io("open", p, e))?);
        self.file_len = 0;
        self.buf_len = 0;
        Ok(())
    }

    fn stat(&mut self) -> Result<u64, LogError> {
        let p = &self.segments[self.seg].path;
        let f = self.file.as_ref().expect("a segment is open");
        self.file_len = f.metadata().map_err(|e| LogError::io("stat", p, e))?.len();
        Ok(self.file_len)
    }

    /// `n` bytes at `pos` of the current file (the caller checked they exist).
    fn bytes_at(&mut self, pos: u64, n: usize) -> Result<&[u8], LogError> {
        let inside = pos >= self.buf_pos && pos + n as u64 <= self.buf_pos + self.buf_len as u64;
        if !inside {
            let chunk = if self.mean_batch >= HEADER_ONLY_FROM { n } else { n.max(SCAN_CHUNK) };
            let want = chunk.min((self.file_len - pos) as usize).max(n);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            let p = &self.segments[self.seg].path;
            let f = self.file.as_ref().expect("a segment is open");
            let mut got = 0;
            while got < want {
                let r =
                    f.read_at(&mut self.buf[got..want], pos + got as u64).map_err(|e| LogError::io("read", p, e))?;
                if r == 0 {
                    break;
                }
                got += r;
            }
            self.copied += got as u64;
            if got < n {
                return Err(LogError::other(format!("{} shrank while being read (at byte {pos})", p.display())));
            }
            self.buf_pos = pos;
            self.buf_len = got;
        }
        let at = (pos - self.buf_pos) as usize;
        Ok(&self.buf[at..at + n])
    }

    /// The next batch header (and the marker type of a control batch), or
    /// `None` at the end of the complete batches.
    fn next(&mut self) -> Result<Option<(BatchHeader, Option<ControlType>)>, LogError> {
        loop {
            if self.file.is_none() {
                let fresh = list_segments(&self.dir)?;
                if fresh.is_empty() {
                    return Ok(None);
                }
                self.segments = fresh;
                self.seg = 0;
                self.pos = 0;
                self.open()?;
            }
            let pos = self.pos;
            if pos + HEADER_LEN as u64 > self.file_len {
                self.stat()?;
            }
            if pos + HEADER_LEN as u64 <= self.file_len {
                let path = self.segments[self.seg].path.clone();
                let head = self.bytes_at(pos, HEADER_LEN)?;
                let base = codec::peek_offset_and_length(head).unwrap().0;
                let h = BatchHeader::parse(head).map_err(|e| LogError::corrupt(&path, pos, base, e))?;
                if let Some(limit) = self.segments.get(self.seg + 1).map(|s| s.base) {
                    check_below_next_segment(&h, limit).map_err(|m| LogError::corrupt(&path, pos, base, m))?;
                }
                let total = h.total_len() as u64;
                if pos + total > self.file_len {
                    self.stat()?;
                    if pos + total > self.file_len && self.file_len - pos > MAX_TORN_TAIL {
                        return Err(not_a_torn_tail(&path, pos, base, h.batch_length, self.file_len));
                    }
                    if pos + total > self.file_len {
                        let f = self.file.as_ref().expect("a segment is open");
                        if let Some(next) = valid_batch_after(f, &path, pos, self.file_len, base)? {
                            return Err(damaged_length(&path, pos, base, h.batch_length, next));
                        }
                    }
                }
                if pos + total <= self.file_len {
                    let ct = if h.is_control() {
                        let batch = self.bytes_at(pos, total as usize)?;
                        codec::verify_crc(&h, batch).map_err(|e| LogError::corrupt(&path, pos, base, e))?;
                        Some(codec::control_type(&h, batch).map_err(|e| LogError::corrupt(&path, pos, base, e))?)
                    } else {
                        None
                    };
                    self.pos += total;
                    self.mean_batch = (self.mean_batch * 7 + total) / 8;
                    return Ok(Some((h, ct)));
                }
            }
            // End of this file's complete batches: go on only if a later segment exists.
            if self.seg + 1 >= self.segments.len() {
                let fresh = list_segments(&self.dir)?;
                let cur = self.segments[self.seg].base;
                if !fresh.iter().any(|s| s.base > cur) {
                    return Ok(None);
                }
                self.segments = fresh;
                self.seg = self.segments.iter().position(|s| s.base == cur).unwrap_or(self.seg);
                // The writer finished this segment before rolling: re-check its length.
                let before = self.file_len;
                if self.stat()? > before {
                    continue;
                }
            }
            self.seg += 1;
            self.pos = 0;
            self.open()?;
        }
    }
}

/// Finds the outcome of transactional batches by looking ahead for the next
/// marker of their producer. Markers seen ahead are queued per producer id,
/// so the log is scanned ahead at most once.
pub struct TxnResolver {
    scan: Option<HeaderScan>,
    dir: PathBuf,
    start: (usize, u64),
    markers: HashMap<i64, VecDeque<(i64, bool)>>,
}

impl TxnResolver {
    /// A resolver whose look-ahead starts at `position` of segment `seg`.
    pub fn new(dir: &Path, seg: usize, position: u64) -> Self {
        TxnResolver { scan: None, dir: dir.to_path_buf(), start: (seg, position), markers: HashMap::new() }
    }

    /// The outcome of the transaction of `producer_id` that holds a batch at `offset`.
    pub fn resolve(&mut self, producer_id: i64, offset: i64) -> Result<Outcome, LogError> {
        if self.scan.is_none() {
            let segs = list_segments(&self.dir)?;
            let (seg, pos) = if segs.is_empty() { (0, 0) } else { self.start };
            self.scan = Some(HeaderScan::new(&self.dir, segs, seg, pos)?);
        }
        loop {
            if let Some(q) = self.markers.get_mut(&producer_id) {
                while q.front().is_some_and(|&(o, _)| o < offset) {
                    q.pop_front();
                }
                if let Some(&(_, commit)) = q.front() {
                    return Ok(if commit { Outcome::Committed } else { Outcome::Aborted });
                }
            }
            let scan = self.scan.as_mut().unwrap();
            match scan.next()? {
                None => return Ok(Outcome::Open),
                Some((h, ct)) => {
                    if let Some(ct) = ct {
                        if matches!(ct, ControlType::Commit | ControlType::Abort) {
                            self.markers
                                .entry(h.producer_id)
                                .or_default()
                                .push_back((h.base_offset, ct == ControlType::Commit));
                        }
                    }
                }
            }
        }
    }

    /// Drop queued markers below `offset` for producers no longer seen (memory bound).
    pub fn forget_before(&mut self, offset: i64) {
        self.markers.retain(|_, q| {
            while q.front().is_some_and(|&(o, _)| o < offset) {
                q.pop_front();
            }
            !q.is_empty()
        });
    }
}

/// Isolation level of a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Only committed data, nothing at or beyond the last stable offset.
    ReadCommitted,
    /// Every data record written, including open and aborted transactions.
    ReadUncommitted,
}

/// What a batch is to a reader.
enum Disposition {
    Yield,
    SkipControl,
    SkipAborted,
    /// An open transaction: the reader stops here (the LSO).
    Stop,
}

/// Reads one partition batch by batch: the shared core of the committed
/// source and the Python reader.
pub struct PartitionReader {
    cursor: BatchCursor,
    resolver: Option<TxnResolver>,
    position: i64,
    skipped: SkipCounts,
    scratch: Vec<u8>,
    /// The buffer of the last slice handed over (kept for its allocation).
    slice_spare: Vec<RecordRef<'static>>,
    isolation: Isolation,
    batches_since_gc: u32,
}

impl PartitionReader {
    /// A reader of the partition in `dir` from `start_offset` (clamped to the
    /// start of the log).
    pub fn open(dir: &Path, start_offset: i64, isolation: Isolation, chunk: usize) -> Result<Self, LogError> {
        let mut cursor = BatchCursor::open(dir, start_offset, chunk, true)?;
        let first = cursor.segments().first().map_or(0, |s| s.base);
        let position = start_offset.max(first);
        let (seg, pos) = match cursor.peek()? {
            Some(p) => (p.segment, p.position),
            None => (cursor.segments().len().saturating_sub(1), 0),
        };
        let resolver = match isolation {
            Isolation::ReadCommitted => Some(TxnResolver::new(dir, seg, pos)),
            Isolation::ReadUncommitted => None,
        };
        Ok(PartitionReader {
            cursor,
            resolver,
            position,
            skipped: SkipCounts::default(),
            scratch: Vec::new(),
            slice_spare: Vec::new(),
            isolation,
            batches_since_gc: 0,
        })
    }

    /// Give back the page cache this reader fills, segment by segment, keeping
    /// what was cached before it ([`crate::log::segment::BatchCursor::leave_page_cache_as_found`]).
    pub fn leave_page_cache_as_found(&mut self) {
        self.cursor.leave_page_cache_as_found();
    }

    /// Next offset to read.
    pub fn position(&self) -> i64 {
        self.position
    }
    /// What was stepped over so far.
    pub fn skipped(&self) -> SkipCounts {
        self.skipped
    }
    /// Bytes of log read so far.
    pub fn bytes_read(&self) -> u64 {
        self.cursor.bytes_read()
    }
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    fn disposition(&mut self, h: &BatchHeader) -> Result<Disposition, LogError> {
        if h.is_control() {
            return Ok(Disposition::SkipControl);
        }
        if !h.is_transactional() {
            return Ok(Disposition::Yield);
        }
        let Some(r) = self.resolver.as_mut() else { return Ok(Disposition::Yield) };
        Ok(match r.resolve(h.producer_id, h.base_offset)? {
            Outcome::Committed => Disposition::Yield,
            Outcome::Aborted => Disposition::SkipAborted,
            Outcome::Open => Disposition::Stop,
        })
    }

    /// Feed the records with offsets in `[position, end)` that the isolation
    /// level lets through to `sink`, batch by batch, until about `max_bytes`
    /// of log were consumed. When `sink` returns false the reader stops after
    /// that record (the next read resumes inside its batch). Returns true if
    /// it stopped early (bytes or sink), so more may follow; false at `end`,
    /// at the end of the log, or at an open
    /// transaction (the last stable offset).
    pub fn read<F>(&mut self, end: i64, max_bytes: usize, mut sink: F) -> Result<bool, LogError>
    where
        F: FnMut(&RecordRef<'_>) -> bool,
    {
        self.read_batches(end, max_bytes, |records, from, end| {
            for r in records {
                let r = r?;
                if r.offset < from {
                    continue;
                }
                if r.offset >= end {
                    break;
                }
                if !sink(&r) {
                    return Ok(Some(r.offset + 1));
                }
            }
            Ok(None)
        })
    }

    /// [`read`](Self::read) with the records of each batch handed over as one
    /// slice (borrowing the batch, so without a copy); records before a
    /// damaged one are handed over before the error returns.
    pub fn read_slices(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(&[RecordRef<'_>]),
    ) -> Result<bool, LogError> {
        let mut spare: Vec<RecordRef<'static>> = std::mem::take(&mut self.slice_spare);
        let result = self.read_batches(end, max_bytes, |mut records, from, end| {
            let mut slice: Vec<RecordRef<'_>> = recycle(std::mem::take(&mut spare));
            let decoded = records.decode_range_into(&mut slice, from, end);
            if !slice.is_empty() {
                sink(&slice);
            }
            spare = recycle(slice);
            decoded.map(|()| None)
        });
        self.slice_spare = spare;
        result
    }

    /// The loop behind [`read`](Self::read) and [`read_slices`](Self::read_slices):
    /// `each` gets the records of each batch the isolation level lets through
    /// with the range of offsets to take from them (from the position on, and
    /// below `end`), and returns the offset after the last one it took if it
    /// stopped early (the next read resumes there).
    fn read_batches<F>(&mut self, end: i64, max_bytes: usize, mut each: F) -> Result<bool, LogError>
    where
        F: FnMut(codec::Records<'_>, i64, i64) -> Result<Option<i64>, codec::CodecError>,
    {
        let mut consumed = 0usize;
        while self.position < end {
            if consumed >= max_bytes.max(1) {
                return Ok(true);
            }
            let Some(p) = self.cursor.peek()? else { return Ok(false) };
            let h = p.header;
            if h.last_offset() < self.position {
                self.cursor.advance();
                continue;
            }
            if h.base_offset >= end {
                return Ok(false);
            }
            let disp = self.disposition(&h)?;
            let upto = h.next_offset().min(end);
            match disp {
                Disposition::Stop => return Ok(false),
                Disposition::SkipControl => {
                    // Records, not offsets: an empty control batch the log
                    // cleaner left holds none.
                    self.skipped.control += if self.position <= h.base_offset && upto == h.next_offset() {
                        h.records_count as u64
                    } else {
                        (upto - self.position.max(h.base_offset)).max(0) as u64
                    };
                    self.position = upto;
                }
                Disposition::SkipAborted => {
                    // Count the records stepped over, not offsets.
                    self.skipped.aborted += if self.position <= h.base_offset && upto == h.next_offset() {
                        h.records_count as u64
                    } else {
                        (upto - self.position.max(h.base_offset)).max(0) as u64
                    };
                    self.position = upto;
                }
                Disposition::Yield => {
                    let batch = self.cursor.batch_bytes();
                    let path = self.cursor.segment_path();
                    let records = codec::batch_records(&h, batch, &mut self.scratch).map_err(|e| match e {
                        codec::CodecError::UnsupportedCompression(c) => LogError::new(LogErrorKind::UnsupportedCompression, format!(
                            "{}: batch at byte {} (base offset {}) uses compression {c}, which this build cannot decode",
                            path.display(),
                            p.position,
                            h.base_offset
                        )).with_path(path).with_offset(h.base_offset),
                        e => LogError::corrupt(path, p.position, h.base_offset, e),
                    })?;
                    let stopped_at = each(records, self.position, end)
                        .map_err(|e| LogError::corrupt(path, p.position, h.base_offset, e))?;
                    if let Some(next) = stopped_at {
                        if next < upto {
                            // Mid-batch: the next read re-reads this batch from `next`.
                            self.position = next;
                            return Ok(true);
                        }
                        self.position = upto;
                        if upto == h.next_offset() {
                            self.cursor.advance();
                        }
                        return Ok(true);
                    }
                    self.position = upto;
                }
            }
            consumed += h.total_len();
            if upto == h.next_offset() {
                self.cursor.advance();
            }
            self.batches_since_gc += 1;
            if self.batches_since_gc >= 4096 {
                self.batches_since_gc = 0;
                if let Some(r) = self.resolver.as_mut() {
                    r.forget_before(self.position);
                }
            }
        }
        Ok(false)
    }
}

/// The read_committed [`ChangelogSource`] over segment files.
pub struct CommittedReader {
    inner: PartitionReader,
    slices: ChangeSlices,
}

impl CommittedReader {
    /// Open at `start_offset`.
    pub fn open(dir: &Path, start_offset: i64) -> Result<Self, LogError> {
        // Reads of DEFAULT_CHUNK (1 MiB; larger batches grow the buffer) keep the
        // bytes just read in the core's own cache until they are decoded: with
        // 4 MiB reads, two restores side by side ran 15% slower each.
        let mut inner = PartitionReader::open(dir, start_offset, Isolation::ReadCommitted, DEFAULT_CHUNK)?;
        // A restore reads its log once: what it reads must not push out what it writes next.
        inner.leave_page_cache_as_found();
        Ok(CommittedReader { inner, slices: ChangeSlices::default() })
    }
}

impl ChangelogSource for CommittedReader {
    fn position(&self) -> i64 {
        self.inner.position()
    }

    fn next_chunk(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, LogError> {
        let more = self.inner.read(end, max_bytes, |r| {
            sink(r.into());
            true
        })?;
        Ok(more && self.inner.position() < end)
    }

    fn next_records(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(&[ChangeRecord<'_>]),
    ) -> Result<bool, LogError> {
        let slices = &mut self.slices;
        let more = self.inner.read_slices(end, max_bytes, &mut |records| slices.hand_over(records, sink))?;
        Ok(more && self.inner.position() < end)
    }

    fn skipped(&self) -> SkipCounts {
        self.inner.skipped()
    }

    fn bytes_read(&self) -> u64 {
        self.inner.bytes_read()
    }
}

/// Compute the offsets of the partition in `dir` by walking batch headers.
pub fn offsets_of(dir: &Path) -> Result<Bounds, LogError> {
    let segments = list_segments(dir)?;
    let Some(first) = segments.first() else { return Ok(Bounds { start: 0, end: 0, last_stable: 0 }) };
    let start = first.base;
    let mut end = start;
    let mut open: HashMap<i64, i64> = HashMap::new();
    let mut scan = HeaderScan::new(dir, segments, 0, 0)?;
    while let Some((h, ct)) = scan.next()? {
        end = h.next_offset().max(end);
        if h.is_control() {
            if matches!(ct, Some(ControlType::Commit | ControlType::Abort)) {
                open.remove(&h.producer_id);
            }
        } else if h.is_transactional() {
            open.entry(h.producer_id).or_insert(h.base_offset);
        }
    }
    // An empty last segment names where the log continues.
    if let Some(last) = scan.segments.last() {
        end = end.max(last.base);
    }
    let last_stable = open.values().copied().min().unwrap_or(end);
    Ok(Bounds { start, end, last_stable })
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::codec;
    use crate::log::segment::log_file_name;
    use crate::log::tests::records as batch;

    #[test]
    fn the_scan_steps_over_large_batches_reading_their_headers_alone() {
        // 400 batches of ~16 KiB (a Java producer's default batch.size) among
        // small transactional ones and their markers, an open transaction at
        // the end, then a torn tail: the bounds as a full read finds them,
        // with a fraction of the bytes read.
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("t-0");
        fs::create_dir_all(&dir).unwrap();
        let mut log = Vec::new();
        let mut next = 0i64;
        for i in 0..400 {
            log.extend(batch(next, 16, 1000, None));
            next += 16;
            if i % 10 == 9 {
                log.extend(batch(next, 2, 10, Some(7)));
                log.extend(codec::control_batch(next + 2, 7, 0, i % 20 == 9, 2000, 0));
                next += 3;
            }
        }
        let open_at = next;
        log.extend(batch(next, 16, 1000, Some(9)));
        next += 16;
        log.extend(batch(next, 16, 1000, None));
        next += 16;
        let torn = batch(next, 16, 1000, None);
        log.extend(&torn[..torn.len() / 2]);
        fs::write(dir.join(log_file_name(0)), &log).unwrap();

        assert_eq!(offsets_of(&dir).unwrap(), Bounds { start: 0, end: next, last_stable: open_at });
        let mut scan = HeaderScan::new(&dir, list_segments(&dir).unwrap(), 0, 0).unwrap();
        let mut batches = 0;
        while scan.next().unwrap().is_some() {
            batches += 1;
        }
        assert_eq!(batches, 400 + 40 * 2 + 2);
        assert!(scan.copied * 20 < log.len() as u64, "read {} of {} bytes", scan.copied, log.len());
    }

    #[test]
    fn the_scan_reads_small_batches_many_at_a_time() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("t-0");
        fs::create_dir_all(&dir).unwrap();
        let log: Vec<u8> = (0..2000).flat_map(|i| batch(i * 2, 2, 20, None)).collect();
        fs::write(dir.join(log_file_name(0)), &log).unwrap();
        assert_eq!(offsets_of(&dir).unwrap(), Bounds { start: 0, end: 4000, last_stable: 4000 });
        let mut scan = HeaderScan::new(&dir, list_segments(&dir).unwrap(), 0, 0).unwrap();
        while scan.next().unwrap().is_some() {}
        // One chunk read covers thousands of small batches: the file is read once.
        assert_eq!(scan.copied, log.len() as u64);
    }
}
