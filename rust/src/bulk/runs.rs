//! Sorted runs spilled to disk and their k-way merge.
//!
//! A run file is a sequence of `key_len u32 LE, val_len u32 LE (u32::MAX for a
//! tombstone), key, value`, keys strictly increasing. Runs are numbered in the
//! order they were written; for a key present in several runs the newest run
//! wins. Intermediate merges keep tombstones (an older run may still hold the
//! key); only the final output may drop them.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const TOMBSTONE: u32 = u32::MAX;

/// Writes one sorted run.
pub struct RunWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl RunWriter {
    pub fn create(path: &Path, buffer: usize) -> io::Result<Self> {
        Ok(Self { out: BufWriter::with_capacity(buffer, File::create(path)?), path: path.to_path_buf() })
    }

    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> io::Result<()> {
        self.out.write_all(&(key.len() as u32).to_le_bytes())?;
        self.out.write_all(&value.map_or(TOMBSTONE, |v| v.len() as u32).to_le_bytes())?;
        self.out.write_all(key)?;
        if let Some(v) = value {
            self.out.write_all(v)?;
        }
        Ok(())
    }

    /// Flush and close; returns the run's path.
    pub fn finish(self) -> io::Result<PathBuf> {
        let f = self.out.into_inner().map_err(|e| e.into_error())?;
        drop(f);
        Ok(self.path)
    }
}

struct Head {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    /// Index of the run; larger is newer.
    run: usize,
}

impl PartialEq for Head {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Head {
    /// Reversed for the max-heap: smallest key first, newest run first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.key.cmp(&self.key).then(self.run.cmp(&o.run))
    }
}

struct RunReader {
    input: BufReader<File>,
    path: PathBuf,
}

impl RunReader {
    fn open(path: &Path, buffer: usize) -> io::Result<Self> {
        Ok(Self { input: BufReader::with_capacity(buffer, File::open(path)?), path: path.to_path_buf() })
    }

    fn next(&mut self, run: usize) -> io::Result<Option<Head>> {
        let mut hdr = [0u8; 8];
        match self.input.read_exact(&mut hdr[..1]) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        self.input.read_exact(&mut hdr[1..]).map_err(|e| self.truncated(e))?;
        let klen = u32::from_le_bytes(hdr[..4].try_into().expect("4")) as usize;
        let vlen = u32::from_le_bytes(hdr[4..].try_into().expect("4"));
        let mut key = vec![0u8; klen];
        self.input.read_exact(&mut key).map_err(|e| self.truncated(e))?;
        let value = if vlen == TOMBSTONE {
            None
        } else {
            let mut v = vec![0u8; vlen as usize];
            self.input.read_exact(&mut v).map_err(|e| self.truncated(e))?;
            Some(v)
        };
        Ok(Some(Head { key, value, run }))
    }

    fn truncated(&self, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("spilled run {} is truncated: {e}", self.path.display()))
    }
}

/// Merge `runs` (oldest first) into one key-ordered stream handed to `f`,
/// keeping for each key the entry of the newest run. Each reader gets a
/// buffer of `buffer` bytes.
pub fn merge<E: From<io::Error>>(
    runs: &[PathBuf],
    buffer: usize,
    mut f: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>,
) -> Result<(), E> {
    let mut readers = runs.iter().map(|p| RunReader::open(p, buffer)).collect::<io::Result<Vec<_>>>()?;
    let mut heap = BinaryHeap::with_capacity(readers.len());
    for (i, r) in readers.iter_mut().enumerate() {
        if let Some(h) = r.next(i)? {
            heap.push(h);
        }
    }
    while let Some(top) = heap.pop() {
        if let Some(h) = readers[top.run].next(top.run)? {
            heap.push(h);
        }
        while heap.peek().is_some_and(|h| h.key == top.key) {
            let older = heap.pop().expect("peeked");
            if let Some(h) = readers[older.run].next(older.run)? {
                heap.push(h);
            }
        }
        f(&top.key, top.value.as_deref())?;
    }
    Ok(())
}

/// Merge groups of `fan_in` runs into new runs in `dir` until at most
/// `fan_in` are left; returns the remaining runs, oldest first. Merged inputs
/// are deleted as soon as they are merged.
pub fn reduce(
    mut runs: Vec<PathBuf>,
    fan_in: usize,
    buffer: usize,
    dir: &Path,
    seq: &mut usize,
) -> io::Result<Vec<PathBuf>> {
    let fan_in = fan_in.max(2);
    while runs.len() > fan_in {
        let mut next = Vec::with_capacity(runs.len() / fan_in + 1);
        for group in runs.chunks(fan_in) {
            if group.len() == 1 {
                next.push(group[0].clone());
                continue;
            }
            *seq += 1;
            let mut w = RunWriter::create(&dir.join(format!("run-{:06}", *seq)), buffer)?;
            merge::<io::Error>(group, buffer, |k, v| w.add(k, v))?;
            next.push(w.finish()?);
            for p in group {
                std::fs::remove_file(p)?;
            }
        }
        runs = next;
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

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
        let mut out = Vec::new();
        merge::<io::Error>(&runs, 1024, |k, v| {
            out.push((k.to_vec(), v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        assert_eq!(out, model.into_iter().collect::<Vec<_>>());
    }
}
