//! Buffers of the bulk collector kept across restores of one process, and
//! the memory hints they are allocated with.

/// Ask the kernel to back the spare capacity of `v` with huge pages where it
/// can (Linux, `transparent_hugepage` set to `madvise` or `always`). The
/// collector reads and writes its buffers at random; with 4 KiB pages nearly
/// every access of a large collector also misses the TLB, and the page walks
/// compete for the same memory bandwidth as the data (two restores side by
/// side slow each other down the most there). Call it before the capacity is
/// first written: pages already faulted in stay small. A hint only.
pub(in crate::restore) fn advise_huge_pages<T>(v: &Vec<T>) {
    #[cfg(target_os = "linux")]
    advise(v, libc::MADV_HUGEPAGE);
    #[cfg(not(target_os = "linux"))]
    let _ = v;
}

/// Buffers smaller than this are left on small pages by [`reserve_advised`]:
/// a huge page is zeroed whole on its first touch, which a small restore
/// would pay without gaining from it.
const MIN_ADVISED_BYTES: usize = 16 << 20;

/// Make room in `v` for `additional` more elements, growing it as `Vec`
/// would (at least doubling) but into a fresh allocation that
/// [`advise_huge_pages`] covers before it is written, once it is at least
/// [`MIN_ADVISED_BYTES`]. For buffers kept across the chunks of a replay and
/// read at random (by key order, by hash): grown by `Vec`, their pages would
/// all stay small.
pub(in crate::restore) fn reserve_advised<T: Copy>(v: &mut Vec<T>, additional: usize) {
    if v.capacity() - v.len() >= additional {
        return;
    }
    let cap = (v.len() + additional).max(v.capacity() * 2);
    let mut grown = Vec::with_capacity(cap);
    if cap * std::mem::size_of::<T>() >= MIN_ADVISED_BYTES {
        advise_huge_pages(&grown);
        // Below the allocator's mmap threshold the capacity comes from memory
        // it has handed out before, whose pages are already faulted in small;
        // collapse them now (Linux 6.1+, a hint like the other).
        #[cfg(target_os = "linux")]
        advise(&grown, MADV_COLLAPSE);
    }
    grown.extend_from_slice(v);
    *v = grown;
}

/// `MADV_COLLAPSE` (Linux 6.1 uapi; not in every libc crate target): back
/// the range with huge pages now, its present small pages copied into them.
#[cfg(target_os = "linux")]
const MADV_COLLAPSE: libc::c_int = 25;

/// `madvise(advice)` over the whole 2 MiB pages inside the capacity of `v`.
#[cfg(target_os = "linux")]
fn advise<T>(v: &Vec<T>, advice: libc::c_int) {
    const HUGE: usize = 2 << 20;
    let start = v.as_ptr() as usize;
    let end = start + v.capacity() * std::mem::size_of::<T>();
    let (lo, hi) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
    if hi > lo {
        // SAFETY: [lo, hi) lies inside the allocation of `v`, and callers pass
        // MADV_HUGEPAGE or MADV_COLLAPSE (they change how pages are backed,
        // never the contents) or MADV_FREE on a vector of length 0 (its
        // capacity holds no values to lose).
        unsafe {
            libc::madvise(lo as *mut libc::c_void, hi - lo, advice);
        }
    }
}

/// Buffers of dropped collectors, kept for the next bulk restore of this
/// process (a Spark worker or a `restore_many` thread runs one after
/// another). A fresh buffer costs a page fault and the zeroing of every page
/// it touches: several percent of a restore, more when two run side by side
/// and zero pages at once. Kept buffers are lazily free (`MADV_FREE`): under
/// memory pressure the kernel takes their pages back, and a reuse then faults
/// them in again like a fresh buffer would.
pub(super) struct Spares {
    pub(super) arenas: Vec<Vec<u8>>,
    pub(super) tables: Vec<Vec<u64>>,
}

static SPARES: std::sync::Mutex<Spares> = std::sync::Mutex::new(Spares { arenas: Vec::new(), tables: Vec::new() });
/// Buffers kept per kind (two restores side by side each find one).
const MAX_SPARES: usize = 2;
/// Smaller buffers are not worth keeping.
const MIN_SPARE_BYTES: usize = 2 << 20;

pub(super) fn spares() -> std::sync::MutexGuard<'static, Spares> {
    SPARES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A kept buffer of capacity at least `min`, emptied, if there is one.
pub(super) fn take_spare<T>(list: &mut Vec<Vec<T>>, min: usize) -> Option<Vec<T>> {
    let i = list.iter().position(|v| v.capacity() >= min)?;
    Some(list.swap_remove(i))
}

/// Keep `v` for a later collector (or free it, if small or enough are kept).
pub(super) fn keep_spare<T>(list: &mut Vec<Vec<T>>, mut v: Vec<T>) {
    if v.capacity() * std::mem::size_of::<T>() < MIN_SPARE_BYTES {
        return;
    }
    v.clear();
    #[cfg(target_os = "linux")]
    advise(&v, libc::MADV_FREE);
    list.push(v);
    if list.len() > MAX_SPARES {
        let smallest = (0..list.len()).min_by_key(|&i| list[i].capacity()).expect("not empty");
        list.swap_remove(smallest);
    }
}

/// A zeroed table of `slots` slots, a kept one where possible.
pub(super) fn new_table(slots: usize) -> Vec<u64> {
    if let Some(mut t) = take_spare(&mut spares().tables, slots) {
        t.resize(slots, 0);
        return t;
    }
    let t = vec![0u64; slots];
    advise_huge_pages(&t);
    t
}

/// An empty arena of capacity at least `cap`, a kept one where possible.
pub(super) fn new_arena(cap: usize) -> Vec<u8> {
    if let Some(a) = take_spare(&mut spares().arenas, cap) {
        return a;
    }
    let a = Vec::with_capacity(cap);
    advise_huge_pages(&a);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_buffers_are_reused_emptied_and_at_most_two_are_kept() {
        let mut list: Vec<Vec<u8>> = Vec::new();
        keep_spare(&mut list, Vec::with_capacity(1 << 20));
        assert!(list.is_empty(), "small buffers are freed");
        for mib in [4, 8, 3] {
            let mut v = Vec::with_capacity(mib << 20);
            v.extend_from_slice(b"old contents");
            keep_spare(&mut list, v);
        }
        let mut caps: Vec<usize> = list.iter().map(|v| v.capacity() >> 20).collect();
        caps.sort_unstable();
        assert_eq!(caps, vec![4, 8], "the smallest is dropped beyond two");
        assert!(take_spare(&mut list, 9 << 20).is_none());
        let v = take_spare(&mut list, 5 << 20).expect("the 8 MiB one");
        assert!(v.is_empty() && v.capacity() >= 8 << 20);
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn reserving_keeps_the_contents_and_grows_at_least_twofold() {
        let mut v: Vec<u32> = vec![1, 2, 3];
        reserve_advised(&mut v, 2);
        let cap = v.capacity();
        assert!(cap >= 5);
        reserve_advised(&mut v, 1);
        assert_eq!(v.capacity(), cap, "room enough: no new allocation");
        reserve_advised(&mut v, cap);
        assert_eq!(v, vec![1, 2, 3]);
        assert!(v.capacity() >= (cap * 2).max(3 + cap));
        let mut big: Vec<u8> = b"abc".to_vec();
        reserve_advised(&mut big, MIN_ADVISED_BYTES);
        assert_eq!(big, b"abc");
        assert!(big.capacity() >= MIN_ADVISED_BYTES + 3);
    }
}
