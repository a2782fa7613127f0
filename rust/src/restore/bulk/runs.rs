//! Sorted runs spilled to disk and their k-way merge.
//!
//! A run file is a sequence of `key_len u32 LE, val_len u32 LE (u32::MAX for a
//! tombstone), key, value`, keys strictly increasing. Runs are numbered in the
//! order they were written; for a key present in several runs the newest run
//! wins. Intermediate merges keep tombstones (an older run may still hold the
//! key); only the final output may drop them.
//!
//! A run is one file, or several holding consecutive key ranges (a spill
//! split across threads writes a file per range, side by side). It
//! remembers, every [`INDEX_EVERY`] bytes of a file, the key written there
//! and its position (a sparse index, kept in memory): the quantiles of these
//! keys over all runs split a merge into key ranges of about equal bytes
//! ([`pivots`]), and a range's merge ([`merge_range`]) starts reading each
//! run at the last indexed position at or before its range, not at the start.

use std::cmp::Ordering;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::collect::{common_prefix, prefix_of, TOMBSTONE};

/// A sorted run on disk, with the first and last key it holds (all its keys
/// share their common prefix, which lets a merge skip comparing it).
#[derive(Debug, Clone)]
pub struct Run {
    /// Its files, in key order.
    pub files: Vec<PathBuf>,
    first: Vec<u8>,
    last: Vec<u8>,
    /// A key every [`INDEX_EVERY`] bytes of a file, with the file (its place
    /// in `files`) and where its record starts.
    index: Vec<(Vec<u8>, usize, u64)>,
    /// Each file's size in bytes.
    bytes: Vec<u64>,
}

/// Bytes of run between two entries of a run's sparse index: ~300 keys for a
/// run of 77 MiB (a 256 MiB budget's collector), a few KiB of memory.
pub const INDEX_EVERY: u64 = 256 << 10;

/// Bytes a record takes in a run file: its header, key and value.
fn record_bytes(key: &[u8], value: Option<&[u8]>) -> u64 {
    8 + key.len() as u64 + value.map_or(0, |v| v.len() as u64)
}

/// Writes one sorted run of one file (or one key range of a run:
/// [`Run::join`]).
pub struct RunWriter {
    out: BufWriter<File>,
    path: PathBuf,
    first: Option<Vec<u8>>,
    last: Vec<u8>,
    written: u64,
    index: Vec<(Vec<u8>, usize, u64)>,
}

impl RunWriter {
    pub fn create(path: &Path, buffer: usize) -> io::Result<Self> {
        Ok(Self {
            out: BufWriter::with_capacity(buffer, File::create(path)?),
            path: path.to_path_buf(),
            first: None,
            last: Vec::new(),
            written: 0,
            index: Vec::new(),
        })
    }

    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> io::Result<()> {
        let at = self.written;
        if self.index.last().is_none_or(|&(_, _, last)| at >= last + INDEX_EVERY) {
            self.index.push((key.to_vec(), 0, at));
        }
        self.written += record_bytes(key, value);
        self.out.write_all(&(key.len() as u32).to_le_bytes())?;
        self.out.write_all(&value.map_or(TOMBSTONE, |v| v.len() as u32).to_le_bytes())?;
        self.out.write_all(key)?;
        if let Some(v) = value {
            self.out.write_all(v)?;
        }
        if self.first.is_none() {
            self.first = Some(key.to_vec());
        }
        self.last.clear();
        self.last.extend_from_slice(key);
        Ok(())
    }

    /// Flush and close.
    pub fn finish(self) -> io::Result<Run> {
        let f = self.out.into_inner().map_err(|e| e.into_error())?;
        drop(f);
        Ok(Run {
            files: vec![self.path],
            first: self.first.unwrap_or_default(),
            last: self.last,
            index: self.index,
            bytes: vec![self.written],
        })
    }
}

impl Run {
    /// The one run that `parts` (runs of consecutive key ranges, in key
    /// order) make together: their files one after another.
    pub fn join(parts: Vec<Run>) -> Run {
        let full: Vec<&Run> = parts.iter().filter(|r| r.bytes.iter().sum::<u64>() > 0).collect();
        let mut index = Vec::new();
        let mut files = 0;
        for r in &parts {
            index.extend(r.index.iter().map(|(k, f, at)| (k.clone(), f + files, *at)));
            files += r.files.len();
        }
        Run {
            first: full.first().map(|r| r.first.clone()).unwrap_or_default(),
            last: full.last().map(|r| r.last.clone()).unwrap_or_default(),
            index,
            files: parts.iter().flat_map(|r| r.files.iter().cloned()).collect(),
            bytes: parts.iter().flat_map(|r| r.bytes.iter().copied()).collect(),
        }
    }
}

/// Longest prefix common to every key of every run in `runs`.
fn common_prefix_len(runs: &[Run]) -> usize {
    let Some(r0) = runs.first() else { return 0 };
    runs.iter().flat_map(|r| [&r.first, &r.last]).fold(r0.first.len(), |n, k| common_prefix(&r0.first[..n], k))
}

/// One run being read: its current record, in buffers reused record after record.
struct Cursor {
    input: BufReader<File>,
    /// The run's files, and the one being read.
    files: Vec<PathBuf>,
    file: usize,
    buffer: usize,
    key: Vec<u8>,
    value: Vec<u8>,
    tombstone: bool,
    /// `prefix_of` the key after the runs' common prefix.
    prefix: u64,
}

impl Cursor {
    /// Open the run of `files` to read from byte `at` (the start of a
    /// record) of its `file`-th file.
    fn open(files: &[PathBuf], buffer: usize, file: usize, at: u64) -> io::Result<Self> {
        let mut f = File::open(&files[file])?;
        if at > 0 {
            f.seek(SeekFrom::Start(at))?;
        }
        Ok(Self {
            input: BufReader::with_capacity(buffer, f),
            files: files.to_vec(),
            file,
            buffer,
            key: Vec::new(),
            value: Vec::new(),
            tombstone: false,
            prefix: 0,
        })
    }

    /// Read the next record; false at the end of the run.
    fn advance(&mut self, lcp: usize) -> io::Result<bool> {
        let mut hdr = [0u8; 8];
        loop {
            match self.input.read_exact(&mut hdr[..1]) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    if self.file + 1 == self.files.len() {
                        return Ok(false);
                    }
                    self.file += 1; // the run goes on in its next file
                    self.input = BufReader::with_capacity(self.buffer, File::open(&self.files[self.file])?);
                }
                Err(e) => return Err(e),
            }
        }
        self.input.read_exact(&mut hdr[1..]).map_err(|e| self.truncated(e))?;
        let klen = u32::from_le_bytes(hdr[..4].try_into().expect("4")) as usize;
        let vlen = u32::from_le_bytes(hdr[4..].try_into().expect("4"));
        self.key.resize(klen, 0);
        self.input.read_exact(&mut self.key).map_err(|e| self.truncated(e))?;
        self.tombstone = vlen == TOMBSTONE;
        self.value.resize(if self.tombstone { 0 } else { vlen as usize }, 0);
        self.input.read_exact(&mut self.value).map_err(|e| self.truncated(e))?;
        if self.key.len() < lcp {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("spilled run {} holds a key outside its recorded range", self.files[self.file].display()),
            ));
        }
        self.prefix = prefix_of(&self.key[lcp..]);
        Ok(true)
    }

    fn value(&self) -> Option<&[u8]> {
        (!self.tombstone).then_some(&self.value[..])
    }

    fn truncated(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("spilled run {} is truncated: {e}", self.files[self.file].display()))
    }
}

/// A binary min-heap of run indices ordered by their cursors' keys, the
/// newest run first among equal keys.
struct Heap {
    cursors: Vec<Cursor>,
    order: Vec<usize>,
    lcp: usize,
}

impl Heap {
    fn less(&self, a: usize, b: usize) -> bool {
        let (x, y) = (&self.cursors[a], &self.cursors[b]);
        match x.prefix.cmp(&y.prefix).then_with(|| x.key[self.lcp..].cmp(&y.key[self.lcp..])) {
            Ordering::Equal => a > b,
            o => o == Ordering::Less,
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.order.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && self.less(self.order[l], self.order[m]) {
                m = l;
            }
            if r < n && self.less(self.order[r], self.order[m]) {
                m = r;
            }
            if m == i {
                return;
            }
            self.order.swap(i, m);
            i = m;
        }
    }

    /// Move the top run to its next record (dropping it at its end) and restore the order.
    fn advance_top(&mut self) -> io::Result<()> {
        let top = self.order[0];
        if !self.cursors[top].advance(self.lcp)? {
            let last = self.order.pop().expect("non-empty");
            if self.order.is_empty() {
                return Ok(());
            }
            self.order[0] = last;
        }
        self.sift_down(0);
        Ok(())
    }
}

/// Merge `runs` (oldest first) into one key-ordered stream handed to `f`,
/// keeping for each key the entry of the newest run. Each reader gets a
/// buffer of `buffer` bytes.
pub fn merge<E: From<io::Error>>(
    runs: &[Run],
    buffer: usize,
    f: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>,
) -> Result<(), E> {
    merge_range(runs, buffer, None, None, f)
}

/// Up to `parts - 1` keys, increasing, that split the keys of `runs` into
/// `parts` ranges of about equal bytes: the byte quantiles of the runs'
/// sparse indexes, each entry weighing the bytes of its run up to the next
/// (as fine as [`INDEX_EVERY`]). Fewer when the runs are too small to split.
pub fn pivots(runs: &[Run], parts: usize) -> Vec<Vec<u8>> {
    let mut keys: Vec<(&[u8], u64)> = runs
        .iter()
        .flat_map(|r| {
            r.index.iter().enumerate().map(|(i, (k, f, at))| {
                let end = match r.index.get(i + 1) {
                    Some(&(_, next_f, next)) if next_f == *f => next,
                    _ => r.bytes[*f],
                };
                (&k[..], end - at)
            })
        })
        .collect();
    keys.sort_unstable();
    let total: u64 = keys.iter().map(|&(_, w)| w).sum();
    let mut pivots: Vec<Vec<u8>> = Vec::new();
    let (mut below, mut next) = (0u64, 1u64);
    for (i, &(k, w)) in keys.iter().enumerate() {
        // the next quantile falls within this entry: split before or after
        // it, whichever is nearer
        while next < parts as u64 && below + w > total * next / parts as u64 {
            let q = total * next / parts as u64;
            let at = if q - below <= below + w - q { Some(k) } else { keys.get(i + 1).map(|&(k, _)| k) };
            if let Some(at) = at.filter(|_| q > 0) {
                if Some(at) != keys.first().map(|&(k, _)| k) && pivots.last().is_none_or(|p| &p[..] != at) {
                    pivots.push(at.to_vec());
                }
            }
            next += 1;
        }
        below += w;
    }
    pivots
}

/// [`merge`] of the keys in `[lo, hi)` only (`None`: unbounded): each run is
/// read from the last position its sparse index has at or before `lo`, and
/// the merge stops at the first key at or past `hi`. Merges of disjoint ranges
/// may run side by side, on the same runs.
pub fn merge_range<E: From<io::Error>>(
    runs: &[Run],
    buffer: usize,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    mut f: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>,
) -> Result<(), E> {
    let lcp = common_prefix_len(runs);
    let mut heap = Heap { cursors: Vec::with_capacity(runs.len()), order: Vec::new(), lcp };
    for (i, r) in runs.iter().enumerate() {
        let (file, at) = lo.map_or((0, 0), |lo| {
            let n = r.index.partition_point(|(k, _, _)| &k[..] <= lo);
            n.checked_sub(1).map_or((0, 0), |j| (r.index[j].1, r.index[j].2))
        });
        let mut c = Cursor::open(&r.files, buffer, file, at)?;
        let mut more = c.advance(lcp)?;
        while more && lo.is_some_and(|lo| &c.key[..] < lo) {
            more = c.advance(lcp)?;
        }
        if more {
            heap.order.push(i);
        }
        heap.cursors.push(c);
    }
    for i in (0..heap.order.len() / 2).rev() {
        heap.sift_down(i);
    }
    let mut emitted: Vec<u8> = Vec::new();
    while let Some(&top) = heap.order.first() {
        let c = &heap.cursors[top];
        if hi.is_some_and(|hi| &c.key[..] >= hi) {
            break; // the smallest key left is past the range
        }
        f(&c.key, c.value())?;
        emitted.clear();
        emitted.extend_from_slice(&c.key);
        heap.advance_top()?;
        // older runs holding the same key: their entries are overwritten
        while heap.order.first().is_some_and(|&t| heap.cursors[t].key == emitted) {
            heap.advance_top()?;
        }
    }
    Ok(())
}

/// Merge runs into new runs in `dir` until at most `fan_in` are left; returns
/// the remaining runs, oldest first. Merged inputs are deleted as soon as
/// they are merged.
///
/// A pass merges only as many runs as it must: groups of consecutive runs
/// (so the newest run of a key still wins), oldest first, each of at most
/// `fan_in`, until the excess over `fan_in` is gone; the newer runs are left
/// as they are. 167 runs with a fan-in of 64 (100M unique keys in a 256 MiB
/// budget: 600k records of 128 bytes fill a collector's arena, with a
/// smaller open-file limit) have 105 of them merged (in groups of 64 and 41)
/// rather than all 167 rewritten, and more than `fan_in` squared take
/// further passes. At the default fan-in (256) the 167 need no pass.
pub fn reduce(mut runs: Vec<Run>, fan_in: usize, buffer: usize, dir: &Path, seq: &mut usize) -> io::Result<Vec<Run>> {
    let fan_in = fan_in.max(2);
    while runs.len() > fan_in {
        let mut excess = runs.len() - fan_in;
        let mut next = Vec::with_capacity(fan_in + 1);
        let mut rest = runs.as_slice();
        while excess > 0 && rest.len() >= 2 {
            let group = (excess + 1).min(fan_in).min(rest.len());
            *seq += 1;
            let mut w = RunWriter::create(&dir.join(format!("run-{:06}", *seq)), buffer)?;
            merge::<io::Error>(&rest[..group], buffer, |k, v| w.add(k, v))?;
            next.push(w.finish()?);
            for f in rest[..group].iter().flat_map(|r| &r.files) {
                std::fs::remove_file(f)?;
            }
            excess -= group - 1;
            rest = &rest[group..];
        }
        next.extend_from_slice(rest);
        runs = next;
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn run_of(dir: &Path, name: &str, entries: &[(&str, Option<&str>)]) -> Run {
        let mut w = RunWriter::create(&dir.join(name), 4096).unwrap();
        for (k, v) in entries {
            w.add(k.as_bytes(), v.map(str::as_bytes)).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn a_reduction_merges_only_the_oldest_runs_it_must() {
        let dir = tempfile::tempdir().unwrap();
        // five runs, a fan-in of 4: merging the two oldest is enough
        let runs: Vec<Run> = (0..5)
            .map(|r| run_of(dir.path(), &format!("in-{r}"), &[("a", Some(&*format!("v{r}"))), ("z", None)]))
            .collect();
        let newest: Vec<Vec<PathBuf>> = runs[2..].iter().map(|r| r.files.clone()).collect();
        let mut seq = 0;
        let out = reduce(runs, 4, 1024, dir.path(), &mut seq).unwrap();
        assert_eq!(seq, 1, "one merge");
        assert_eq!(
            out.iter().skip(1).map(|r| r.files.clone()).collect::<Vec<_>>(),
            newest,
            "the newest runs untouched"
        );
        let mut got = Vec::new();
        merge::<io::Error>(&out, 1024, |k, v| {
            got.push((k.to_vec(), v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![(b"a".to_vec(), Some(b"v4".to_vec())), (b"z".to_vec(), None)], "the newest run wins");
    }

    #[test]
    fn one_pass_merges_groups_of_fan_in_until_the_excess_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        // 12 runs, a fan-in of 4: an excess of 8 goes in groups of 4, 4 and 3; the newest run stays
        let runs: Vec<Run> =
            (0..12).map(|r| run_of(dir.path(), &format!("in-{r}"), &[("k", Some(&*format!("v{r}")))])).collect();
        let newest = runs[11].files.clone();
        let mut seq = 0;
        let out = reduce(runs, 4, 1024, dir.path(), &mut seq).unwrap();
        assert_eq!((out.len(), seq), (4, 3), "one pass of three merges");
        assert_eq!(out[3].files, newest);
        let mut got = Vec::new();
        merge::<io::Error>(&out, 1024, |k, v| {
            got.push((k.to_vec(), v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![(b"k".to_vec(), Some(b"v11".to_vec()))]);
    }

    #[test]
    fn merges_of_the_ranges_between_pivots_make_the_whole_merge() {
        // runs of ~4.6 MiB (~18 index entries each), keys in several runs
        let dir = tempfile::tempdir().unwrap();
        let runs: Vec<Run> = (0..5u32)
            .map(|r| {
                let mut w = RunWriter::create(&dir.path().join(format!("in-{r}")), 4096).unwrap();
                for i in (r..120_000).step_by(3) {
                    let v = if i % 7 == 0 { None } else { Some(vec![r as u8; 100]) };
                    w.add(format!("key-{i:08}").as_bytes(), v.as_deref()).unwrap();
                }
                w.finish().unwrap()
            })
            .collect();
        let collect = |lo: Option<&[u8]>, hi: Option<&[u8]>| {
            let mut out = Vec::new();
            merge_range::<io::Error>(&runs, 4096, lo, hi, |k, v| {
                out.push((k.to_vec(), v.map(<[u8]>::to_vec)));
                Ok(())
            })
            .unwrap();
            out
        };
        let whole = collect(None, None);
        for parts in [2, 3, 7] {
            let pivots = pivots(&runs, parts);
            assert_eq!(pivots.len(), parts - 1, "{parts} parts");
            let mut joined = Vec::new();
            let mut sizes = Vec::new();
            for i in 0..=pivots.len() {
                let lo = i.checked_sub(1).map(|j| &pivots[j][..]);
                let part = collect(lo, pivots.get(i).map(|p| &p[..]));
                sizes.push(part.len());
                joined.extend(part);
            }
            assert_eq!(joined, whole, "{parts} parts");
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            if parts <= 3 {
                // ~18 index entries a run: as fine as the split gets
                assert!(*max < 2 * min, "{parts} parts of about equal size: {sizes:?}");
            }
        }
        // a range between two pivots that holds no key at all
        assert!(collect(Some(b"key-00000001x"), Some(b"key-00000002")).is_empty());
        // too small to split: no pivots
        let tiny = [run_of(dir.path(), "tiny", &[("a", Some("1")), ("b", None)])];
        assert!(pivots(&tiny, 4).is_empty());
    }

    #[test]
    fn a_run_of_several_files_reads_as_one() {
        // a spill split in three ranges, the middle one empty, over an older
        // single-file run: merges whole and by range see one run
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, keys: std::ops::Range<u32>, tag: &str| {
            let mut w = RunWriter::create(&dir.path().join(name), 4096).unwrap();
            for i in keys {
                w.add(format!("k{i:06}").as_bytes(), Some(format!("{tag}{i}").repeat(20).as_bytes())).unwrap();
            }
            w.finish().unwrap()
        };
        let old = write("old", 0..30_000, "o");
        let split =
            Run::join(vec![write("p0", 0..12_000, "n"), write("p1", 0..0, "n"), write("p2", 12_000..20_000, "n")]);
        assert_eq!(split.files.len(), 3);
        let runs = [old, split];
        let collect = |lo: Option<&[u8]>, hi: Option<&[u8]>| {
            let mut out = Vec::new();
            merge_range::<io::Error>(&runs, 4096, lo, hi, |k, v| {
                out.push((String::from_utf8(k.to_vec()).unwrap(), v.unwrap()[0]));
                Ok(())
            })
            .unwrap();
            out
        };
        let want: Vec<(String, u8)> =
            (0..30_000).map(|i| (format!("k{i:06}"), if i < 20_000 { b'n' } else { b'o' })).collect();
        assert_eq!(collect(None, None), want);
        assert_eq!(collect(Some(b"k015000"), Some(b"k025000")), want[15_000..25_000]);
        let pivots = pivots(&runs, 2);
        assert_eq!(pivots.len(), 1);
        let mut joined = collect(None, Some(&pivots[0]));
        joined.extend(collect(Some(&pivots[0]), None));
        assert_eq!(joined, want);
    }

    #[test]
    fn newest_run_wins_and_reduce_keeps_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let mut model: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut runs = Vec::new();
        for r in 0..23u32 {
            let mut m = BTreeMap::new();
            for i in 0..200u32 {
                let k = format!("k{:04}", (i * 31 + r * 17) % 500).into_bytes();
                let v = if (i + r) % 9 == 0 { None } else { Some(format!("{r}-{i}").into_bytes()) };
                m.insert(k, v);
            }
            let mut w = RunWriter::create(&dir.path().join(format!("in-{r}")), 4096).unwrap();
            for (k, v) in &m {
                w.add(k, v.as_deref()).unwrap();
            }
            runs.push(w.finish().unwrap());
            model.extend(m);
        }
        let mut seq = 0;
        let runs = reduce(runs, 4, 1024, dir.path(), &mut seq).unwrap();
        assert!(runs.len() <= 4);
        // 23 -> 6 (five groups of 4 and the last 3 merged) -> 4 (only the oldest 3 merged): 7 merges
        assert_eq!((runs.len(), seq), (4, 7));
        let mut out = Vec::new();
        merge::<io::Error>(&runs, 1024, |k, v| {
            out.push((k.to_vec(), v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        assert_eq!(out, model.into_iter().collect::<Vec<_>>());
    }
}
