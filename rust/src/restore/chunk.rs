//! One chunk of changelog read into memory as operations (key, value or
//! tombstone), as both restore modes read the log: replay turns it into one
//! `WriteBatch` ([`ChunkOps::to_batch`]), bulk adds its operations to its
//! collector.

use rocksdb::WriteBatch;

use super::bulk::collect::{prefetch_read, prefetch_span, sort_by_key, Collector};
use super::bulk::pool::reserve_advised;
use crate::source::{ChangeRecord, ChangelogSource, LogError};
use crate::store::{Store, StoreFormat};

/// The operations of one chunk, turned into a `WriteBatch` in key order with
/// only the last operation per key: the batch is applied atomically, so the
/// result is the same as applying every operation in log order, and a
/// memtable takes sorted keys much faster than random ones.
#[derive(Default)]
pub struct ChunkOps {
    data: Vec<u8>,
    /// `(key offset, key length, value length or u32::MAX for a tombstone)`;
    /// the value follows its key in `data`.
    ops: Vec<(usize, u32, u32)>,
    /// Open-addressing index of the chunk's keys (kept between chunks): per
    /// slot, 1 + the index of the key's last operation; 0 is empty.
    slots: Vec<u32>,
    /// Index of the last operation of each key.
    last: Vec<u32>,
    /// Those indices in key order, each with the 8 bytes of its key that
    /// follow the prefix every key of the chunk shares (compared first).
    order: Vec<(u64, u32)>,
    /// Offset of the last committed data record read into the chunk.
    last_offset: Option<i64>,
    /// Records read into the chunk without a key (skipped).
    null_keys: u64,
    /// The record timestamp of each operation, kept for a versioned store
    /// only (its put logic needs every record with its timestamp).
    timestamps: Vec<i64>,
    /// Records pushed (an emit-final session store's record is two operations).
    records: usize,
    /// Old index to new of the operations `keep_last_per_key` keeps.
    renumber: Vec<u32>,
    /// The operations `last` was found for ([`ChunkOps::index_last_per_key`]),
    /// the first this many, which `slots` also holds (each slot the last of
    /// its key among them): still true of them while more are pushed. `None`
    /// after `clear`, which leaves the table to be emptied.
    last_of: Option<usize>,
}

/// Bytes of an operation's place in a chunk (`ChunkOps::ops`).
const OP_BYTES: usize = std::mem::size_of::<(usize, u32, u32)>();

/// Bytes of an operation's key and value in a chunk (a tombstone's value
/// length is `u32::MAX`).
fn op_len(key_len: u32, value_len: u32) -> usize {
    key_len as usize + if value_len == u32::MAX { 0 } else { value_len as usize }
}

impl ChunkOps {
    pub fn clear(&mut self) {
        self.data.clear();
        self.ops.clear();
        self.timestamps.clear();
        self.last_offset = None;
        self.null_keys = 0;
        self.records = 0;
        self.last_of = None;
    }

    /// Add the records of one read of `source` (about `max_bytes` of log
    /// below `end`) as a store of `format` keeps them; whether more follows.
    pub fn read(
        &mut self,
        source: &mut dyn ChangelogSource,
        end: i64,
        max_bytes: usize,
        format: StoreFormat,
    ) -> Result<bool, LogError> {
        // A chunk's operations are read back by key order, and its keys
        // hashed: at random, so a large chunk is kept on huge pages.
        reserve_advised(&mut self.data, max_bytes);
        source.next_chunk(end, max_bytes, &mut |r| {
            self.last_offset = Some(r.offset);
            match r.key {
                None => self.null_keys += 1,
                Some(k) => self.push_record(format, k, &r),
            }
        })
    }

    /// Offset of the last committed data record read since [`ChunkOps::clear`].
    pub fn last_offset(&self) -> Option<i64> {
        self.last_offset
    }

    /// Records without a key read since [`ChunkOps::clear`] (they are skipped).
    pub fn null_keys(&self) -> u64 {
        self.null_keys
    }

    /// Operations pushed (not deduplicated).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Records pushed (each one operation, or two with an index row).
    pub fn records(&self) -> usize {
        self.records
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes the chunk's operations hold (keys, values and their places),
    /// those of operations a later one overrides included until
    /// [`ChunkOps::keep_last_per_key`]: about its log bytes when no key
    /// repeats.
    pub fn held_bytes(&self) -> usize {
        self.data.len() + self.ops.len() * OP_BYTES
    }

    /// Find the last operation of each key (by hashing), unless no
    /// operation was pushed since they were found.
    pub fn index_last_per_key(&mut self) {
        if self.last_of != Some(self.ops.len()) {
            self.find_last_per_key();
            self.last_of = Some(self.ops.len());
        }
    }

    /// Bytes the last operations per key would hold alone (after
    /// [`ChunkOps::index_last_per_key`]).
    pub fn kept_bytes(&self) -> usize {
        self.last.iter().map(|&i| self.span(i as usize).len() + OP_BYTES).sum()
    }

    /// Drop every operation a later one of the same key overrides, with its
    /// bytes, keeping the others in log order: the batch is the same, and a
    /// chunk of repeated keys can then gather more of the log in the same
    /// memory (replay's `gather`). Not for a versioned store, whose every
    /// record counts.
    pub fn keep_last_per_key(&mut self) {
        debug_assert!(self.timestamps.is_empty(), "a versioned store's chunk keeps every record");
        self.index_last_per_key();
        if self.last.len() == self.ops.len() {
            return;
        }
        let Self { data, ops, last, slots, renumber, .. } = &mut *self;
        renumber.clear();
        renumber.resize(ops.len(), 0);
        let mut to = 0;
        // `last` ascends, so each kept operation moves down (or stays), never over one still to move.
        for (n, &i) in last.iter().enumerate() {
            let (at, kl, vl) = ops[i as usize];
            let len = op_len(kl, vl);
            if at != to {
                data.copy_within(at..at + len, to);
            }
            ops[n] = (to, kl, vl);
            renumber[i as usize] = n as u32;
            to += len;
        }
        data.truncate(to);
        ops.truncate(last.len());
        // Every operation the table holds is a kept one: it holds them under their new numbers.
        for e in slots.iter_mut().filter(|e| **e != 0) {
            *e = renumber[(*e - 1) as usize] + 1;
        }
        last.clear();
        last.extend(0..ops.len() as u32);
        let kept = ops.len();
        self.last_of = Some(kept);
    }

    /// Where the `i`-th operation's key and value lie in the chunk's bytes.
    fn span(&self, i: usize) -> std::ops::Range<usize> {
        let (at, kl, vl) = self.ops[i];
        at..at + op_len(kl, vl)
    }

    /// The `i`-th operation pushed, in log order.
    pub fn get(&self, i: usize) -> (&[u8], Option<&[u8]>) {
        let (at, kl, vl) = self.ops[i];
        let v0 = at + kl as usize;
        (&self.data[at..v0], (vl != u32::MAX).then(|| &self.data[v0..v0 + vl as usize]))
    }

    /// Push one changelog record as a store of `format` keeps it (a
    /// timestamped store's value holds the record's timestamp, a
    /// header-aware one its headers: [`StoreFormat::encode_value`]; an
    /// emit-final window store's key is time first: [`StoreFormat::encode_key`]).
    pub fn push_record(&mut self, format: StoreFormat, key: &[u8], r: &ChangeRecord<'_>) {
        if format == StoreFormat::Versioned {
            return self.push_versioned(key, r.value, r.timestamp);
        }
        if format.stores_value_as_is() && !format.rewrites_key() {
            return self.push(key, r.value);
        }
        self.records += 1;
        if format.has_index() {
            let at = self.data.len();
            format.key_schema().expect("an index is a segmented store's").index_key(key, &mut self.data);
            let vlen = if r.value.is_some() { 0 } else { u32::MAX };
            self.ops.push((at, (self.data.len() - at) as u32, vlen));
        }
        let at = self.data.len();
        format.encode_key(key, &mut self.data);
        let klen = self.data.len() - at;
        let vlen = match r.value {
            Some(v) => {
                format.encode_value(r.timestamp, r.headers, v, &mut self.data);
                (self.data.len() - at - klen) as u32
            }
            None => u32::MAX,
        };
        self.ops.push((at, klen as u32, vlen));
    }

    /// Push a record of a versioned store: the value as logged, with its timestamp.
    pub fn push_versioned(&mut self, key: &[u8], value: Option<&[u8]>, timestamp: i64) {
        self.push(key, value);
        self.timestamps.push(timestamp);
    }

    /// The timestamp of the `i`-th operation pushed by [`ChunkOps::push_versioned`].
    pub fn timestamp(&self, i: usize) -> i64 {
        self.timestamps[i]
    }

    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.records += 1;
        let at = self.data.len();
        self.data.extend_from_slice(key);
        let vlen = match value {
            Some(v) => {
                self.data.extend_from_slice(v);
                v.len() as u32
            }
            None => u32::MAX,
        };
        self.ops.push((at, key.len() as u32, vlen));
    }

    /// Keep the last operation of each key (found by hashing: a chunk
    /// holds many operations per key when keys repeat, and sorting them all
    /// cost more than the writes) and sort those by key (as the bulk
    /// collector does, [`sort_by_key`]: a large chunk of unique keys sorts
    /// nearly as fast per key as a small one); [`ChunkOps::sorted`] then
    /// hands them out.
    pub fn sort_last(&mut self) {
        self.index_last_per_key();
        let Self { data, ops, last, order, .. } = &mut *self;
        sort_by_key(
            order,
            || last.iter().copied(),
            |i| {
                let (at, kl, _) = ops[i as usize];
                &data[at..at + kl as usize]
            },
        );
    }

    /// The operations [`ChunkOps::sort_last`] kept, in key order.
    ///
    /// Key order visits the chunk at random, and a chunk is far larger than
    /// the CPU's caches: each operation's entry and bytes are prefetched
    /// some steps ahead, so the misses overlap instead of stalling one by one
    /// (a fifth of a replay's time went to copying records into the batch).
    pub fn sorted(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> + '_ {
        const AHEAD: usize = 16;
        let order = &self.order;
        order.iter().enumerate().map(move |(n, &(_, i))| {
            if let Some(&(_, j)) = order.get(n + 2 * AHEAD) {
                prefetch_read(&self.ops[j as usize]);
            }
            if let Some(&(_, j)) = order.get(n + AHEAD) {
                let bytes = self.data[self.span(j as usize)].as_ptr_range();
                prefetch_read(bytes.start);
                prefetch_span(bytes);
            }
            self.get(i as usize)
        })
    }

    /// The batch of the chunk's last operation per key, in key order, for
    /// `store`'s data column family.
    pub fn to_batch(&mut self, store: &Store) -> WriteBatch {
        let cf = store.data_cf();
        self.sort_last();
        // Sized up front: grown by doubling, a batch of tens of MiB is copied
        // about twice over and its fresh pages faulted in again each time
        // (a fifth of a replay's CPU, measured).
        let mut batch = WriteBatch::with_capacity_bytes(self.batch_bytes());
        for op in self.sorted() {
            match op {
                (k, Some(v)) => batch.put_cf(cf, k, v),
                (k, None) => batch.delete_cf(cf, k),
            }
        }
        batch
    }

    /// The bytes a `WriteBatch` of the operations [`ChunkOps::sort_last`]
    /// kept takes, with room for a few more small entries (the offset): each
    /// entry is a tag, a column family id and two length varints besides its
    /// key and value.
    fn batch_bytes(&self) -> usize {
        const BATCH_HEADER: usize = 12;
        const ENTRY_OVERHEAD: usize = 1 + 5 + 5 + 5;
        let entries: usize = self.order.iter().map(|&(_, i)| self.span(i as usize).len() + ENTRY_OVERHEAD).sum();
        BATCH_HEADER + entries + 256
    }

    /// Fill `last` with the index of the last operation of each key (in no order).
    fn find_last_per_key(&mut self) {
        let hashed = self.last_of.unwrap_or(0);
        let Self { data, ops, slots, last, .. } = self;
        let key = |i: u32| {
            let (at, kl, _) = ops[i as usize];
            &data[at..at + kl as usize]
        };
        // Operations already in `slots` (left there by the last pass, renumbered
        // by `keep_last_per_key`) are not hashed again while the table has room.
        let size = (ops.len() * 2).next_power_of_two().max(16);
        let from = if slots.len() >= size { hashed } else { 0 };
        if from == 0 {
            slots.clear();
            reserve_advised(slots, size);
            slots.resize(size, 0);
        }
        let mask = slots.len() - 1;
        // The slots are probed at random: each operation's slot is
        // prefetched 2 x AHEAD operations before its turn, and the entry of
        // the operation found there AHEAD before, so the cache misses overlap.
        const AHEAD: usize = 8;
        const RING: usize = 4 * AHEAD;
        let n = ops.len();
        let home = |i: usize| Collector::hash(key(i as u32)) as usize & mask;
        let mut ring = [0usize; RING];
        for j in from..n.min(from + 2 * AHEAD) {
            ring[j % RING] = home(j);
            prefetch_read(&slots[ring[j % RING]]);
        }
        for i in from..n {
            if i + 2 * AHEAD < n {
                let h = home(i + 2 * AHEAD);
                ring[(i + 2 * AHEAD) % RING] = h;
                prefetch_read(&slots[h]);
            }
            if i + AHEAD < n {
                if let Some(e) = slots[ring[(i + AHEAD) % RING]].checked_sub(1) {
                    prefetch_read(&ops[e as usize]);
                }
            }
            let (k, i) = (key(i as u32), i as u32);
            let mut at = ring[i as usize % RING];
            loop {
                match slots[at] {
                    0 => break,
                    e if key(e - 1) == k => break,
                    _ => at = (at + 1) & mask,
                }
            }
            slots[at] = i + 1; // a later operation of the same key wins
        }
        // In log order, not slot order: sorting reads every kept key twice,
        // and in log order those reads run through the chunk front to back.
        let mut kept = vec![0u64; ops.len().div_ceil(64)];
        for &e in slots.iter().filter(|&&e| e != 0) {
            let i = (e - 1) as usize;
            kept[i / 64] |= 1 << (i % 64);
        }
        last.clear();
        for (w, &bits) in kept.iter().enumerate() {
            let mut b = bits;
            while b != 0 {
                last.push((w * 64) as u32 + b.trailing_zeros());
                b &= b - 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::restore_options;
    use crate::restore::testing::dump;

    #[test]
    fn chunk_ops_sort_keys_bytewise_whatever_their_shared_prefix_and_lengths() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(&dir.path().join("s"), restore_options()).unwrap();
        let shapes: [&[u8]; 12] = [
            b"ns:",
            b"ns:a",
            b"ns:a\0",
            b"ns:a\0\0",
            b"ns:ab",
            b"ns:abcdefgh",
            b"ns:abcdefghi",
            b"ns:abcdefgh\xff",
            b"ns:abcdefghij",
            b"ns:b",
            b"ns:\xff",
            b"ns:\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        ];
        let mut ops = ChunkOps::default();
        for (n, i) in [7usize, 3, 11, 0, 5, 9, 1, 3, 10, 2, 8, 4, 6, 0].into_iter().enumerate() {
            ops.push(shapes[i], Some(format!("{n}").as_bytes()));
        }
        let _ = ops.to_batch(&store);
        let got: Vec<&[u8]> = ops.order.iter().map(|&(_, i)| ops.get(i as usize).0).collect();
        let mut want = shapes.to_vec();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn chunk_ops_keep_the_last_operation_per_key_in_log_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with(&dir.path().join("s"), restore_options()).unwrap();
        let mut ops = ChunkOps::default();
        ops.push(b"b", Some(b"1"));
        ops.push(b"a", Some(b"1"));
        ops.push(b"b", None);
        ops.push(b"c", None);
        ops.push(b"c", Some(b"3"));
        ops.push(b"a", Some(b"2"));
        ops.push(b"d", Some(b"4"));
        ops.push(b"d", Some(b"5"));
        assert_eq!(ops.len(), 8);
        store.write(ops.to_batch(&store), false).unwrap();
        let got: Vec<(Vec<u8>, Vec<u8>)> = dump(&store).into_iter().collect();
        assert_eq!(
            got,
            vec![(b"a".to_vec(), b"2".to_vec()), (b"c".to_vec(), b"3".to_vec()), (b"d".to_vec(), b"5".to_vec())]
        );
    }

    #[test]
    fn keeping_the_last_operation_per_key_at_any_points_gives_the_batch_of_none() {
        // The hash table is carried from one pass to the next (renumbered when
        // operations are dropped, rebuilt when it is too small): at random
        // points, the store is the one written without any.
        let log = crate::restore::testing::random_log(20_000, 700, 5);
        let ops_of = |every: usize| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_with(&dir.path().join("s"), restore_options()).unwrap();
            let mut ops = ChunkOps::default();
            let mut x = every as u64 * 7919 + 1;
            for e in &log {
                if let crate::restore::testing::Entry::Data { key: Some(k), value } = e {
                    ops.push(k, value.as_deref());
                }
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                if every > 0 && (x >> 33) as usize % every == 0 {
                    if (x >> 20) % 3 == 0 {
                        ops.index_last_per_key();
                        assert!(ops.kept_bytes() <= ops.held_bytes());
                    } else {
                        ops.keep_last_per_key();
                        assert_eq!(ops.kept_bytes(), ops.held_bytes(), "nothing dropped is held");
                    }
                }
            }
            store.write(ops.to_batch(&store), false).unwrap();
            dump(&store)
        };
        let whole = ops_of(0);
        assert!(whole.len() > 600);
        for every in [1, 7, 100, 3000] {
            assert_eq!(ops_of(every), whole, "every ~{every} operations");
        }
    }

    #[test]
    fn keeping_the_last_operation_per_key_midway_drops_overridden_bytes_and_keeps_the_batch() {
        let ops_of = |keep_at: &[usize]| {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open_with(&dir.path().join("s"), restore_options()).unwrap();
            let mut ops = ChunkOps::default();
            let log: [(&[u8], Option<&[u8]>); 9] = [
                (b"b", Some(b"1")),
                (b"a", Some(b"11")),
                (b"b", None),
                (b"c", None),
                (b"c", Some(b"333")),
                (b"a", Some(b"2")),
                (b"d", Some(b"4")),
                (b"b", Some(b"5")),
                (b"d", Some(b"66")),
            ];
            let mut seen = vec![];
            for (n, (k, v)) in log.into_iter().enumerate() {
                ops.push(k, v);
                if keep_at.contains(&n) {
                    ops.keep_last_per_key();
                    seen.push((
                        ops.len(),
                        ops.data.len(),
                        (0..ops.len()).map(|i| ops.get(i).0.to_vec()).collect::<Vec<_>>(),
                    ));
                }
            }
            store.write(ops.to_batch(&store), false).unwrap();
            (dump(&store), seen, ops.records())
        };
        let (whole, _, records) = ops_of(&[]);
        assert_eq!(records, 9);
        let (midway, seen, records) = ops_of(&[4, 5, 8]);
        assert_eq!(midway, whole, "the same store");
        assert_eq!(records, 9, "records pushed are counted, kept or not");
        // after "c"="333": a=11, b (tombstone), c=333, in the log order of each key's last
        // operation; then a=2 moves a last
        assert_eq!(seen[0], (3, 1 + 2 + 1 + 1 + 3, vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]));
        assert_eq!(seen[1], (3, 1 + 1 + 3 + 1 + 1, vec![b"b".to_vec(), b"c".to_vec(), b"a".to_vec()]));
        assert_eq!(seen[2].0, 4);
        assert_eq!(seen[2].2, vec![b"c".to_vec(), b"a".to_vec(), b"b".to_vec(), b"d".to_vec()]);
    }
}
