//! Running a few pieces of work at once on threads of their own.

use std::sync::OnceLock;

/// The cores this process may run on, asked once: the standard library reads
/// the cgroup's CPU quota files each time (~20 system calls), and a job of
/// 1,024 small stores asked several times a store.
pub(crate) fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `f` of every item, each but the first on a thread of its own (the first on
/// this one), in the items' order. A panic in one is raised here once all
/// have ended. For work split by key range (a bulk restore's sorts, merges,
/// SST files) and for work that waits on the disk (syncs, file removals),
/// which the threads then serve together.
pub(crate) fn side_by_side<I, T, R>(items: I, f: impl Fn(T) -> R + Sync) -> Vec<R>
where
    I: IntoIterator<Item = T>,
    T: Send,
    R: Send,
{
    let mut items = items.into_iter();
    let Some(first) = items.next() else { return Vec::new() };
    let f = &f;
    std::thread::scope(|sc| {
        let others: Vec<_> = items.map(|t| sc.spawn(move || f(t))).collect();
        let mut out = vec![f(first)];
        out.extend(others.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))));
        out
    })
}
