//! A restore reads each segment once: what it brought into the page cache is
//! given back when it leaves the segment, and what was cached before it came
//! (a broker's or writer's recent data, another reader's) stays.
//!
//! Without this a large restore fills the page cache with a log it will not
//! read again, and pushes out what it reads next: a bulk restore of 100M
//! records (a 12 GiB log, 11 GiB of spilled runs on a 24 GiB machine) took
//! 90-92 s with the log left cached and 74-75 s with it given back, its runs
//! then still cached when merged (benches/notes.md).

use std::fs::File;
use std::os::unix::io::AsRawFd;

/// Which pages of a file were in the page cache when a reader opened it.
pub struct CacheFootprint {
    /// One byte per page: bit 0 set when the page was resident.
    resident: Vec<u8>,
    page: u64,
    /// The file's length then: a page past it is left alone (a writer's).
    len: u64,
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

impl CacheFootprint {
    /// The pages of `file` in the page cache now, or `None` when that cannot
    /// be told (an empty file, a failed `mmap` or `mincore`): nothing is then
    /// given back.
    pub fn of(file: &File) -> Option<Self> {
        let len = file.metadata().ok()?.len();
        let size = usize::try_from(len).ok().filter(|&n| n > 0)?;
        let page = page_size();
        let pages = len.div_ceil(page) as usize;
        // SAFETY: a read-only shared mapping of an open file, never touched
        // (mincore reads the page tables of the cache, not the pages), unmapped
        // before returning.
        unsafe {
            let addr = libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0);
            if addr == libc::MAP_FAILED {
                return None;
            }
            let mut resident = vec![0u8; pages];
            let r = libc::mincore(addr, size, resident.as_mut_ptr());
            libc::munmap(addr, size);
            (r == 0).then_some(CacheFootprint { resident, page, len })
        }
    }

    /// Give back to the kernel the pages of `file` below byte `upto` that
    /// were not cached when the footprint was taken (read since, by this
    /// reader or its read-ahead). Advice only: a failure changes nothing.
    pub fn give_back(&self, file: &File, upto: u64) {
        // Within the footprint's pages: `upto` is bounded by the length they cover.
        let last = upto.min(self.len).div_ceil(self.page) as usize;
        let fd = file.as_raw_fd();
        let mut i = 0;
        while i < last {
            if self.resident[i] & 1 == 1 {
                i += 1;
                continue;
            }
            let from = i;
            while i < last && self.resident[i] & 1 == 0 {
                i += 1;
            }
            let (off, n) = (from as u64 * self.page, (i - from) as u64 * self.page);
            // SAFETY: advice on an open descriptor; ranges past the end are ignored by the kernel.
            unsafe {
                libc::posix_fadvise(fd, off as libc::off_t, n as libc::off_t, libc::POSIX_FADV_DONTNEED);
            }
        }
    }

    /// Pages that were cached when the footprint was taken.
    pub fn resident_pages(&self) -> usize {
        self.resident.iter().filter(|&&b| b & 1 == 1).count()
    }
}

/// Drop every clean page of `file` from the page cache (tests start from a cold file).
#[cfg(test)]
pub fn evict(file: &File) {
    file.sync_all().unwrap();
    // SAFETY: advice on an open descriptor.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// A synced file of `pages` pages, out of the page cache.
    fn uncached_file(dir: &std::path::Path, pages: usize) -> File {
        let p = dir.join("f");
        let mut f = File::create(&p).unwrap();
        f.write_all(&vec![7u8; pages * page_size() as usize]).unwrap();
        let f = File::open(&p).unwrap();
        evict(&f);
        let cached = CacheFootprint::of(&f).unwrap().resident_pages();
        assert_eq!(cached, 0, "the file system keeps pages cached (tmpfs does): this test needs one that drops them");
        f
    }

    #[test]
    fn what_a_reader_brought_in_is_given_back_and_what_was_cached_stays() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let mut f = uncached_file(dir.path(), 64);
        let page = page_size() as usize;
        // pages 0-7 (and what the kernel reads ahead of them) cached before the reader comes
        let mut buf = vec![0u8; 8 * page];
        f.read_exact(&mut buf).unwrap();
        let before = CacheFootprint::of(&f).unwrap();
        assert!((8..48).contains(&before.resident_pages()), "{}", before.resident_pages());
        // the reader reads everything, then gives back what it read below page 48
        let mut rest = Vec::new();
        f.read_to_end(&mut rest).unwrap();
        assert_eq!(CacheFootprint::of(&f).unwrap().resident_pages(), 64);
        before.give_back(&f, 48 * page as u64);
        let after = CacheFootprint::of(&f).unwrap();
        assert_eq!(after.resident[..48], before.resident[..48], "below 48: as found");
        assert!(after.resident[48..].iter().all(|&b| b & 1 == 1), "not yet left: kept");
    }

    #[test]
    fn an_empty_file_has_no_footprint() {
        let dir = tempfile::tempdir().unwrap();
        let f = File::create(dir.path().join("e")).unwrap();
        assert!(CacheFootprint::of(&f).is_none());
    }
}
