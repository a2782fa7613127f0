//! The writer of one partition: assigns offsets, buffers records into
//! multi-record batches, appends them to the active segment, rolls segments
//! and keeps the sparse index.
//!
//! One process writes a partition at a time (`.writer.lock`, an exclusive
//! `flock`); inside a process all producers share one writer per partition
//! through a registry, so interleaved producers get contiguous offsets and
//! their records land in the log in offset order. Opening a writer repairs
//! the partition: a torn tail (an append interrupted by a crash) is cut off
//! and the index of the active segment is rebuilt.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::segment::{list_segments, log_file_name, scan_segment, Segment, INDEX_INTERVAL_BYTES};
use super::{LogError, LogErrorKind};
use crate::codec::{control_batch, BatchBuilder, BatchMeta, Compression};
use crate::fileio::fsync_dir;

/// Default segment size (Kafka's `segment.bytes`): 1 GiB.
pub const DEFAULT_SEGMENT_BYTES: u64 = 1 << 30;
/// A batch is sealed once its records reach this size.
pub const MAX_BATCH_BYTES: usize = 1 << 20;
/// Sealed batches are written once this much is buffered (or on flush).
const WRITE_BUFFER_BYTES: usize = 4 << 20;

/// How a partition is written.
#[derive(Debug, Clone, Copy)]
pub struct WriterConfig {
    /// Roll to a new segment before a batch would make the active one larger.
    pub segment_bytes: u64,
    /// fsync on flush and on transaction markers.
    pub sync: bool,
    /// Codec for data batches.
    pub compression: Compression,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig { segment_bytes: DEFAULT_SEGMENT_BYTES, sync: true, compression: Compression::None }
    }
}

fn same_batch(a: &BatchMeta, b: &BatchMeta) -> bool {
    a.producer_id == b.producer_id
        && a.producer_epoch == b.producer_epoch
        && a.transactional == b.transactional
        && a.control == b.control
}

/// The single writer of one partition in this process.
pub struct PartitionWriter {
    dir: PathBuf,
    _lock: File,
    cfg: WriterConfig,
    active: File,
    active_path: PathBuf,
    active_len: u64,
    index: File,
    since_index: u64,
    next_offset: i64,
    pending: Option<BatchBuilder>,
    out: Vec<u8>,
    out_batches: Vec<(i64, usize)>,
    unsynced: bool,
}

fn lock_exclusive(path: &Path, what: &str) -> Result<File, LogError> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| LogError::io("open lock file", path, e))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(LogError::new(
                LogErrorKind::Lock,
                format!(
                    "{what} is already being written by another process (lock {} is held); only one writer per \
                 partition may run: close the other producer, or write to another partition",
                    path.display()
                ),
            )
            .with_path(path));
        }
        return Err(LogError::io("lock", path, e));
    }
    Ok(f)
}

fn write_index(seg: &Segment, entries: &[(u32, u32)]) -> Result<(), LogError> {
    let mut bytes = Vec::with_capacity(entries.len() * 8);
    for (rel, pos) in entries {
        bytes.extend_from_slice(&rel.to_be_bytes());
        bytes.extend_from_slice(&pos.to_be_bytes());
    }
    crate::fileio::atomic_write(&seg.index_path(), &bytes).map_err(|e| LogError::other(e.to_string()))
}

fn create_segment(dir: &Path, base: i64) -> Result<Segment, LogError> {
    let seg = Segment { base, path: dir.join(log_file_name(base)) };
    OpenOptions::new().create(true).append(true).open(&seg.path).map_err(|e| LogError::io("create", &seg.path, e))?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(seg.index_path())
        .map_err(|e| LogError::io("create", &seg.index_path(), e))?;
    fsync_dir(dir).map_err(|e| LogError::other(e.to_string()))?;
    Ok(seg)
}

impl PartitionWriter {
    /// Open the partition directory `dir` for writing (created if missing),
    /// taking its lock and repairing a torn tail.
    pub fn open(dir: &Path, cfg: WriterConfig) -> Result<Self, LogError> {
        fs::create_dir_all(dir).map_err(|e| LogError::io("create directory", dir, e))?;
        let what = format!("partition {}", dir.display());
        let lock = lock_exclusive(&dir.join(".writer.lock"), &what)?;
        let mut segments = list_segments(dir)?;
        if segments.is_empty() {
            segments.push(create_segment(dir, 0)?);
        }
        // Older segments: rebuild an index that is missing or cut short.
        for seg in &segments[..segments.len() - 1] {
            let ok = fs::metadata(seg.index_path()).map(|m| m.len() % 8 == 0).unwrap_or(false);
            if !ok {
                let scan = scan_segment(seg)?;
                write_index(seg, &scan.index)?;
            }
        }
        let last = segments.last().unwrap().clone();
        let scan = scan_segment(&last)?;
        if scan.valid_len < scan.file_len {
            let f = OpenOptions::new().write(true).open(&last.path).map_err(|e| LogError::io("open", &last.path, e))?;
            f.set_len(scan.valid_len).map_err(|e| LogError::io("truncate torn tail of", &last.path, e))?;
            f.sync_all().map_err(|e| LogError::io("fsync", &last.path, e))?;
        }
        write_index(&last, &scan.index)?;
        let active =
            OpenOptions::new().append(true).open(&last.path).map_err(|e| LogError::io("open", &last.path, e))?;
        let index = OpenOptions::new()
            .append(true)
            .open(last.index_path())
            .map_err(|e| LogError::io("open", &last.index_path(), e))?;
        let since_index = scan.valid_len - scan.index.last().map_or(0, |&(_, p)| p as u64);
        Ok(PartitionWriter {
            dir: dir.to_path_buf(),
            _lock: lock,
            cfg,
            active,
            active_path: last.path.clone(),
            active_len: scan.valid_len,
            index,
            since_index,
            next_offset: scan.next_offset,
            pending: None,
            out: Vec::new(),
            out_batches: Vec::new(),
            unsynced: false,
        })
    }

    /// The partition directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The next offset this writer will assign.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }

    /// Buffer one record; returns its offset. Records of one producer go into
    /// the same batch until it is full or another producer writes.
    pub fn send(
        &mut self,
        meta: BatchMeta,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
    ) -> Result<i64, LogError> {
        if let Some(p) = &self.pending {
            if !same_batch(p.meta(), &meta) || p.size() >= MAX_BATCH_BYTES || p.count() >= 1 << 30 {
                self.seal()?;
            }
        }
        let offset = self.next_offset;
        self.check_room(offset)?;
        let b = self.pending.get_or_insert_with(|| BatchBuilder::new(offset, meta));
        b.append(offset, timestamp, key, value, headers);
        self.next_offset += 1;
        Ok(offset)
    }

    /// Offsets end below i64::MAX (the offset after the last record must
    /// exist); a segment named near it leaves no room to append.
    fn check_room(&self, offset: i64) -> Result<(), LogError> {
        if offset == i64::MAX {
            return Err(LogError::other(format!(
                "partition {} has no offsets left to assign (the log ends at offset {offset})",
                self.dir.display()
            )));
        }
        Ok(())
    }

    /// Close the pending batch and queue its bytes for writing.
    fn seal(&mut self) -> Result<(), LogError> {
        if let Some(b) = self.pending.take() {
            let start = self.out.len();
            b.finish_into(self.cfg.compression, &mut self.out);
            self.out_batches.push((b.base_offset(), self.out.len() - start));
            if self.out.len() >= WRITE_BUFFER_BYTES {
                self.write_out()?;
            }
        }
        Ok(())
    }

    fn roll(&mut self, base: i64) -> Result<(), LogError> {
        if self.cfg.sync {
            self.active.sync_data().map_err(|e| LogError::io("fsync", &self.active_path, e))?;
            self.index.sync_data().map_err(|e| LogError::io("fsync", &self.active_path, e))?;
        }
        let seg = create_segment(&self.dir, base)?;
        self.active =
            OpenOptions::new().append(true).open(&seg.path).map_err(|e| LogError::io("open", &seg.path, e))?;
        self.index = OpenOptions::new()
            .append(true)
            .open(seg.index_path())
            .map_err(|e| LogError::io("open", &seg.index_path(), e))?;
        self.active_path = seg.path;
        self.active_len = 0;
        self.since_index = 0;
        Ok(())
    }

    fn write_group(&mut self, from: usize, to: usize, index: &mut Vec<u8>) -> Result<(), LogError> {
        if from == to {
            return Ok(());
        }
        self.active.write_all(&self.out[from..to]).map_err(|e| LogError::io("append to", &self.active_path, e))?;
        self.active_len += (to - from) as u64;
        if !index.is_empty() {
            self.index.write_all(index).map_err(|e| LogError::io("append to index of", &self.active_path, e))?;
            index.clear();
        }
        self.unsynced = true;
        Ok(())
    }

    /// Write every sealed batch to the segment files, rolling as needed.
    fn write_out(&mut self) -> Result<(), LogError> {
        let batches = std::mem::take(&mut self.out_batches);
        let mut index = Vec::new();
        let mut group_start = 0usize;
        let mut at = 0usize;
        let mut seg_len = self.active_len;
        let seg_base =
            |p: &Path| -> i64 { p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse().ok()).unwrap_or(0) };
        let mut base = seg_base(&self.active_path);
        for (batch_base, len) in batches {
            if seg_len > 0 && seg_len + len as u64 > self.cfg.segment_bytes {
                self.write_group(group_start, at, &mut index)?;
                self.roll(batch_base)?;
                base = batch_base;
                seg_len = 0;
                group_start = at;
            }
            if self.since_index >= INDEX_INTERVAL_BYTES {
                index.extend_from_slice(&((batch_base - base) as u32).to_be_bytes());
                index.extend_from_slice(&(seg_len as u32).to_be_bytes());
                self.since_index = 0;
            }
            self.since_index += len as u64;
            seg_len += len as u64;
            at += len;
        }
        self.write_group(group_start, at, &mut index)?;
        self.out.clear();
        Ok(())
    }

    /// Write everything buffered; with `sync` (and the config's `sync`), fsync it.
    pub fn flush(&mut self, sync: bool) -> Result<(), LogError> {
        self.seal()?;
        self.write_out()?;
        if sync && self.cfg.sync && self.unsynced {
            self.active.sync_data().map_err(|e| LogError::io("fsync", &self.active_path, e))?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Append a transaction marker for `producer_id` after everything
    /// buffered, write it out and sync. Returns the marker's offset.
    pub fn append_marker(
        &mut self,
        producer_id: i64,
        epoch: i16,
        commit: bool,
        timestamp: i64,
    ) -> Result<i64, LogError> {
        self.seal()?;
        let offset = self.next_offset;
        self.check_room(offset)?;
        let batch = control_batch(offset, producer_id, epoch, commit, timestamp, 0);
        self.out.extend_from_slice(&batch);
        self.out_batches.push((offset, batch.len()));
        self.next_offset += 1;
        self.flush(true)?;
        Ok(offset)
    }
}

impl Drop for PartitionWriter {
    fn drop(&mut self) {
        // Best effort: buffered records reach the file when the writer goes away.
        let _ = self.flush(true);
    }
}

type Registry = Mutex<HashMap<PathBuf, Weak<Mutex<PartitionWriter>>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The writer of partition directory `dir` in this process, opened (and
/// locked against other processes) if no one here has it yet.
pub fn acquire(dir: &Path, cfg: WriterConfig) -> Result<Arc<Mutex<PartitionWriter>>, LogError> {
    fs::create_dir_all(dir).map_err(|e| LogError::io("create directory", dir, e))?;
    let key = fs::canonicalize(dir).map_err(|e| LogError::io("resolve", dir, e))?;
    let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(w) = reg.get(&key).and_then(Weak::upgrade) {
        return Ok(w);
    }
    let w = Arc::new(Mutex::new(PartitionWriter::open(&key, cfg)?));
    reg.retain(|_, w| w.strong_count() > 0);
    reg.insert(key, Arc::downgrade(&w));
    Ok(w)
}
