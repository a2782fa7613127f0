//! The in-memory side of bulk restore: the last operation per key, kept in
//! one arena of records (header, key, value) with an open-addressing index
//! pointing straight at them, within a fixed memory share. When the share is
//! full the arena is compacted (when most of it is overwritten values) or
//! handed out sorted as a run to spill.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::pool::{keep_spare, new_arena, new_table, spares};
use crate::threads::side_by_side;

/// `val_len` of a tombstone, in the collector and in the run files it spills.
pub(super) const TOMBSTONE: u32 = u32::MAX;

/// Index slots per key (load factor 1/2), 8 bytes each.
const SLOTS_PER_KEY: usize = 2;

/// `a == b`, inlined for the short keys of changelogs (a call to `memcmp`
/// per lookup cost a tenth of a bulk restore).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        if u64::from_ne_bytes(x.try_into().expect("8")) != u64::from_ne_bytes(y.try_into().expect("8")) {
            return false;
        }
    }
    ca.remainder() == cb.remainder()
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_ne_bytes(a[i..i + 8].try_into().expect("8"))
            ^ u64::from_ne_bytes(b[i..i + 8].try_into().expect("8"));
        if x != 0 {
            return i
                + (if cfg!(target_endian = "little") { x.trailing_zeros() } else { x.leading_zeros() } / 8) as usize;
        }
        i += 8;
    }
    i + a[i..n].iter().zip(&b[i..n]).take_while(|(x, y)| x == y).count()
}

/// First 8 bytes of `key`, big-endian, zero padded: comparing two of these
/// orders keys as their bytes do, up to ties.
pub fn prefix_of(key: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    let n = key.len().min(8);
    w[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(w)
}

/// Put the keys behind `handles` in bytewise order into `order`, each with its
/// handle. Changelog keys share long prefixes (a namespace, zero padding), so
/// the sort compares the 8 bytes that follow the prefix all the keys share,
/// held beside each handle, and reads the keys themselves only on a tie.
/// `handles` is called twice (the shared prefix is found first).
pub fn sort_by_key<'a, H: Copy, I: Iterator<Item = H>>(
    order: &mut Vec<(u64, H)>,
    handles: impl Fn() -> I,
    key: impl Fn(H) -> &'a [u8],
) {
    let mut all = handles();
    let shared = match all.next() {
        Some(h0) => {
            let k0 = key(h0);
            all.fold(k0.len(), |n, h| common_prefix(&k0[..n], key(h)))
        }
        None => 0,
    };
    order.clear();
    order.extend(handles().map(|h| (prefix_of(&key(h)[shared..]), h)));
    order.sort_unstable_by(|a, b| cmp_order(a, b, shared, &key));
}

/// The bytewise order of two entries `(prefix_of(key[shared..]), handle)`
/// whose keys all share their first `shared` bytes.
#[inline]
fn cmp_order<'a, H: Copy>(
    a: &(u64, H),
    b: &(u64, H),
    shared: usize,
    key: &impl Fn(H) -> &'a [u8],
) -> std::cmp::Ordering {
    a.0.cmp(&b.0).then_with(|| key(a.1)[shared..].cmp(&key(b.1)[shared..]))
}

/// Prefetch every cache line of `bytes` but the first (fetched on its own,
/// earlier, by the callers: its header says how long the rest is).
#[inline]
pub(in crate::restore) fn prefetch_span(bytes: std::ops::Range<*const u8>) {
    let last = bytes.end.wrapping_sub(1);
    let mut line = bytes.start.wrapping_add(64);
    while line < last {
        prefetch_read(line);
        line = line.wrapping_add(64);
    }
    prefetch_read(last);
}

/// Ask the CPU to bring the cache line at `p` in (a hint, never a fault).
#[inline]
pub(in crate::restore) fn prefetch_read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address,
    // and SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn hash(key: &[u8]) -> u64 {
    let mut h = 0x9E37_79B9_7F4A_7C15u64 ^ key.len() as u64;
    let mut chunks = key.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        h = (h.rotate_left(5) ^ w).wrapping_mul(0x517C_C1B7_2722_0A95);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(0x517C_C1B7_2722_0A95);
    }
    // MurmurHash3's finaliser: every input bit reaches the low bits used as
    // the slot index (keys often differ only in their last bytes).
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// How deep [`Collector::prefetch`] reaches: the index slot, or the record
/// (key and value) the slot points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Slot,
    Data,
}

/// What [`Collector::add`] asks of its caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    /// The record is in.
    No,
    /// No room: take the sorted contents with [`Collector::drain_sorted`]
    /// (spill them), then add the record again.
    Spill,
}

/// Last value (or tombstone) per key, in memory.
///
/// The arena holds records `[key_len u32][val_len u32][val_cap u32][key][value]`,
/// each padded to 8 bytes; an index slot points straight at its record, so
/// finding a key touches the slot and the record's first lines and nothing
/// else. A value is overwritten in place when it fits the record's capacity;
/// otherwise the record is copied to the arena's end and the old one marked
/// dead. Sorting happens only when the collector is drained.
pub struct Collector {
    arena: Vec<u8>,
    arena_cap: usize,
    /// Live records (distinct keys held).
    keys: usize,
    max_keys: usize,
    /// Per slot: high 32 bits of the key's hash (compared before the key),
    /// low 32 bits the record's arena offset / 8, plus 1; 0 is empty.
    table: Vec<u64>,
    mask: usize,
    /// The table grows by doubling up to this many slots (load <= 1/2).
    max_slots: usize,
    /// Arena bytes a compaction would give back (dead records, shrunk values).
    garbage: usize,
    /// Sort keys of the live records, reused from drain to drain.
    order: Vec<(u64, usize)>,
    /// The first key added since the collector was last emptied, and how
    /// many of its leading bytes every key added since shares: the sort
    /// compares what follows, and needs no pass over the keys to find it.
    first_key: Vec<u8>,
    shared: usize,
    /// Where a drain on several threads divides its walk of the arena
    /// (records carry no mark a walk could start from).
    sections: Sections,
}

/// Stretches of the arena that several threads walk at once: the offset of
/// the first record at or after every multiple of `every` bytes.
struct Sections {
    starts: Vec<usize>,
    every: usize,
}

/// Stretches an arena is divided into (at most as many threads as this walk it).
const SECTIONS: usize = 64;

impl Sections {
    fn new(arena_cap: usize) -> Self {
        Self { starts: Vec::new(), every: (arena_cap / SECTIONS).max(1) }
    }

    /// A record was appended at `off`.
    #[inline]
    fn note(&mut self, off: usize) {
        if off >= self.starts.len() * self.every {
            self.starts.push(off);
        }
    }

    /// The arena's `[0, len)` cut into `parts` consecutive byte ranges that
    /// start and end at records (some empty when the arena is small).
    fn split(&self, parts: usize, len: usize) -> Vec<std::ops::Range<usize>> {
        let n = self.starts.len();
        let at = |i: usize| self.starts.get(i * n / parts).copied().unwrap_or(len);
        (0..parts).map(|w| at(w)..if w + 1 == parts { len } else { at(w + 1) }).collect()
    }
}

/// Bytes of a record's header: key length, value length, value capacity.
const HEADER: usize = 12;
/// Records start at multiples of this (slots store offset / ALIGN).
const ALIGN: usize = 8;
/// Set in a record's key length once a later copy supersedes it.
const DEAD: u32 = 1 << 31;

#[inline]
fn padded(n: usize) -> usize {
    n.next_multiple_of(ALIGN)
}

#[inline]
fn read_u32(arena: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(arena[at..at + 4].try_into().expect("4 bytes"))
}

#[inline]
fn write_u32(arena: &mut [u8], at: usize, v: u32) {
    arena[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// A record's header, read from the arena.
#[derive(Clone, Copy)]
struct Record {
    off: usize,
    key_len: usize,
    val_len: u32,
    val_cap: usize,
    dead: bool,
}

impl Record {
    #[inline]
    fn at(arena: &[u8], off: usize) -> Self {
        let k = read_u32(arena, off);
        Self {
            off,
            key_len: (k & !DEAD) as usize,
            val_len: read_u32(arena, off + 4),
            val_cap: read_u32(arena, off + 8) as usize,
            dead: k & DEAD != 0,
        }
    }

    fn key<'a>(&self, arena: &'a [u8]) -> &'a [u8] {
        &arena[self.off + HEADER..self.off + HEADER + self.key_len]
    }

    fn value_at(&self) -> usize {
        self.off + HEADER + self.key_len
    }

    fn value<'a>(&self, arena: &'a [u8]) -> Option<&'a [u8]> {
        (self.val_len != TOMBSTONE).then(|| &arena[self.value_at()..self.value_at() + self.val_len as usize])
    }

    fn size(&self) -> usize {
        padded(HEADER + self.key_len + self.val_cap)
    }
}

impl Collector {
    /// A collector using about `budget` bytes at most (arena plus index and
    /// sort order; compaction may briefly need half an arena more).
    pub fn new(budget: usize) -> Self {
        let budget = budget.max(4096);
        // Slots hold offset / ALIGN in 32 bits.
        let arena_cap = (budget / 2).min((u32::MAX as usize - 1) * ALIGN);
        let meta = budget - budget / 2 - budget / 6;
        let per_key = SLOTS_PER_KEY * 8 + std::mem::size_of::<(u64, usize)>();
        let max_keys = (meta / per_key).clamp(16, u32::MAX as usize / 4);
        let max_slots = (max_keys * SLOTS_PER_KEY).next_power_of_two();
        // Start small (a table sized to the keys held stays in cache), or at
        // the size the last collector of the process ended with: a process
        // restores partitions of similar sizes one after another, and each
        // doubling rehashes every key held.
        let slots = max_slots.min(LAST_SLOTS.load(Ordering::Relaxed).max(1 << 12));
        Self {
            arena: Vec::new(),
            arena_cap,
            keys: 0,
            max_keys,
            table: vec![0; slots],
            mask: slots - 1,
            max_slots,
            garbage: 0,
            order: Vec::new(),
            first_key: Vec::new(),
            shared: 0,
            sections: Sections::new(arena_cap),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keys == 0
    }

    /// Number of distinct keys held.
    pub fn len(&self) -> usize {
        self.keys
    }

    /// Live records in arena order.
    fn live(arena: &[u8]) -> impl Iterator<Item = Record> + '_ {
        Self::live_in(arena, 0..arena.len())
    }

    /// Live records of the records that start in `range` (which starts at one).
    fn live_in(arena: &[u8], range: std::ops::Range<usize>) -> impl Iterator<Item = Record> + '_ {
        let mut off = range.start;
        std::iter::from_fn(move || {
            while off < range.end {
                let r = Record::at(arena, off);
                off += r.size();
                if !r.dead {
                    return Some(r);
                }
            }
            None
        })
    }

    /// Rebuild the index with `slots` slots from the live records.
    fn reindex(&mut self, slots: usize) {
        let mut table = new_table(slots);
        let mask = slots - 1;
        for r in Self::live(&self.arena) {
            let h = hash(r.key(&self.arena));
            let mut i = h as usize & mask;
            while table[i] != 0 {
                i = (i + 1) & mask;
            }
            table[i] = (h & 0xFFFF_FFFF_0000_0000) | (r.off / ALIGN + 1) as u64;
        }
        keep_spare(&mut spares().tables, std::mem::replace(&mut self.table, table));
        self.mask = mask;
    }

    /// Record that `key` now holds `value` (`None`: deleted). On
    /// [`Full::Spill`] nothing was recorded.
    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> Full {
        self.add_hashed(key, value, hash(key))
    }

    /// The hash [`Collector::add_hashed`] and [`Collector::prefetch`] take.
    pub fn hash(key: &[u8]) -> u64 {
        hash(key)
    }

    /// Hint the CPU to load what adding a key of hash `h` will touch: call it
    /// with [`Stage::Slot`] some records ahead, then with [`Stage::Data`] for
    /// the same hash a few records later, once the slot is in cache, for the
    /// record it points to (a step that waits for memory stalls the whole
    /// loop). A hint only: correctness never depends on it.
    #[inline]
    pub fn prefetch(&self, h: u64, stage: Stage) {
        let i = h as usize & self.mask;
        if stage == Stage::Slot {
            prefetch_read(self.table.as_ptr().wrapping_add(i));
            return;
        }
        let slot = self.table[i];
        if slot != 0 {
            let at = self.arena.as_ptr().wrapping_add(((slot as u32) as usize - 1) * ALIGN);
            // The header and key, and the line after (the value, overwritten in place).
            prefetch_read(at);
            prefetch_read(at.wrapping_add(64));
        }
    }

    /// [`Collector::add`] with the key's hash computed beforehand.
    pub fn add_hashed(&mut self, key: &[u8], value: Option<&[u8]>, h: u64) -> Full {
        loop {
            if self.try_add(key, value, h) {
                return Full::No;
            }
            if !self.compact() {
                return Full::Spill;
            }
        }
    }

    /// Append a record; None when the arena has no room for it.
    fn push_record(&mut self, key: &[u8], value: Option<&[u8]>) -> Option<usize> {
        let vlen = value.map_or(0, <[u8]>::len);
        let size = padded(HEADER + key.len() + vlen);
        if !self.arena.is_empty() && self.arena.len() + size > self.arena_cap {
            return None;
        }
        if self.arena.capacity() == 0 {
            self.arena = new_arena(self.arena_cap.max(size));
        }
        Some(append_record(&mut self.arena, &mut self.sections, key, value))
    }

    /// False when there is no room.
    fn try_add(&mut self, key: &[u8], value: Option<&[u8]>, h: u64) -> bool {
        let vlen = value.map_or(0, <[u8]>::len);
        assert!(key.len() < DEAD as usize && vlen < TOMBSTONE as usize, "record too large");
        let tag = h & 0xFFFF_FFFF_0000_0000;
        let mut i = h as usize & self.mask;
        loop {
            let slot = self.table[i];
            if slot == 0 {
                break;
            }
            if slot & 0xFFFF_FFFF_0000_0000 == tag {
                let r = Record::at(&self.arena, ((slot as u32) as usize - 1) * ALIGN);
                if same_bytes(r.key(&self.arena), key) {
                    let old = if r.val_len == TOMBSTONE { 0 } else { r.val_len as usize };
                    if vlen <= r.val_cap {
                        // Overwrite in place: no garbage beyond the shrink.
                        let at = r.value_at();
                        if let Some(v) = value {
                            self.arena[at..at + vlen].copy_from_slice(v);
                        }
                        write_u32(&mut self.arena, r.off + 4, value.map_or(TOMBSTONE, |_| vlen as u32));
                        self.garbage = (self.garbage + old).saturating_sub(vlen);
                        return true;
                    }
                    let Some(off) = self.push_record(key, value) else { return false };
                    write_u32(&mut self.arena, r.off, r.key_len as u32 | DEAD);
                    self.garbage += r.size();
                    self.table[i] = tag | (off / ALIGN + 1) as u64;
                    return true;
                }
            }
            i = (i + 1) & self.mask;
        }
        if self.keys >= self.max_keys {
            return false;
        }
        let Some(off) = self.push_record(key, value) else { return false };
        self.table[i] = tag | (off / ALIGN + 1) as u64;
        if self.keys == 0 {
            self.first_key.clear();
            self.first_key.extend_from_slice(key);
            self.shared = key.len();
        } else {
            self.shared = common_prefix(&self.first_key[..self.shared], key);
        }
        self.keys += 1;
        if self.keys * SLOTS_PER_KEY > self.table.len() && self.table.len() < self.max_slots {
            self.reindex(self.table.len() * 2);
        }
        true
    }

    /// Compact the arena (instead of spilling) when at least half of it is
    /// garbage and the index has room. False: spill instead.
    fn compact(&mut self) -> bool {
        if self.garbage == 0 || self.garbage * 2 < self.arena.len() || self.keys >= self.max_keys {
            return false;
        }
        let mut fresh = new_arena(self.arena_cap);
        self.sections.starts.clear();
        for r in Self::live(&self.arena) {
            append_record(&mut fresh, &mut self.sections, r.key(&self.arena), r.value(&self.arena));
        }
        keep_spare(&mut spares().arenas, std::mem::replace(&mut self.arena, fresh));
        self.garbage = 0;
        self.reindex(self.table.len());
        true
    }

    /// Sort the held keys and hand each `(key, value or None)` to `f` in key
    /// order, then empty the collector.
    ///
    /// Keys often share a long common prefix (a namespace, zero padding), so
    /// the sort compares the 8 bytes that follow the prefix common to all
    /// held keys, and only on a tie the rest of the keys.
    pub fn drain_sorted<E>(&mut self, mut f: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>) -> Result<(), E> {
        let (arena, shared) = (&self.arena, self.shared);
        let key = |off: usize| Record::at(arena, off).key(arena);
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        order.extend(Self::live(arena).map(|r| (prefix_of(&r.key(arena)[shared..]), r.off)));
        order.sort_unstable_by(|a, b| cmp_order(a, b, shared, &key));
        let result = order.iter().enumerate().try_for_each(|(i, &(_, off))| {
            prefetch_sorted(arena, &order, i);
            let r = Record::at(arena, off);
            f(r.key(arena), r.value(arena))
        });
        self.order = order;
        self.empty();
        result
    }

    /// Forget every record (the buffers are kept).
    fn empty(&mut self) {
        self.arena.clear();
        self.sections.starts.clear();
        self.table.fill(0);
        self.keys = 0;
        self.garbage = 0;
    }
}

impl Collector {
    /// [`Collector::drain_sorted`] on `parts` threads: the held keys are split
    /// into `parts` consecutive key ranges at pivots taken from a sample of
    /// them, then each range is sorted and handed to `f(part, range)` on a
    /// thread of its own (the first on this one). Returns the parts' results
    /// in key order and empties the collector.
    ///
    /// Every step runs on the `parts` threads: each walks its stretch of the
    /// arena twice, counting its records per range, then placing them where
    /// the counts say, so the one sort order holds each range in a slice of
    /// its own, and no memory beyond the collector's is used.
    pub fn drain_sorted_parts<R: Send>(
        &mut self,
        parts: usize,
        f: impl Fn(usize, SortedRange<'_>) -> R + Sync,
    ) -> Vec<R> {
        let parts = parts.max(1);
        let (arena, shared) = (&self.arena, self.shared);
        let key = |off: usize| Record::at(arena, off).key(arena);
        let entry = |r: Record| (prefix_of(&r.key(arena)[shared..]), r.off);
        let cmp = |a: &(u64, usize), b: &(u64, usize)| cmp_order(a, b, shared, &key);
        let less = |a: &(u64, usize), b: &(u64, usize)| cmp(a, b).is_lt();
        let pivots = self.pivots(parts, &entry, &cmp);
        // Ties go after the pivot, as `less` is strict.
        let range_of = |e: &(u64, usize)| pivots.partition_point(|p| !less(e, p));
        let walks = self.sections.split(parts, arena.len());
        let counts: Vec<Vec<usize>> = if pivots.is_empty() {
            let mut counts = vec![vec![0; parts]; parts];
            counts[0][0] = self.keys; // one walk, one range: no need to count
            counts
        } else {
            side_by_side(&walks, |walk| {
                let mut n = vec![0; parts];
                for r in Self::live_in(arena, walk.clone()) {
                    n[range_of(&entry(r))] += 1;
                }
                n
            })
        };
        let mut order = std::mem::take(&mut self.order);
        // Every entry is written below. Per walk, per range: the slice of `order` its records go to.
        order.resize(self.keys, (0, 0));
        let mut places: Vec<Vec<&mut [(u64, usize)]>> = (0..parts).map(|_| Vec::with_capacity(parts)).collect();
        let mut rest = &mut order[..];
        for range in 0..parts {
            for (walk, n) in counts.iter().enumerate() {
                let (place, after) = rest.split_at_mut(n[range]);
                places[walk].push(place);
                rest = after;
            }
        }
        side_by_side(walks.iter().zip(places).filter(|(walk, _)| !walk.is_empty()), |(walk, mut places)| {
            let mut at = vec![0; parts];
            for r in Self::live_in(arena, walk.clone()) {
                let e = entry(r);
                let range = range_of(&e);
                places[range][at[range]] = e;
                at[range] += 1;
            }
        });
        let mut ranges = Vec::with_capacity(parts);
        let mut rest = &mut order[..];
        for range in 0..parts {
            let (this, after) = rest.split_at_mut(counts.iter().map(|n| n[range]).sum());
            ranges.push(this);
            rest = after;
        }
        let results = side_by_side(ranges.into_iter().enumerate(), |(part, range)| {
            range.sort_unstable_by(cmp);
            f(part, SortedRange { arena, order: range })
        });
        self.order = order;
        self.empty();
        results
    }

    /// `parts - 1` pivots that split the held keys into `parts` ranges of
    /// about equal counts: quantiles of a sample of the keys read from
    /// evenly spaced index slots (the hash places keys at random).
    fn pivots(
        &self,
        parts: usize,
        entry: &impl Fn(Record) -> (u64, usize),
        cmp: &impl Fn(&(u64, usize), &(u64, usize)) -> std::cmp::Ordering,
    ) -> Vec<(u64, usize)> {
        if parts <= 1 || self.keys == 0 {
            return Vec::new();
        }
        let want = (PIVOT_SAMPLE * parts).min(self.keys);
        let step = self.table.len() / want;
        let mut sample: Vec<(u64, usize)> = (0..want)
            .map(|j| {
                let mut i = j * step;
                while self.table[i & self.mask] == 0 {
                    i += 1;
                }
                let slot = self.table[i & self.mask];
                entry(Record::at(&self.arena, ((slot as u32) as usize - 1) * ALIGN))
            })
            .collect();
        sample.sort_unstable_by(cmp);
        (1..parts).map(|i| sample[i * sample.len() / parts]).collect()
    }
}

/// Keys sampled per range to choose a drain's pivots: with 256, the largest
/// of two ranges holds at most a few percent more than half.
const PIVOT_SAMPLE: usize = 256;

/// Append a record of `key` and `value` (`None`: a tombstone) to `arena`,
/// its value's capacity its length; its offset.
fn append_record(arena: &mut Vec<u8>, sections: &mut Sections, key: &[u8], value: Option<&[u8]>) -> usize {
    let vlen = value.map_or(0, <[u8]>::len);
    let off = arena.len();
    arena.extend_from_slice(&(key.len() as u32).to_ne_bytes());
    arena.extend_from_slice(&value.map_or(TOMBSTONE, |_| vlen as u32).to_ne_bytes());
    arena.extend_from_slice(&(vlen as u32).to_ne_bytes());
    arena.extend_from_slice(key);
    arena.extend_from_slice(value.unwrap_or_default());
    arena.resize(off + padded(HEADER + key.len() + vlen), 0);
    sections.note(off);
    off
}

/// One key range of a [`Collector::drain_sorted_parts`], sorted.
#[derive(Clone, Copy)]
pub struct SortedRange<'a> {
    arena: &'a [u8],
    order: &'a [(u64, usize)],
}

impl<'a> SortedRange<'a> {
    /// The range's `(key, value or None)` in key order.
    pub fn records(self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> {
        let Self { arena, order } = self;
        order.iter().enumerate().map(move |(i, &(_, off))| {
            prefetch_sorted(arena, order, i);
            let r = Record::at(arena, off);
            (r.key(arena), r.value(arena))
        })
    }
}

/// Prefetch for the `i`-th step of a walk of the arena in key order (records
/// sorted by key lie in insertion order, so each is a cache miss): the
/// header of the record 2 x AHEAD steps on, and the whole of the record
/// AHEAD steps on, its length read from the header fetched before (a
/// 100-byte value spans three cache lines; two were fetched before and the
/// third missed, a sixth of a bulk restore's time in its spills).
#[inline]
fn prefetch_sorted(arena: &[u8], order: &[(u64, usize)], i: usize) {
    const AHEAD: usize = 8;
    if let Some(&(_, far)) = order.get(i + 2 * AHEAD) {
        prefetch_read(arena.as_ptr().wrapping_add(far));
    }
    if let Some(&(_, next)) = order.get(i + AHEAD) {
        let r = Record::at(arena, next);
        let len = HEADER + r.key_len + if r.val_len == TOMBSTONE { 0 } else { r.val_len as usize };
        let start = arena.as_ptr().wrapping_add(next);
        prefetch_span(start..start.wrapping_add(len));
    }
}

/// Index slots of the last collector dropped in this process.
static LAST_SLOTS: AtomicUsize = AtomicUsize::new(0);

impl Drop for Collector {
    fn drop(&mut self) {
        LAST_SLOTS.store(self.table.len(), Ordering::Relaxed);
        let mut spares = spares();
        keep_spare(&mut spares.arenas, std::mem::take(&mut self.arena));
        keep_spare(&mut spares.tables, std::mem::take(&mut self.table));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn drain(c: &mut Collector) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        c.drain_sorted::<()>(|k, v| {
            out.push((k.to_vec(), v.map(<[u8]>::to_vec)));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn keeps_the_last_operation_per_key_in_key_order() {
        let mut c = Collector::new(1 << 20);
        let mut model = BTreeMap::new();
        for i in 0..5000u32 {
            let k = format!("key{}", (i * 7919) % 701).into_bytes();
            let v = if i % 11 == 0 { None } else { Some(vec![i as u8; (i % 50) as usize]) };
            assert_eq!(c.add(&k, v.as_deref()), Full::No);
            model.insert(k, v);
        }
        assert_eq!(c.len(), model.len());
        assert_eq!(drain(&mut c), model.into_iter().collect::<Vec<_>>());
        assert!(c.is_empty());
    }

    #[test]
    fn values_that_grow_move_and_values_that_shrink_stay_through_compactions() {
        // 3,000 keys whose values change size and turn into tombstones and
        // back; ~3 MB appended into a 2 MB arena, so compactions happen.
        let mut c = Collector::new(4 << 20);
        let mut model = BTreeMap::new();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for i in 0..60_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = format!("key-{:06}", x % 3_000).into_bytes();
            let v = match x % 5 {
                0 => None,
                n => Some(vec![(i % 251) as u8; ((x >> 8) % (40 * n)) as usize]),
            };
            assert_eq!(c.add(&k, v.as_deref()), Full::No, "3,000 keys fit: compaction, not spilling");
            model.insert(k, v);
        }
        assert_eq!(c.len(), model.len());
        assert_eq!(drain(&mut c), model.into_iter().collect::<Vec<_>>());
        assert!(c.is_empty());
        // Drained collectors start over cleanly.
        assert_eq!(c.add(b"again", Some(b"1")), Full::No);
        assert_eq!(drain(&mut c), vec![(b"again".to_vec(), Some(b"1".to_vec()))]);
    }

    #[test]
    fn a_collector_on_kept_buffers_holds_only_its_own_records() {
        // The first collector's arena (> 2 MiB) and table are kept on drop;
        // the second one, with other keys and values, must see none of them.
        for round in 0..3u32 {
            let mut c = Collector::new(32 << 20);
            let mut model = BTreeMap::new();
            for i in 0..40_000u32 {
                let k = format!("r{round}-{:06}", (i * 7919) % 30_011).into_bytes();
                let v = vec![(round * 31 + i) as u8; 60 + (i % 5) as usize];
                assert_eq!(c.add(&k, Some(&v)), Full::No);
                model.insert(k, Some(v));
            }
            assert_eq!(drain(&mut c), model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn drained_in_parts_the_ranges_follow_each_other_and_make_one_drain() {
        let fill = |c: &mut Collector| {
            for i in 0..20_000u32 {
                let k = format!("ns:{:07}", (i * 7919) % 9_973).into_bytes();
                let v = (i % 13 != 0).then(|| vec![i as u8; (i % 30) as usize]);
                assert_eq!(c.add(&k, v.as_deref()), Full::No);
            }
        };
        let mut c = Collector::new(8 << 20);
        fill(&mut c);
        let whole = drain(&mut c);
        for parts in [1, 2, 3, 8] {
            fill(&mut c);
            let ranges = c.drain_sorted_parts(parts, |part, range| {
                (part, range.records().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect::<Vec<_>>())
            });
            assert!(c.is_empty());
            assert_eq!(ranges.iter().map(|r| r.0).collect::<Vec<_>>(), (0..parts).collect::<Vec<_>>());
            let sizes: Vec<usize> = ranges.iter().map(|r| r.1.len()).collect();
            assert!(sizes.iter().all(|&n| n > whole.len() / parts / 2), "{parts} parts: {sizes:?}");
            assert_eq!(ranges.into_iter().flat_map(|r| r.1).collect::<Vec<_>>(), whole, "{parts} parts");
        }
        // nothing held: every part gets nothing
        assert!(c.drain_sorted_parts(3, |_, range| range.records().count()).iter().all(|&n| n == 0));
    }

    #[test]
    fn drained_in_parts_after_moves_and_compactions_every_key_is_in_its_range_once() {
        // Values that grow move their records (the old copy dies in its
        // stretch of the arena), compactions rebuild the arena and its
        // stretches; the first key added moves, and keys added later share
        // less and less of it ("ns:" with most, "n" with a few, "" with one).
        for parts in [2, 3, 5] {
            let mut c = Collector::new(1 << 20);
            let mut model = BTreeMap::new();
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ parts as u64;
            let mut compactions = 0;
            for i in 0..40_000u32 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let k = match i {
                    0 => b"ns:first".to_vec(),
                    39_999 => Vec::new(),
                    _ if i % 997 == 0 => format!("n{}", x % 50).into_bytes(),
                    _ => format!("ns:{:06}", x % 1_500).into_bytes(),
                };
                // values grow over time: records keep moving
                let v = (x % 7 != 0).then(|| vec![i as u8; (x >> 16) as usize % (20 + i as usize / 250)]);
                let garbage = c.garbage;
                assert_eq!(c.add(&k, v.as_deref()), Full::No, "the keys fit");
                compactions += usize::from(c.garbage + 1024 < garbage); // an overwrite gives back < 200
                model.insert(k, v);
            }
            assert!(compactions > 1, "{compactions} compactions");
            assert!(c.sections.starts.len() > parts, "the arena is walked in stretches");
            assert_eq!(c.shared, 0, "the empty key shares nothing");
            let ranges = c.drain_sorted_parts(parts, |_, range| {
                range.records().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect::<Vec<_>>()
            });
            assert!(c.is_empty());
            let sizes: Vec<usize> = ranges.iter().map(Vec::len).collect();
            assert!(sizes.iter().all(|&n| n > model.len() / parts / 2), "{parts} parts: {sizes:?}");
            assert_eq!(ranges.concat(), model.into_iter().collect::<Vec<_>>(), "{parts} parts");
        }
    }

    #[test]
    fn the_arena_is_cut_into_walks_at_record_starts() {
        let sections = Sections { starts: vec![0, 16, 40, 72], every: 16 };
        assert_eq!(sections.split(1, 90), vec![0..90]);
        assert_eq!(sections.split(2, 90), vec![0..40, 40..90]);
        assert_eq!(sections.split(3, 90), vec![0..16, 16..40, 40..90]);
        let many = sections.split(6, 90);
        assert_eq!(many.len(), 6);
        assert_eq!((many[0].start, many[5].end), (0, 90));
        assert!(many.windows(2).all(|w| w[0].end == w[1].start), "{many:?}");
        assert!(many.iter().all(|r| [0, 16, 40, 72, 90].contains(&r.start)), "{many:?}");
        assert_eq!(Sections { starts: Vec::new(), every: 16 }.split(2, 0), vec![0..0, 0..0]);
    }

    #[test]
    fn same_bytes_is_slice_equality() {
        let keys: [&[u8]; 7] =
            [b"", b"a", b"ab", b"key-00000001", b"key-00000002", b"key-000000012345", b"key-000000012346"];
        for a in keys {
            for b in keys {
                assert_eq!(same_bytes(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn common_prefix_counts_equal_leading_bytes() {
        assert_eq!(common_prefix(b"", b"abc"), 0);
        assert_eq!(common_prefix(b"abc", b"abd"), 2);
        assert_eq!(common_prefix(b"key-000000001234", b"key-000000001299"), 14);
        assert_eq!(common_prefix(b"key-0000", b"key-00001"), 8);
        assert_eq!(common_prefix(b"same-long-key-xyz", b"same-long-key-xyz"), 17);
    }

    #[test]
    fn keys_with_a_long_common_prefix_sort_by_their_tails() {
        let mut c = Collector::new(1 << 20);
        let mut model = BTreeMap::new();
        for i in 0..3000u32 {
            // shared 12-byte prefix, then tails of different lengths, some ending early
            let k = format!("namespace/0/{}", (i * 7919) % 2503).into_bytes();
            assert_eq!(c.add(&k, Some(&i.to_le_bytes())), Full::No);
            model.insert(k, Some(i.to_le_bytes().to_vec()));
        }
        c.add(b"namespace/0/", None);
        model.insert(b"namespace/0/".to_vec(), None);
        assert_eq!(drain(&mut c), model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn overwrites_compact_instead_of_spilling_and_unique_keys_spill() {
        let mut c = Collector::new(64 << 10);
        for i in 0..100_000u32 {
            let k = format!("k{}", i % 10).into_bytes();
            let v = vec![(i % 251) as u8; 10 + (i % 7) as usize];
            assert_eq!(c.add(&k, Some(&v)), Full::No, "ten keys never need a spill");
        }
        assert_eq!(c.len(), 10);
        let mut spills = 0;
        for i in 0..100_000u32 {
            let k = format!("unique{i:08}").into_bytes();
            if c.add(&k, Some(b"value")) == Full::Spill {
                spills += 1;
                let d = drain(&mut c);
                assert!(d.windows(2).all(|w| w[0].0 < w[1].0));
                assert_eq!(c.add(&k, Some(b"value")), Full::No);
            }
        }
        assert!(spills > 10, "{spills}");
    }
}
