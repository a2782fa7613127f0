//! Syncs deferred to the end of a job: the stores a restore job creates are
//! made durable once, together, instead of file by file.
//!
//! RocksDB syncs a new database a dozen times and more: creating it (IDENTITY,
//! two MANIFESTs, CURRENT, OPTIONS, each with its directory), ingesting a
//! table file, flushing the table that records the offset. For a job of
//! hundreds of small new stores those syncs, not the records, are most of the
//! time. A new store needs none of them one by one: until its job ends nobody
//! reads it, and a crash of the process loses nothing the kernel holds. Only
//! a crash of the machine can, and that is what the marker is for.
//!
//! [`DeferredSyncs::begin`] writes a marker beside each new store
//! (`.<store>.unsynced`, holding this boot's id), makes the markers durable
//! with one `syncfs`, and from then on the `fsync`s and `fdatasync`s of files
//! inside those stores return at once. [`DeferredSyncs::finish`] stops
//! deferring, syncs each file system once, then removes the markers. A marker
//! is therefore on disk whenever a store may hold files that are not, and
//! [`recover`] finds it before the store is used again: left by this boot
//! (the process died, the kernel kept every write), the store is synced and
//! kept; left by an earlier boot (the machine went down), the store may have
//! lost any write, and it is wiped to be restored from the changelog's start.
//!
//! The syncs are deferred where they are called: the crate is linked with
//! `--wrap=fsync --wrap=fdatasync` (see `build.rs`), so every call of
//! either in the extension (RocksDB's, the standard library's) goes through
//! [`__wrap_fsync`] and [`__wrap_fdatasync`]. While no job defers, they make
//! the system call at once; while one does, they look up which file the
//! descriptor names (`/proc/self/fd`) and skip the sync when it lies inside a
//! deferred store.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{OnceLock, RwLock};

use super::{hidden_sibling, parent_of, FileIoError};

/// The stores whose syncs are deferred, by their canonical paths.
static DEFERRED: RwLock<Option<HashSet<PathBuf>>> = RwLock::new(None);
/// How many stores are in [`DEFERRED`]: while 0, a sync is never looked up.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Syncs skipped since the process started (a test's evidence that RocksDB's
/// syncs pass through here).
static SKIPPED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Syncs skipped on this thread.
    static SKIPPED_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Syncs of files inside deferred stores skipped so far in this process.
pub fn skipped_syncs() -> u64 {
    SKIPPED.load(Ordering::Relaxed)
}

/// Of [`skipped_syncs`], those skipped on the calling thread.
pub fn skipped_syncs_here() -> u64 {
    SKIPPED_HERE.with(|c| c.get())
}

/// The id of the running boot of the machine (`None` where the kernel does
/// not tell it: then nothing is deferred, as a marker could not be judged).
pub fn boot_id() -> Option<&'static str> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    })
    .as_deref()
}

/// The marker of `store`: `.<store name>.unsynced` beside it (beside, so the
/// store's own directory holds only what RocksDB wrote).
pub fn marker_of(store: &Path) -> PathBuf {
    hidden_sibling(store, ".unsynced")
}

/// `store` with its parent directory's canonical path (the store itself may
/// not exist yet), as `/proc/self/fd` names the files inside it.
fn canonical(store: &Path) -> Option<PathBuf> {
    Some(fs::canonicalize(parent_of(store)).ok()?.join(store.file_name()?))
}

/// Whether a sync of `fd` is to be skipped: it names a file inside a store
/// whose syncs are deferred.
fn skips(fd: libc::c_int) -> bool {
    if ACTIVE.load(Ordering::Acquire) == 0 {
        return false;
    }
    let link = format!("/proc/self/fd/{fd}\0");
    let mut buf = [0u8; 4096];
    // SAFETY: `link` is NUL-terminated and `buf` is writable for its length.
    let n = unsafe { libc::readlink(link.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    if n <= 0 || n as usize >= buf.len() {
        return false;
    }
    let path = Path::new(OsStr::from_bytes(&buf[..n as usize]));
    let deferred = DEFERRED.read().unwrap_or_else(|p| p.into_inner());
    let Some(stores) = deferred.as_ref() else { return false };
    let skip = path.ancestors().any(|a| stores.contains(a));
    if skip {
        SKIPPED.fetch_add(1, Ordering::Relaxed);
        SKIPPED_HERE.with(|c| c.set(c.get() + 1));
    }
    skip
}

extern "C" {
    /// The C library's `fsync` (or an `LD_PRELOAD` library's, as the fault
    /// tests' shim is), which the linker names so under `--wrap=fsync`.
    fn __real_fsync(fd: libc::c_int) -> libc::c_int;
    /// The C library's `fdatasync`, likewise.
    fn __real_fdatasync(fd: libc::c_int) -> libc::c_int;
}

/// `fsync` as the extension sees it (the linker's `--wrap=fsync`): skipped
/// for a file inside a deferred store, else the C library's.
#[no_mangle]
pub extern "C" fn __wrap_fsync(fd: libc::c_int) -> libc::c_int {
    if skips(fd) {
        return 0;
    }
    // SAFETY: the C library's function, called as the caller called it.
    unsafe { __real_fsync(fd) }
}

/// `fdatasync` as the extension sees it (the linker's `--wrap=fdatasync`).
#[no_mangle]
pub extern "C" fn __wrap_fdatasync(fd: libc::c_int) -> libc::c_int {
    if skips(fd) {
        return 0;
    }
    // SAFETY: as above.
    unsafe { __real_fdatasync(fd) }
}

/// Write back everything of the file system holding `dir` (`syncfs`).
fn sync_file_system(dir: &Path) -> Result<(), FileIoError> {
    FileSystem::open(dir)?.sync()
}

/// A file system the stores of a job are on, through a directory of it held
/// open for the whole job: Linux reports a writeback error to `syncfs` once
/// per open file, from when that file was opened, so an error while the job's
/// syncs are skipped reaches this job's last `syncfs` even if another
/// process's `syncfs` saw it first.
struct FileSystem {
    dir: PathBuf,
    handle: File,
}

impl FileSystem {
    fn open(dir: &Path) -> Result<Self, FileIoError> {
        let handle = File::open(dir).map_err(|e| FileIoError::new("open directory", dir, e))?;
        Ok(Self { dir: dir.to_path_buf(), handle })
    }

    fn sync(&self) -> Result<(), FileIoError> {
        // SAFETY: `handle` is an open descriptor for the call's duration.
        if unsafe { libc::syncfs(self.handle.as_raw_fd()) } != 0 {
            return Err(FileIoError::new("syncfs", &self.dir, io::Error::last_os_error()));
        }
        Ok(())
    }
}

/// One open directory per file system among `dirs`.
fn file_systems<'a>(dirs: impl Iterator<Item = &'a Path>) -> Result<Vec<FileSystem>, FileIoError> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for dir in dirs {
        let dev = fs::metadata(dir).map_err(|e| FileIoError::new("stat", dir, e))?.dev();
        if seen.insert(dev) {
            found.push(FileSystem::open(dir)?);
        }
    }
    Ok(found)
}

/// Sync each of `file_systems`; the first failure, after trying them all.
fn sync_all(file_systems: &[FileSystem]) -> Result<(), FileIoError> {
    let mut first = Ok(());
    for fs in file_systems {
        if let Err(e) = fs.sync() {
            first = first.and(Err(e));
        }
    }
    first
}

/// One deferred store: the path it was given by, its canonical path, its
/// scratch directory's and its marker.
struct Deferred {
    given: PathBuf,
    store: PathBuf,
    scratch: PathBuf,
    marker: PathBuf,
}

/// The stores of one job whose syncs are deferred until [`finish`](Self::finish).
#[must_use = "finish makes the stores durable"]
pub struct DeferredSyncs {
    stores: Vec<Deferred>,
    /// The file systems the stores are on, open since before their markers were synced.
    file_systems: Vec<FileSystem>,
    finished: bool,
}

impl DeferredSyncs {
    /// Defer the syncs of `stores` (stores that do not exist yet) and of the
    /// scratch directory `scratch` names for each (where a restore writes
    /// files it then moves into the store): write their markers, make the
    /// markers durable, then register the stores. A store whose parent
    /// directory does not exist, or whose marker cannot be written, is left
    /// out (its syncs happen as usual); if the markers cannot be made durable
    /// nothing is deferred.
    pub fn begin<'a>(stores: impl IntoIterator<Item = &'a Path>, scratch: impl Fn(&Path) -> PathBuf) -> DeferredSyncs {
        let mut none = DeferredSyncs { stores: Vec::new(), file_systems: Vec::new(), finished: true };
        let Some(boot) = boot_id() else { return none };
        for given in stores {
            let Some(store) = canonical(given) else { continue };
            let marker = marker_of(&store);
            if fs::write(&marker, boot).is_ok() {
                none.stores.push(Deferred { given: given.to_path_buf(), scratch: scratch(&store), store, marker });
            }
        }
        if none.stores.is_empty() {
            return none;
        }
        match file_systems(none.stores.iter().map(|d| parent_of(&d.marker))) {
            Ok(found) if sync_all(&found).is_ok() => none.file_systems = found,
            _ => {
                none.remove_markers();
                return none;
            }
        }
        let mut deferred = DEFERRED.write().unwrap_or_else(|p| p.into_inner());
        let set = deferred.get_or_insert_with(HashSet::new);
        // A store another job of this process defers already is left to it.
        none.stores.retain(|d| !set.contains(&d.store));
        set.extend(none.stores.iter().flat_map(|d| [d.store.clone(), d.scratch.clone()]));
        ACTIVE.fetch_add(none.stores.len(), Ordering::AcqRel);
        none.finished = false;
        none
    }

    /// This job's deferred stores, as [`begin`](Self::begin) was given them.
    pub fn stores(&self) -> impl Iterator<Item = &Path> {
        self.stores.iter().map(|d| d.given.as_path())
    }

    /// How many stores this job defers.
    pub fn len(&self) -> usize {
        self.stores.len()
    }

    /// Whether this job defers no store.
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }

    /// Stop deferring, sync each file system the stores are on, then remove
    /// the markers. On a failed sync each marker is rewritten to say so
    /// ([`Marker::SyncFailed`]): the next restore of each store wipes it, as
    /// any of its writes may be lost; the error names the directory.
    pub fn finish(mut self) -> Result<(), FileIoError> {
        self.finish_now()
    }

    fn finish_now(&mut self) -> Result<(), FileIoError> {
        if std::mem::replace(&mut self.finished, true) {
            return Ok(());
        }
        // Deregister first: a sync called after this is made, so whatever was
        // written before it is covered by the file-system syncs below.
        {
            let mut deferred = DEFERRED.write().unwrap_or_else(|p| p.into_inner());
            if let Some(set) = deferred.as_mut() {
                for d in &self.stores {
                    set.remove(&d.store);
                    set.remove(&d.scratch);
                }
            }
            ACTIVE.fetch_sub(self.stores.len(), Ordering::AcqRel);
        }
        if let Err(e) = sync_all(&self.file_systems) {
            for d in &self.stores {
                // Best effort: a marker left as it was still makes the store synced or wiped.
                let _ = fs::write(&d.marker, SYNC_FAILED);
            }
            return Err(e);
        }
        self.remove_markers();
        Ok(())
    }

    fn remove_markers(&mut self) {
        for d in self.stores.drain(..) {
            let _ = fs::remove_file(&d.marker);
        }
    }
}

impl Drop for DeferredSyncs {
    /// A job that ends without [`finish`](Self::finish) (a panic) still
    /// stops deferring and syncs; a failure leaves the markers.
    fn drop(&mut self) {
        let _ = self.finish_now();
    }
}

/// The marker [`DeferredSyncs::begin`] may have left beside a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// None (or one a job of this process is using right now).
    Absent,
    /// Left by this boot: the process that restored the store died, and the
    /// kernel kept every write it made.
    ThisBoot,
    /// Left by an earlier boot: the machine went down while the store was
    /// restored, and any of its writes may be lost.
    EarlierBoot,
    /// Left by a job whose last sync failed: the kernel may have dropped any
    /// of the store's writes.
    SyncFailed,
}

/// What a marker holds once its job's last sync failed (a boot id never is this).
const SYNC_FAILED: &str = "sync failed";

/// Which marker lies beside `store`.
pub fn marker_state(store: &Path) -> Result<Marker, FileIoError> {
    let marker = marker_of(store);
    let written = match fs::read(&marker) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Marker::Absent),
        Err(e) => return Err(FileIoError::new("read", &marker, e)),
    };
    if ACTIVE.load(Ordering::Acquire) > 0 {
        let deferred = DEFERRED.read().unwrap_or_else(|p| p.into_inner());
        if canonical(store).is_some_and(|c| deferred.as_ref().is_some_and(|s| s.contains(&c))) {
            return Ok(Marker::Absent);
        }
    }
    Ok(if written == SYNC_FAILED.as_bytes() {
        Marker::SyncFailed
    } else if boot_id().is_some_and(|b| written == b.as_bytes()) {
        Marker::ThisBoot
    } else {
        Marker::EarlierBoot
    })
}

/// What [`recover`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing: no marker.
    Clean,
    /// A marker of this boot: the store was synced and is kept.
    Synced,
    /// A marker of an earlier boot or of a failed sync: the store was wiped.
    Wiped,
}

/// Deal with a marker [`DeferredSyncs::begin`] left beside `store` in a job
/// that did not finish (see the module docs and [`Marker`]). A store a job of
/// this process defers right now is left alone.
pub fn recover(store: &Path) -> Result<Recovery, FileIoError> {
    let dir = parent_of(store);
    let found = match marker_state(store)? {
        Marker::Absent => return Ok(Recovery::Clean),
        Marker::ThisBoot => {
            sync_file_system(dir)?;
            Recovery::Synced
        }
        Marker::EarlierBoot | Marker::SyncFailed => {
            match fs::remove_dir_all(store) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(FileIoError::new("wipe", store, e)),
            }
            super::fsync_dir(dir)?;
            Recovery::Wiped
        }
    };
    let marker = marker_of(store);
    fs::remove_file(&marker).map_err(|e| FileIoError::new("remove", &marker, e))?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn synced(path: &Path) -> u64 {
        let before = skipped_syncs_here();
        let mut f = fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        f.write_all(b"x").unwrap();
        f.sync_all().unwrap();
        f.sync_data().unwrap();
        skipped_syncs_here() - before
    }

    #[test]
    fn syncs_inside_a_deferred_store_are_skipped_until_the_job_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, other) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("other"));
        let job = DeferredSyncs::begin([a.as_path(), b.as_path()], |s| s.with_extension("scratch"));
        assert_eq!(job.len(), 2);
        assert_eq!(job.stores().collect::<Vec<_>>(), [a.as_path(), b.as_path()]);
        for s in [&a, &b] {
            assert_eq!(fs::read_to_string(marker_of(s)).unwrap(), boot_id().unwrap());
        }
        fs::create_dir_all(a.join("segment")).unwrap();
        fs::create_dir_all(&other).unwrap();
        fs::create_dir_all(a.with_extension("scratch")).unwrap();
        // The standard library's syncs pass through the wrappers too: a file
        // inside a deferred store (at any depth) is skipped, others are not.
        assert!(synced(&a.join("segment").join("f")) >= 2);
        assert!(synced(&a.with_extension("scratch").join("f")) >= 2);
        assert_eq!(synced(&other.join("f")), 0);
        // A marker of a store this process defers is left for its job.
        assert_eq!(marker_state(&a).unwrap(), Marker::Absent);
        assert_eq!(recover(&a).unwrap(), Recovery::Clean);
        assert!(marker_of(&a).exists());
        job.finish().unwrap();
        assert!(!marker_of(&a).exists() && !marker_of(&b).exists());
        assert_eq!(synced(&a.join("segment").join("f")), 0);
    }

    #[test]
    fn a_marker_of_this_boot_keeps_the_store_and_one_of_another_boot_wipes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, older, clean) = (dir.path().join("mine"), dir.path().join("older"), dir.path().join("clean"));
        for s in [&mine, &older, &clean] {
            fs::create_dir_all(s).unwrap();
            fs::write(s.join("CURRENT"), "MANIFEST-000001\n").unwrap();
        }
        fs::write(marker_of(&mine), boot_id().unwrap()).unwrap();
        fs::write(marker_of(&older), "00000000-0000-0000-0000-000000000000").unwrap();
        assert_eq!(marker_state(&mine).unwrap(), Marker::ThisBoot);
        assert_eq!(marker_state(&older).unwrap(), Marker::EarlierBoot);
        assert_eq!(marker_state(&clean).unwrap(), Marker::Absent);
        assert_eq!(recover(&mine).unwrap(), Recovery::Synced);
        assert!(mine.join("CURRENT").exists() && !marker_of(&mine).exists());
        assert_eq!(recover(&older).unwrap(), Recovery::Wiped);
        assert!(!older.exists() && !marker_of(&older).exists());
        assert_eq!(recover(&clean).unwrap(), Recovery::Clean);
        assert!(clean.join("CURRENT").exists());
        // A marker whose store never got a file: nothing to wipe.
        fs::write(marker_of(&older), "an earlier boot").unwrap();
        assert_eq!(recover(&older).unwrap(), Recovery::Wiped);
        assert!(!marker_of(&older).exists());
    }
}
