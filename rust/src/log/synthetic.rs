//! Synthetic changelogs for the benchmarks at the sizes users have (10^8
//! records): written by the codec straight into a partition of the segment
//! log, at the speed of encoding, so a benchmark spends its time restoring
//! rather than producing.
//!
//! A changelog is `records` records of `value_size`-byte values over `keys`
//! keys (`key-%012d`, the benchmarks' key format). The keys are visited in
//! passes; each pass visits every key once in an order of its own (a
//! seeded permutation, [`Shuffle`]), so with `keys < records` each key is
//! updated `records / keys` times, spread over the log, and with `keys ==
//! records` every key is unique. The permutation is computed, not stored:
//! 10^8 keys need no shuffled array of 800 MB. Values come from a pool of
//! 997 seeded random values, as `tests/support/restore_data.py` makes them.
//! Records are plain (no producer id, no transaction): read_committed
//! readers take them as committed.

use std::path::Path;

use super::writer::{PartitionWriter, WriterConfig};
use super::LogError;
use crate::codec::BatchMeta;

/// Distinct values the records take turns with.
const VALUE_POOL: usize = 997;
/// The timestamp of offset 0; each record is one millisecond after the one before.
const BASE_TIMESTAMP_MS: i64 = 1_700_000_000_000;
/// Bytes of a key: `key-` and 12 digits.
pub const KEY_BYTES: usize = 16;

/// What a synthetic changelog holds.
#[derive(Debug, Clone, Copy)]
pub struct Synthetic {
    pub records: u64,
    pub keys: u64,
    pub value_size: usize,
    pub seed: u64,
}

/// splitmix64's finaliser: a 64-bit mixing function.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded permutation of `[0, n)`: a four-round Feistel network over the
/// smallest even number of bits that covers `n`, walked until it lands
/// below `n` (at most four steps on average).
#[derive(Debug, Clone, Copy)]
pub struct Shuffle {
    n: u64,
    half_bits: u32,
    rounds: [u64; 4],
}

impl Shuffle {
    pub fn new(n: u64, seed: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut s = seed;
        let mut rounds = [0; 4];
        for r in &mut rounds {
            s = mix(s);
            *r = s;
        }
        Shuffle { n, half_bits, rounds }
    }

    fn step(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for k in self.rounds {
            (l, r) = (r, l ^ (mix(r ^ k) & mask));
        }
        (l << self.half_bits) | r
    }

    /// The `i`-th element of the permutation (`i < n`).
    pub fn at(&self, i: u64) -> u64 {
        let mut x = self.step(i);
        while x >= self.n {
            x = self.step(x);
        }
        x
    }
}

/// `key-%012d` of `k` into `out`.
pub fn key_of(k: u64, out: &mut [u8; KEY_BYTES]) {
    out[..4].copy_from_slice(b"key-");
    let mut v = k;
    for d in out[4..].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// The pool of values records take turns with (`value_size` bytes each).
pub fn value_pool(value_size: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut s = mix(seed ^ 0x5eed);
    (0..VALUE_POOL)
        .map(|_| {
            (0..value_size)
                .map(|_| {
                    s = mix(s);
                    s as u8
                })
                .collect()
        })
        .collect()
}

impl Synthetic {
    /// Why this changelog cannot be written, if it cannot.
    pub fn invalid(&self) -> Option<&'static str> {
        (self.keys == 0 && self.records > 0).then_some("a synthetic changelog with records needs at least one key")
    }
}

/// The timestamp of the `i`-th record.
pub fn timestamp_of(i: u64) -> i64 {
    BASE_TIMESTAMP_MS + i as i64
}

/// Call `f(i, key, value)` for each record `spec` describes, in log order
/// (`i` counts from 0): the one sequence the segment log writer and the
/// Kafka producer ([`crate::kafka::produce`]) both write. Stops at `f`'s
/// first error. Returns the records visited.
pub fn for_each_record<E>(spec: &Synthetic, mut f: impl FnMut(u64, &[u8], &[u8]) -> Result<(), E>) -> Result<u64, E> {
    let values = value_pool(spec.value_size, spec.seed);
    let mut key = [0u8; KEY_BYTES];
    let mut sent = 0u64;
    let mut pass = 0u64;
    while sent < spec.records && spec.keys > 0 {
        let order = Shuffle::new(spec.keys, spec.seed.wrapping_mul(1_000_003).wrapping_add(pass));
        let n = spec.keys.min(spec.records - sent);
        for j in 0..n {
            key_of(order.at(j), &mut key);
            let i = sent + j;
            f(i, &key, &values[(i % VALUE_POOL as u64) as usize])?;
        }
        sent += n;
        pass += 1;
    }
    Ok(sent)
}

/// Append the changelog `spec` describes to the partition directory `dir`
/// (created if missing; an existing log is appended to), without fsync: the
/// caller syncs once if it must. Returns the records written.
pub fn write_partition(dir: &Path, spec: &Synthetic) -> Result<u64, LogError> {
    if let Some(why) = spec.invalid() {
        return Err(LogError::other(why));
    }
    let mut w = PartitionWriter::open(dir, WriterConfig { sync: false, ..WriterConfig::default() })?;
    let meta = BatchMeta::default();
    let sent =
        for_each_record(spec, |i, key, value| w.send(meta, timestamp_of(i), Some(key), Some(value), &[]).map(|_| ()))?;
    w.flush(false)?;
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::log::SegmentLogDir;
    use crate::source::{Changelog, RecordChunk};

    #[test]
    fn shuffle_is_a_permutation_for_every_size() {
        for n in [1u64, 2, 3, 5, 16, 17, 1000, 4097] {
            let s = Shuffle::new(n, 7);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let x = s.at(i) as usize;
                assert!(!seen[x], "n={n}: {x} twice");
                seen[x] = true;
            }
        }
        let (a, b) = (Shuffle::new(1000, 1), Shuffle::new(1000, 2));
        assert!((0..1000).any(|i| a.at(i) != b.at(i)), "another seed, another order");
        assert!((0..1000).filter(|&i| a.at(i) == i).count() < 50, "an order, not the identity");
    }

    #[test]
    fn keys_are_the_benchmarks_format() {
        let mut k = [0u8; KEY_BYTES];
        key_of(42, &mut k);
        assert_eq!(&k, b"key-000000000042");
    }

    #[test]
    fn every_key_is_updated_records_over_keys_times() {
        let dir = tempfile::tempdir().unwrap();
        let spec = Synthetic { records: 1050, keys: 100, value_size: 100, seed: 3 };
        assert_eq!(write_partition(&dir.path().join("t-0"), &spec).unwrap(), 1050);
        let log = SegmentLogDir(dir.path().to_path_buf());
        let b = log.bounds("t", 0).unwrap();
        assert_eq!((b.start, b.end, b.last_stable), (0, 1050, 1050));
        let mut src = log.open("t", 0, 0).unwrap();
        let mut chunk = RecordChunk::default();
        while src.next_chunk(1050, 1 << 20, &mut |r| chunk.push(r)).unwrap() {}
        let mut counts: HashMap<Vec<u8>, usize> = HashMap::new();
        for r in chunk.iter() {
            assert_eq!(r.value.unwrap().len(), 100);
            *counts.entry(r.key.unwrap().to_vec()).or_default() += 1;
        }
        assert_eq!(counts.len(), 100);
        // ten full passes, then the first 50 keys of an eleventh
        let mut per_key: Vec<usize> = counts.values().copied().collect();
        per_key.sort();
        assert_eq!((per_key[0], per_key[49], per_key[50], per_key[99]), (10, 10, 11, 11));
    }
}
