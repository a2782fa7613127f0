//! The in-memory side of bulk restore: the last operation per key, kept in
//! one arena (keys and values) with an open-addressing index, within a fixed
//! memory share. When the share is full the arena is compacted (when most of
//! it is overwritten values) or handed out sorted as a run to spill.

use std::cmp::Ordering;

/// `val_len` of a tombstone.
const TOMBSTONE: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Entry {
    /// First 8 key bytes, big-endian, zero padded: most comparisons stop here.
    prefix: u64,
    key_off: usize,
    val_off: usize,
    key_len: u32,
    val_len: u32,
}

const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();
/// Index slots per entry (load factor 1/2), 8 bytes each.
const SLOTS_PER_ENTRY: usize = 2;

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
        let x = u64::from_ne_bytes(a[i..i + 8].try_into().expect("8")) ^ u64::from_ne_bytes(b[i..i + 8].try_into().expect("8"));
        if x != 0 {
            return i + (if cfg!(target_endian = "little") { x.trailing_zeros() } else { x.leading_zeros() } / 8) as usize;
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

#[inline]
fn prefetch_read<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it never faults, whatever the address,
    // and SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Ask the kernel to back the spare capacity of `v` with huge pages where it
/// can (Linux, `transparent_hugepage` set to `madvise` or `always`). The
/// collector reads and writes its buffers at random; with 4 KiB pages nearly
/// every access of a large collector also misses the TLB, and the page walks
/// compete for the same memory bandwidth as the data (two restores side by
/// side slow each other down the most there). Call it before the capacity is
/// first written: pages already faulted in stay small. A hint only.
fn advise_huge_pages<T>(v: &Vec<T>) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let end = start + v.capacity() * std::mem::size_of::<T>();
        let (lo, hi) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
        if hi > lo {
            // SAFETY: [lo, hi) lies inside the allocation of `v`; MADV_HUGEPAGE
            // changes how future faults are served, never the contents.
            unsafe {
                libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = v;
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

/// How deep [`Collector::prefetch`] reaches: the index slot, the entry it
/// points to, or the key and value bytes that entry points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Slot,
    Entry,
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
pub struct Collector {
    arena: Vec<u8>,
    arena_cap: usize,
    entries: Vec<Entry>,
    max_entries: usize,
    /// Per slot: high 32 bits of the key's hash (compared before the key),
    /// low 32 bits entry index + 1; 0 is empty.
    table: Vec<u64>,
    mask: usize,
    /// The table grows by doubling up to this many slots (load <= 1/2).
    max_slots: usize,
    garbage: usize,
}

impl Collector {
    /// A collector using about `budget` bytes at most (arena plus index;
    /// compaction may briefly need half an arena more).
    pub fn new(budget: usize) -> Self {
        let budget = budget.max(4096);
        let arena_cap = budget / 2;
        let meta = budget - budget / 2 - budget / 6;
        let max_entries = (meta / (ENTRY_BYTES + SLOTS_PER_ENTRY * 8)).clamp(16, u32::MAX as usize / 4);
        let max_slots = (max_entries * SLOTS_PER_ENTRY).next_power_of_two();
        // Start small: a table sized to the keys held stays in cache.
        let slots = max_slots.min(1 << 12);
        Self {
            arena: Vec::new(),
            arena_cap,
            entries: Vec::new(),
            max_entries,
            table: vec![0; slots],
            mask: slots - 1,
            max_slots,
            garbage: 0,
        }
    }

    /// Double the index and re-insert every entry.
    fn grow(&mut self) {
        let slots = self.table.len() * 2;
        let mut table = vec![0u64; slots];
        advise_huge_pages(&table);
        let mask = slots - 1;
        for (n, e) in self.entries.iter().enumerate() {
            let h = hash(&self.arena[e.key_off..e.key_off + e.key_len as usize]);
            let mut i = h as usize & mask;
            while table[i] != 0 {
                i = (i + 1) & mask;
            }
            table[i] = (h & 0xFFFF_FFFF_0000_0000) | (n as u64 + 1);
        }
        self.table = table;
        self.mask = mask;
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of distinct keys held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn key(&self, e: &Entry) -> &[u8] {
        &self.arena[e.key_off..e.key_off + e.key_len as usize]
    }

    fn value(&self, e: &Entry) -> Option<&[u8]> {
        (e.val_len != TOMBSTONE).then(|| &self.arena[e.val_off..e.val_off + e.val_len as usize])
    }

    fn push_bytes(&mut self, b: &[u8]) -> usize {
        if self.arena.capacity() == 0 {
            self.arena.reserve_exact(self.arena_cap);
            advise_huge_pages(&self.arena);
        }
        let off = self.arena.len();
        self.arena.extend_from_slice(b);
        off
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

    /// Hint the CPU to load what adding a key of hash `h` will touch, one
    /// level of the index per [`Stage`]: call it with [`Stage::Slot`] some
    /// records ahead, then [`Stage::Entry`] and [`Stage::Data`] for the same
    /// hash on later records, so that each stage reads only what the one
    /// before brought into cache (a stage that waits for memory stalls the
    /// whole loop). A hint only: correctness never depends on it.
    #[inline]
    pub fn prefetch(&self, h: u64, stage: Stage) {
        let i = h as usize & self.mask;
        if stage == Stage::Slot {
            prefetch_read(self.table.as_ptr().wrapping_add(i));
            return;
        }
        let slot = self.table[i];
        if slot == 0 {
            return;
        }
        let n = (slot as u32) as usize - 1;
        if stage == Stage::Entry {
            prefetch_read(self.entries.as_ptr().wrapping_add(n));
        } else if let Some(e) = self.entries.get(n) {
            let base = self.arena.as_ptr();
            prefetch_read(base.wrapping_add(e.key_off));
            if e.val_len != TOMBSTONE {
                // The value is overwritten in place: its first and last lines.
                prefetch_read(base.wrapping_add(e.val_off));
                prefetch_read(base.wrapping_add(e.val_off + (e.val_len as usize).saturating_sub(1)));
            }
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

    /// False when there is no room.
    fn try_add(&mut self, key: &[u8], value: Option<&[u8]>, h: u64) -> bool {
        let vlen = value.map_or(0, <[u8]>::len);
        assert!(key.len() < u32::MAX as usize && vlen < TOMBSTONE as usize, "record too large");
        let prefix = prefix_of(key);
        let tag = h & 0xFFFF_FFFF_0000_0000;
        let mut i = h as usize & self.mask;
        loop {
            let slot = self.table[i];
            if slot == 0 {
                break;
            }
            let s = slot as u32;
            let e = self.entries[s as usize - 1];
            if slot & 0xFFFF_FFFF_0000_0000 == tag && e.prefix == prefix && same_bytes(self.key(&e), key) {
                let old = if e.val_len == TOMBSTONE { 0 } else { e.val_len as usize };
                if old >= vlen {
                    // Overwrite in place: no garbage beyond the shrink.
                    let e = &mut self.entries[s as usize - 1];
                    if let Some(v) = value {
                        self.arena[e.val_off..e.val_off + vlen].copy_from_slice(v);
                    }
                    e.val_len = value.map_or(TOMBSTONE, |_| vlen as u32);
                    self.garbage += old - vlen;
                    return true;
                }
                if !self.arena.is_empty() && self.arena.len() + vlen > self.arena_cap {
                    return false;
                }
                let off = self.push_bytes(value.unwrap_or_default());
                let e = &mut self.entries[s as usize - 1];
                e.val_off = off;
                e.val_len = value.map_or(TOMBSTONE, |_| vlen as u32);
                self.garbage += old;
                return true;
            }
            i = (i + 1) & self.mask;
        }
        if self.entries.len() >= self.max_entries
            || (!self.arena.is_empty() && self.arena.len() + key.len() + vlen > self.arena_cap)
        {
            return false;
        }
        if self.entries.capacity() == 0 {
            self.entries.reserve_exact(self.max_entries);
            advise_huge_pages(&self.entries);
        }
        let key_off = self.push_bytes(key);
        let val_off = self.push_bytes(value.unwrap_or_default());
        self.entries.push(Entry {
            prefix,
            key_off,
            val_off,
            key_len: key.len() as u32,
            val_len: value.map_or(TOMBSTONE, |_| vlen as u32),
        });
        self.table[i] = tag | self.entries.len() as u64;
        if self.entries.len() * SLOTS_PER_ENTRY > self.table.len() && self.table.len() < self.max_slots {
            self.grow();
        }
        true
    }

    /// Compact the arena (instead of spilling) when at least half of it is
    /// overwritten values and the index has room. False: spill instead.
    fn compact(&mut self) -> bool {
        if self.garbage == 0 || self.garbage * 2 < self.arena.len() || self.entries.len() >= self.max_entries {
            return false;
        }
        let mut fresh = Vec::with_capacity(self.arena_cap);
        advise_huge_pages(&fresh);
        for e in &mut self.entries {
            let k = &self.arena[e.key_off..e.key_off + e.key_len as usize];
            let key_off = fresh.len();
            fresh.extend_from_slice(k);
            let val_off = fresh.len();
            if e.val_len != TOMBSTONE {
                fresh.extend_from_slice(&self.arena[e.val_off..e.val_off + e.val_len as usize]);
            }
            e.key_off = key_off;
            e.val_off = val_off;
        }
        self.arena = fresh;
        self.garbage = 0;
        true
    }

    /// Sort the held keys and hand each `(key, value or None)` to `f` in key
    /// order, then empty the collector.
    ///
    /// Keys often share a long common prefix (a namespace, zero padding), so
    /// the sort compares the 8 bytes that follow the prefix common to all
    /// held keys, and only on a tie the rest of the keys.
    pub fn drain_sorted<E>(&mut self, mut f: impl FnMut(&[u8], Option<&[u8]>) -> Result<(), E>) -> Result<(), E> {
        let mut entries = std::mem::take(&mut self.entries);
        let arena = &self.arena;
        let key = |e: &Entry| &arena[e.key_off..e.key_off + e.key_len as usize];
        let lcp = match entries.first() {
            None => 0,
            Some(first) => entries.iter().fold(key(first).len(), |n, e| common_prefix(&key(first)[..n], key(e))),
        };
        if lcp > 0 {
            for e in &mut entries {
                e.prefix = prefix_of(&arena[e.key_off + lcp..e.key_off + e.key_len as usize]);
            }
        }
        entries.sort_unstable_by(|a, b| match a.prefix.cmp(&b.prefix) {
            Ordering::Equal => key(a)[lcp..].cmp(&key(b)[lcp..]),
            o => o,
        });
        // Entries are sorted by key, their bytes lie in insertion order: fetch ahead.
        const AHEAD: usize = 8;
        let base = self.arena.as_ptr();
        let result = entries.iter().enumerate().try_for_each(|(i, e)| {
            if let Some(next) = entries.get(i + AHEAD) {
                prefetch_read(base.wrapping_add(next.key_off));
                prefetch_read(base.wrapping_add(next.val_off));
            }
            f(self.key(e), self.value(e))
        });
        entries.clear();
        self.entries = entries;
        self.arena.clear();
        self.table.fill(0);
        self.garbage = 0;
        result
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
    fn same_bytes_is_slice_equality() {
        let keys: [&[u8]; 7] = [b"", b"a", b"ab", b"key-00000001", b"key-00000002", b"key-000000012345", b"key-000000012346"];
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
