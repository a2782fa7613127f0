//! Segment files of one partition and a cursor that walks their batches.
//!
//! `<20-digit base offset>.log` holds concatenated batches; the sibling
//! `.index` holds 8-byte entries (offset relative to the base, file position),
//! one every [`INDEX_INTERVAL_BYTES`] of log. The index is only a hint: every
//! entry is checked against the log before use, and a missing or stale index
//! costs a scan, never a wrong answer.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::page_cache::CacheFootprint;
use super::LogError;
use crate::codec::{self, BatchHeader, HEADER_LEN, LOG_OVERHEAD};

/// Bytes of log between two index entries (Kafka's `index.interval.bytes`).
pub const INDEX_INTERVAL_BYTES: u64 = 4096;
/// Default read size of a cursor.
pub const DEFAULT_CHUNK: usize = 1 << 20;
/// The most bytes an interrupted append can leave after the last complete
/// batch (a prefix of one batch). An "incomplete batch" with more bytes after
/// it than this is a damaged length field, not a torn tail: it is reported as
/// corruption instead of silently ending the log (or being cut off) there.
pub const MAX_TORN_TAIL: u64 = 16 << 20;

/// The error for an incomplete batch too far from the end to be a torn tail.
pub fn not_a_torn_tail(path: &Path, position: u64, offset: i64, len: i32, file_len: u64) -> LogError {
    LogError::corrupt(
        path,
        position,
        offset,
        format!(
            "batch length {len} runs past the end of the file, but {} bytes follow, more than an interrupted \
             append leaves ({MAX_TORN_TAIL}): the length field is damaged",
            file_len - position
        ),
    )
}

/// Where a complete, valid batch with a base offset above `after` starts in
/// `f` between `pos` and `file_len`, if anywhere (only the last
/// [`MAX_TORN_TAIL`] bytes are looked at, and only when a batch's length runs
/// past the end of the file). An interrupted append leaves a prefix of one
/// batch and never a valid batch after it, so a batch found here means the
/// length field at `pos` is damaged and the "tail" holds committed data.
pub fn valid_batch_after(f: &File, path: &Path, pos: u64, file_len: u64, after: i64) -> Result<Option<u64>, LogError> {
    let n = (file_len - pos).min(MAX_TORN_TAIL) as usize;
    if n < 2 * HEADER_LEN {
        return Ok(None);
    }
    let mut tail = vec![0u8; n];
    f.read_exact_at(&mut tail, pos).map_err(|e| LogError::io("read", path, e))?;
    for p in 1..=n - HEADER_LEN {
        if tail[p + 16] != 2 {
            continue; // the magic byte of a v2 batch
        }
        let Some((base, len)) = codec::peek_offset_and_length(&tail[p..]) else { continue };
        if base <= after || len < (HEADER_LEN - LOG_OVERHEAD) as i32 || p + len as usize + LOG_OVERHEAD > n {
            continue;
        }
        let batch = &tail[p..p + len as usize + LOG_OVERHEAD];
        let Ok(header) = BatchHeader::parse(batch) else { continue };
        if codec::verify_crc(&header, batch).is_ok() {
            return Ok(Some(pos + p as u64));
        }
    }
    Ok(None)
}

/// The error for a length field that runs past the end of the file although a
/// valid batch follows (see [`valid_batch_after`]).
pub fn damaged_length(path: &Path, position: u64, offset: i64, len: i32, next: u64) -> LogError {
    LogError::corrupt(
        path,
        position,
        offset,
        format!(
            "batch length {len} runs past the end of the file, but a valid batch follows at byte {next}: the \
             length field is damaged, this is not an interrupted append"
        ),
    )
}

/// One segment: its base offset and `.log` path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub base: i64,
    pub path: PathBuf,
}

impl Segment {
    /// The `.index` file beside the `.log`.
    pub fn index_path(&self) -> PathBuf {
        self.path.with_extension("index")
    }
}

/// `<20-digit base>.log`.
pub fn log_file_name(base: i64) -> String {
    format!("{base:020}.log")
}

/// The segments of the partition directory `dir`, in offset order. A missing
/// directory has no segments.
pub fn list_segments(dir: &Path) -> Result<Vec<Segment>, LogError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LogError::io("list", dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LogError::io("list", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".log") else { continue };
        if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(base) = stem.parse::<i64>() else { continue };
        out.push(Segment { base, path: entry.path() });
    }
    out.sort_by_key(|s| s.base);
    Ok(out)
}

/// A token of the partition directory `dir`'s segment files as they are now:
/// it changes when one is added, removed, replaced (a new inode, as the log
/// cleaner swaps them), grown or truncated (length, modification and change
/// times). `None` when a file cannot be examined.
pub fn stamp(dir: &Path) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let mut h = std::hash::DefaultHasher::new();
    for seg in list_segments(dir).ok()? {
        let m = fs::metadata(&seg.path).ok()?;
        (seg.base, m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()).hash(&mut h);
    }
    Some(h.finish())
}

/// Read the index of `seg`: the valid `(absolute offset, position)` entries,
/// ignoring a partial trailing entry. Missing index: empty.
pub fn read_index(seg: &Segment) -> Vec<(i64, u64)> {
    let Ok(bytes) = fs::read(seg.index_path()) else { return Vec::new() };
    let mut out = Vec::with_capacity(bytes.len() / 8);
    let mut last = (-1i64, 0u64);
    for e in bytes.chunks_exact(8) {
        let rel = u32::from_be_bytes(e[..4].try_into().unwrap());
        let pos = u32::from_be_bytes(e[4..].try_into().unwrap()) as u64;
        let Some(off) = seg.base.checked_add(rel as i64) else { break };
        if off <= last.0 || (pos <= last.1 && last.0 >= 0) {
            break; // not increasing: stale or damaged from here on
        }
        last = (off, pos);
        out.push(last);
    }
    out
}

/// A batch the cursor is looking at.
#[derive(Debug, Clone, Copy)]
pub struct Peeked {
    pub header: BatchHeader,
    /// Byte position of the batch in its segment file.
    pub position: u64,
    /// Index of the segment in the cursor's list.
    pub segment: usize,
}

/// Walks the batches of a partition's segments in order, reading the files in
/// large chunks. Stops cleanly (returns `None`) at the end of the log or at an
/// incomplete batch at the end of the last segment (a torn tail or a write in
/// progress), and picks up where it stopped when called again after the log
/// grew. Bytes that are not a batch anywhere else are `LogError::Corrupt`.
pub struct BatchCursor {
    dir: PathBuf,
    segments: Vec<Segment>,
    seg: usize,
    file: Option<File>,
    buf: Vec<u8>,
    /// File position of `buf[0]`.
    buf_pos: u64,
    lo: usize,
    hi: usize,
    chunk: usize,
    verify_crc: bool,
    /// Offset the next batch must not start below.
    expected: i64,
    peeked: Option<Peeked>,
    bytes_read: u64,
    /// With [`BatchCursor::leave_page_cache_as_found`]: the open segment's
    /// pages cached before this cursor read it.
    footprint: Option<CacheFootprint>,
    leaves_cache_as_found: bool,
}

impl BatchCursor {
    /// A cursor over the partition in `dir` positioned at the batch that
    /// contains `start_offset` (or the first batch after it). Reads `chunk`
    /// bytes at a time; verifies CRCs when `verify_crc`.
    pub fn open(dir: &Path, start_offset: i64, chunk: usize, verify_crc: bool) -> Result<Self, LogError> {
        let segments = list_segments(dir)?;
        let mut c = BatchCursor {
            dir: dir.to_path_buf(),
            segments,
            seg: 0,
            file: None,
            buf: Vec::new(),
            buf_pos: 0,
            lo: 0,
            hi: 0,
            chunk: chunk.max(HEADER_LEN),
            verify_crc,
            expected: 0,
            peeked: None,
            bytes_read: 0,
            footprint: None,
            leaves_cache_as_found: false,
        };
        if c.segments.is_empty() {
            return Ok(c);
        }
        c.seg = c.segments.iter().rposition(|s| s.base <= start_offset).unwrap_or(0);
        let seg = c.segments[c.seg].clone();
        c.expected = seg.base;
        // Start from the last index entry at or below start_offset, if the log
        // agrees with it; otherwise from the start of the segment.
        let hint = read_index(&seg).into_iter().take_while(|&(o, _)| o <= start_offset).last();
        c.open_segment(hint.map_or(0, |(_, p)| p))?;
        if let Some((off, pos)) = hint {
            let ok = matches!(c.peek(), Ok(Some(p)) if p.header.base_offset == off && p.position == pos && p.segment == c.seg);
            if !ok {
                // The peek may have moved on to a later segment (a position past
                // the end of this one): come back to the start of this one.
                c.seg = c.segments.iter().position(|s| s.base == seg.base).unwrap_or(c.seg);
                c.expected = seg.base;
                c.open_segment(0)?;
            } else {
                c.expected = off;
            }
        }
        // Skip whole batches below start_offset.
        while let Some(p) = c.peek()? {
            if p.header.next_offset() > start_offset {
                break;
            }
            c.advance();
        }
        Ok(c)
    }

    /// Give back the pages of each segment this cursor brings into the page
    /// cache when it leaves the segment (or is dropped): for a reader that
    /// reads the log once ([`super::page_cache`]). Of the open segment, what
    /// the cursor read to find its start counts as found.
    pub fn leave_page_cache_as_found(&mut self) {
        self.leaves_cache_as_found = true;
        if self.footprint.is_none() {
            self.footprint = self.file.as_ref().and_then(CacheFootprint::of);
        }
    }

    /// Give back what the cursor brought in of the open segment up to where it read.
    fn leave_segment(&mut self) {
        if let (Some(fp), Some(f)) = (self.footprint.take(), &self.file) {
            fp.give_back(f, self.buf_pos + self.hi as u64);
        }
    }

    fn open_segment(&mut self, position: u64) -> Result<(), LogError> {
        self.leave_segment();
        let seg = &self.segments[self.seg];
        let f = File::open(&seg.path).map_err(|e| LogError::io("open", &seg.path, e))?;
        if self.leaves_cache_as_found {
            self.footprint = CacheFootprint::of(&f);
        }
        self.file = Some(f);
        self.buf_pos = position;
        self.lo = 0;
        self.hi = 0;
        self.peeked = None;
        Ok(())
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// Bytes read from segment files so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }
    /// The segments known to the cursor.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    fn current_len(&self) -> Result<u64, LogError> {
        let seg = &self.segments[self.seg];
        match &self.file {
            Some(f) => f.metadata().map(|m| m.len()).map_err(|e| LogError::io("stat", &seg.path, e)),
            None => Ok(0),
        }
    }

    /// Read more of the current file into the buffer so that at least `need`
    /// bytes are available after `lo`. Returns false at end of file.
    fn fill(&mut self, need: usize) -> Result<bool, LogError> {
        if self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            self.buf_pos += self.lo as u64;
            self.hi -= self.lo;
            self.lo = 0;
        }
        let want = need.max(self.chunk);
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        let Some(f) = &self.file else { return Ok(false) };
        let mut got_any = false;
        while self.hi < need {
            let n = f
                .read_at(&mut self.buf[self.hi..], self.buf_pos + self.hi as u64)
                .map_err(|e| LogError::io("read", &self.segments[self.seg].path, e))?;
            if n == 0 {
                return Ok(got_any && self.hi >= need);
            }
            got_any = true;
            self.hi += n;
            self.bytes_read += n as u64;
        }
        Ok(true)
    }

    fn corrupt(&self, position: u64, offset: i64, msg: impl std::fmt::Display) -> LogError {
        LogError::corrupt(&self.segments[self.seg].path, position, offset, msg)
    }

    /// Move to the next segment if the current one is finished. Returns false
    /// when there is none (after re-listing the directory, so a roll by a
    /// concurrent writer is seen).
    fn next_segment(&mut self) -> Result<bool, LogError> {
        if self.seg + 1 >= self.segments.len() {
            let fresh = list_segments(&self.dir)?;
            let cur_base = self.segments.get(self.seg).map(|s| s.base);
            if fresh.len() > self.segments.len() || cur_base.is_none() {
                self.segments = fresh;
                if cur_base.is_none() {
                    if self.segments.is_empty() {
                        return Ok(false);
                    }
                    self.seg = 0;
                    self.expected = self.segments[0].base;
                    self.open_segment(0)?;
                    return Ok(true);
                }
                if let Some(i) = self.segments.iter().position(|s| Some(s.base) == cur_base) {
                    self.seg = i;
                }
            }
            if self.seg + 1 >= self.segments.len() {
                return Ok(false);
            }
            // A newer segment exists: the writer finished this one before
            // creating it, so if this file grew meanwhile, read the rest first.
            if self.current_len()? > self.buf_pos + self.hi as u64 {
                return Ok(true);
            }
        }
        self.seg += 1;
        let base = self.segments[self.seg].base;
        if base < self.expected {
            return Err(LogError::corrupt(
                &self.segments[self.seg].path,
                0,
                base,
                format!("segment base offset {base} is below the end of the previous segment ({})", self.expected),
            ));
        }
        self.expected = base;
        self.open_segment(0)?;
        Ok(true)
    }

    fn is_last_segment(&self) -> bool {
        self.seg + 1 >= self.segments.len()
    }

    /// The next batch, without consuming it; `None` at the end of the log.
    pub fn peek(&mut self) -> Result<Option<Peeked>, LogError> {
        if let Some(p) = self.peeked {
            return Ok(Some(p));
        }
        if self.segments.is_empty() && !self.next_segment()? {
            return Ok(None);
        }
        loop {
            let avail = self.hi - self.lo;
            let pos = self.buf_pos + self.lo as u64;
            if avail >= LOG_OVERHEAD {
                let (base, len) = codec::peek_offset_and_length(&self.buf[self.lo..self.hi]).unwrap();
                if (len as i64) < (HEADER_LEN - LOG_OVERHEAD) as i64 {
                    if self.is_last_segment() && self.rest_is_zero()? {
                        return Ok(None);
                    }
                    return Err(self.corrupt(pos, base, format!("batch length {len} is shorter than a batch header")));
                }
                let total = len as usize + LOG_OVERHEAD;
                if avail >= total {
                    let batch = &self.buf[self.lo..self.lo + total];
                    let header = BatchHeader::parse(batch).map_err(|e| self.corrupt(pos, base, e))?;
                    if header.base_offset < self.expected {
                        return Err(self.corrupt(
                            pos,
                            base,
                            format!("base offset {base} goes back (the previous batch ended at {})", self.expected - 1),
                        ));
                    }
                    if let Some(limit) = self.segments.get(self.seg + 1).map(|s| s.base) {
                        check_below_next_segment(&header, limit).map_err(|m| self.corrupt(pos, base, m))?;
                    }
                    if self.verify_crc {
                        codec::verify_crc(&header, batch).map_err(|e| self.corrupt(pos, base, e))?;
                    }
                    let p = Peeked { header, position: pos, segment: self.seg };
                    self.peeked = Some(p);
                    return Ok(Some(p));
                }
                // Never allocate for a batch longer than the bytes in the file.
                let file_len = self.current_len()?;
                if pos + total as u64 <= file_len {
                    self.fill(total)?;
                    continue;
                }
                if file_len - pos > MAX_TORN_TAIL {
                    return Err(not_a_torn_tail(&self.segments[self.seg].path, pos, base, len, file_len));
                }
                let path = &self.segments[self.seg].path;
                if let Some(f) = &self.file {
                    if let Some(next) = valid_batch_after(f, path, pos, file_len, base)? {
                        return Err(damaged_length(path, pos, base, len, next));
                    }
                }
            } else if self.fill(LOG_OVERHEAD)? {
                continue;
            }
            // Not enough bytes for the next batch in this file.
            if self.hi > self.lo {
                // An incomplete batch: the tail of the log (torn, or being written).
                if self.is_last_segment() && !self.next_segment_appeared()? {
                    return Ok(None);
                }
                if self.fill(self.hi - self.lo + 1)? {
                    continue;
                }
                if self.is_last_segment() {
                    return Ok(None);
                }
                let base = codec::peek_offset_and_length(&self.buf[self.lo..self.hi]).map_or(-1, |x| x.0);
                return Err(self.corrupt(pos, base, "segment ends inside a batch but a later segment exists"));
            }
            if !self.next_segment()? {
                return Ok(None);
            }
        }
    }

    /// Re-list the directory; true if a segment after the current one exists now.
    fn next_segment_appeared(&mut self) -> Result<bool, LogError> {
        let fresh = list_segments(&self.dir)?;
        let cur = self.segments[self.seg].base;
        let appeared = fresh.iter().any(|s| s.base > cur);
        if appeared {
            self.segments = fresh;
            self.seg = self.segments.iter().position(|s| s.base == cur).unwrap_or(self.seg);
        }
        Ok(appeared)
    }

    fn rest_is_zero(&mut self) -> Result<bool, LogError> {
        let len = self.current_len()?;
        let mut pos = self.buf_pos + self.lo as u64;
        let f = self.file.as_ref().expect("a segment is open");
        let mut chunk = vec![0u8; (len.saturating_sub(pos)).min(64 * 1024) as usize];
        while pos < len {
            let n = f.read_at(&mut chunk, pos).map_err(|e| LogError::io("read", &self.segments[self.seg].path, e))?;
            if n == 0 {
                break;
            }
            if chunk[..n].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            pos += n as u64;
        }
        Ok(true)
    }

    /// The bytes of the peeked batch.
    pub fn batch_bytes(&self) -> &[u8] {
        let p = self.peeked.as_ref().expect("peek() returned a batch");
        &self.buf[self.lo..self.lo + p.header.total_len()]
    }

    /// The segment file of the peeked batch.
    pub fn segment_path(&self) -> &Path {
        &self.segments[self.seg].path
    }

    /// Consume the peeked batch.
    pub fn advance(&mut self) {
        if let Some(p) = self.peeked.take() {
            self.lo += p.header.total_len();
            self.expected = p.header.next_offset();
        }
    }

    /// The offset the next batch may start at (end of the last consumed batch).
    pub fn expected_offset(&self) -> i64 {
        self.expected
    }
}

impl Drop for BatchCursor {
    fn drop(&mut self) {
        self.leave_segment();
    }
}

/// A batch of a segment that has a successor must end below the successor's
/// base offset. The base offset is not covered by the CRC, so a damaged one
/// is caught here (or by the "goes back" check), not by the CRC.
pub fn check_below_next_segment(header: &BatchHeader, next_base: i64) -> Result<(), String> {
    if header.next_offset() > next_base {
        return Err(format!(
            "batch of offsets {}..={} runs into the next segment, which starts at offset {next_base}",
            header.base_offset,
            header.last_offset()
        ));
    }
    Ok(())
}

/// What [`scan_segment`] found in one segment file.
pub struct ScanResult {
    /// End of the last complete, valid batch; bytes after it are a torn tail.
    pub valid_len: u64,
    /// The offset after the last valid batch (the base offset if none).
    pub next_offset: i64,
    /// Fresh sparse index entries `(relative offset, position)`.
    pub index: Vec<(u32, u32)>,
    /// Size of the file when scanned.
    pub file_len: u64,
}

/// Check every batch of one segment file (used when a writer opens a
/// partition): where valid batches end, the next offset and a fresh index.
/// An incomplete batch or zeros at the end are a torn tail (reported through
/// `valid_len < file_len`); anything invalid before that is `Corrupt`.
pub fn scan_segment(seg: &Segment) -> Result<ScanResult, LogError> {
    let f = File::open(&seg.path).map_err(|e| LogError::io("open", &seg.path, e))?;
    let file_len = f.metadata().map_err(|e| LogError::io("stat", &seg.path, e))?.len();
    let mut pos = 0u64;
    let mut next = seg.base;
    let mut index = Vec::new();
    let mut since_index = 0u64;
    // Grown to the largest batch below; never more than the file holds.
    let mut buf = vec![0u8; (file_len.min(DEFAULT_CHUNK as u64)) as usize];
    let mut head = [0u8; LOG_OVERHEAD];
    loop {
        if pos + LOG_OVERHEAD as u64 > file_len {
            break;
        }
        f.read_exact_at(&mut head, pos).map_err(|e| LogError::io("read", &seg.path, e))?;
        let (base, len) = codec::peek_offset_and_length(&head).unwrap();
        let total = (len as i64) + LOG_OVERHEAD as i64;
        if len < (HEADER_LEN - LOG_OVERHEAD) as i32 || pos + total as u64 > file_len {
            if file_len - pos > MAX_TORN_TAIL && len >= (HEADER_LEN - LOG_OVERHEAD) as i32 {
                return Err(not_a_torn_tail(&seg.path, pos, base, len, file_len));
            }
            if let Some(at) = valid_batch_after(&f, &seg.path, pos, file_len, base)? {
                return Err(damaged_length(&seg.path, pos, base, len, at));
            }
            if tail_is_torn(&f, pos, file_len, len)? {
                break;
            }
            return Err(LogError::corrupt(&seg.path, pos, base, format!("batch length {len} is invalid")));
        }
        let total = total as usize;
        if buf.len() < total {
            buf.resize(total, 0);
        }
        f.read_exact_at(&mut buf[..total], pos).map_err(|e| LogError::io("read", &seg.path, e))?;
        let batch = &buf[..total];
        let header = BatchHeader::parse(batch).map_err(|e| LogError::corrupt(&seg.path, pos, base, e))?;
        codec::verify_crc(&header, batch).map_err(|e| LogError::corrupt(&seg.path, pos, base, e))?;
        if header.base_offset < next {
            return Err(LogError::corrupt(&seg.path, pos, base, format!("base offset goes back below {next}")));
        }
        if since_index >= INDEX_INTERVAL_BYTES {
            index.push(((header.base_offset - seg.base) as u32, pos as u32));
            since_index = 0;
        }
        since_index += total as u64;
        pos += total as u64;
        next = header.next_offset();
    }
    Ok(ScanResult { valid_len: pos, next_offset: next, index, file_len })
}

/// Is the region from `pos` to the end of the file a torn write? True when it
/// is all zeros, or when it is a prefix of a batch whose length runs past the
/// end of the file (what an interrupted append leaves).
fn tail_is_torn(f: &File, pos: u64, file_len: u64, len: i32) -> Result<bool, LogError> {
    if len >= (HEADER_LEN - LOG_OVERHEAD) as i32 && pos + len as u64 + LOG_OVERHEAD as u64 > file_len {
        return Ok(true);
    }
    let mut rest = vec![0u8; (file_len - pos).min(1 << 20) as usize];
    let n = f.read_at(&mut rest, pos).unwrap_or(0);
    Ok(rest[..n].iter().all(|&b| b == 0) && pos + n as u64 == file_len)
}
