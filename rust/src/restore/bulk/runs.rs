//! Sorted runs spilled to disk and their k-way merge.
//!
//! A run file is a sequence of `key_len u32 LE, val_len u32 LE (u32::MAX for a
//! tombstone), key, value`, keys strictly increasing. Runs are numbered in the
//! order they were written; for a key present in several runs the newest run
//! wins. Intermediate merges keep tombstones (an older run may still hold the
//! key); only the final output may drop them.

use std::cmp::Ordering;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::collect::{common_prefix, prefix_of, TOMBSTONE};

/// A sorted run on disk, with the first and last key it holds (all its keys
/// share their common prefix, which lets a merge skip comparing it).
#[derive(Debug, Clone)]
pub struct Run {
    pub path: PathBuf,
    first: Vec<u8>,
    last: Vec<u8>,
}

/// Writes one sorted run.
pub struct RunWriter {
    out: BufWriter<File>,
    path: PathBuf,
    first: Option<Vec<u8>>,
    last: Vec<u8>,
}

impl RunWriter {
    pub fn create(path: &Path, buffer: usize) -> io::Result<Self> {
        Ok(Self {
            out: BufWriter::with_capacity(buffer, File::create(path)?),
            path: path.to_path_buf(),
            first: None,
            last: Vec::new(),
        })
    }

    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> io::Result<()> {
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
        Ok(Run { path: self.path, first: self.first.unwrap_or_default(), last: self.last })
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
    path: PathBuf,
    key: Vec<u8>,
    value: Vec<u8>,
    tombstone: bool,
    /// `prefix_of` the key after the runs' common prefix.
    prefix: u64,
}

impl Cursor {
    fn open(path: &Path, buffer: usize) -> io::Result<Self> {
        Ok(Self {
            input: BufReader::with_capacity(buffer, File::open(path)?),
            path: path.to_path_buf(),
            key: Vec::new(),
            value: Vec::new(),
            tombstone: false,
            prefix: 0,
        })
    }

    /// Read the next record; false at the end of the run.
    fn advance(&mut self, lcp: usize) -> io::Result<bool> {
        let mut hdr = [0u8; 8];
        match self.input.read_exact(&mut hdr[..1]) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
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
                format!("spilled run {} holds a key outside its recorded range", self.path.display()),
            ));
        }
        self.prefix = prefix_of(&self.key[lcp..]);
        Ok(true)
    }

    fn value(&self) -> Option<&[u8]> {
        (!self.tombstone).then_some(&self.value[..])
    }

    fn truncated(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("spilled run {} is truncated: {e}", self.path.display()))
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
    mut f: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>,
) -> Result<(), E> {
    let lcp = common_prefix_len(runs);
    let mut heap = Heap { cursors: Vec::with_capacity(runs.len()), order: Vec::new(), lcp };
    for (i, r) in runs.iter().enumerate() {
        let mut c = Cursor::open(&r.path, buffer)?;
        if c.advance(lcp)? {
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
/// budget: 600k records of 128 bytes fill a collector's arena) have 105 of
/// them merged (in groups of 64 and 41) rather than all 167 rewritten, and
/// more than `fan_in` squared take further passes.
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
            for r in &rest[..group] {
                std::fs::remove_file(&r.path)?;
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
        let newest: Vec<PathBuf> = runs[2..].iter().map(|r| r.path.clone()).collect();
        let mut seq = 0;
        let out = reduce(runs, 4, 1024, dir.path(), &mut seq).unwrap();
        assert_eq!(seq, 1, "one merge");
        assert_eq!(out.iter().skip(1).map(|r| r.path.clone()).collect::<Vec<_>>(), newest, "the newest runs untouched");
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
        let newest = runs[11].path.clone();
        let mut seq = 0;
        let out = reduce(runs, 4, 1024, dir.path(), &mut seq).unwrap();
        assert_eq!((out.len(), seq), (4, 3), "one pass of three merges");
        assert_eq!(out[3].path, newest);
        let mut got = Vec::new();
        merge::<io::Error>(&out, 1024, |k, v| {
            got.push((k.to_vec(), v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, vec![(b"k".to_vec(), Some(b"v11".to_vec()))]);
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
