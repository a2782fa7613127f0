//! Atomic file operations: the only ways statestore replaces a file or a
//! directory that must survive a crash.
//!
//! [`atomic_write`]: the new contents go to a temporary sibling, are fsynced,
//! renamed over the target, and the directory is fsynced so the rename itself
//! is durable. A reader therefore sees either the old file or the new one,
//! never a mix. The parent directory is never created: a missing directory
//! means the owner of the file is gone (e.g. the cleaner removed a task
//! directory), and writing anyway would resurrect it.
//!
//! [`replace_dir`] swaps a whole directory (a store restored in a staging
//! directory) into place, atomically where the filesystem can exchange two
//! paths (`renameat2(RENAME_EXCHANGE)`), else by two renames whose
//! interruption leaves the old directory at a known place for the next
//! attempt to put back. [`link_copy_dir`] copies a closed RocksDB directory
//! cheaply: its immutable SST and blob files are hard-linked.
//!
//! [`deferred`] defers the syncs of the stores a restore job creates to one
//! sync at the job's end, with a marker that tells a later restore whether the
//! machine went down before it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(feature = "store")]
pub mod deferred;

/// An I/O failure on a named file.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
pub struct FileIoError {
    /// What was being done ("write", "rename", ...).
    pub op: &'static str,
    /// The file or directory it was done to.
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

impl FileIoError {
    fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        Self { op, path: path.to_path_buf(), source }
    }

    /// The OS error kind, so callers can tell "no such directory" from "disk full".
    pub fn kind(&self) -> io::ErrorKind {
        self.source.kind()
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

const TMP_SUFFIX: &str = ".tmp";

/// A hidden sibling of `path`, `.<name><suffix>` in the same directory (the
/// same file system, so files move between them by rename; a dot file, so
/// listings of stores pass it by).
pub fn hidden_sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = std::ffi::OsString::from(".");
    name.push(path.file_name().unwrap_or_else(|| std::ffi::OsStr::new("store")));
    name.push(suffix);
    parent_of(path).join(name)
}

/// The directory holding `path`: its parent, or `.` for a bare relative name.
pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Temporary name `<file>.<pid>.<seq>.tmp`: unique per writer, so concurrent
/// writers never share a temp file and a leftover from a crash never blocks a
/// later write.
fn temp_path(path: &Path) -> Result<PathBuf, FileIoError> {
    let name = path.file_name().ok_or_else(|| {
        FileIoError::new("write", path, io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))
    })?;
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut tmp = name.to_os_string();
    tmp.push(format!(".{}.{}{}", std::process::id(), seq, TMP_SUFFIX));
    Ok(parent_of(path).join(tmp))
}

/// fsync a directory so that a rename inside it is durable.
pub fn fsync_dir(dir: &Path) -> Result<(), FileIoError> {
    let d = File::open(dir).map_err(|e| FileIoError::new("open directory", dir, e))?;
    d.sync_all().map_err(|e| FileIoError::new("fsync directory", dir, e))
}

/// Replace `path` with `data` atomically and durably.
///
/// Fails (without creating anything) when the parent directory does not
/// exist. On any failure the previous contents of `path` are untouched and the
/// temporary file is removed.
pub fn atomic_write(path: &Path, data: &[u8]) -> Result<(), FileIoError> {
    let dir = parent_of(path);
    if !dir.is_dir() {
        return Err(FileIoError::new(
            "write",
            path,
            io::Error::new(io::ErrorKind::NotFound, format!("No such file or directory: {}", dir.display())),
        ));
    }
    let tmp = temp_path(path)?;
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| FileIoError::new("create", &tmp, e))?;
        f.write_all(data).map_err(|e| FileIoError::new("write", &tmp, e))?;
        f.sync_all().map_err(|e| FileIoError::new("fsync", &tmp, e))?;
        drop(f);
        fs::rename(&tmp, path).map_err(|e| FileIoError::new("rename", path, e))?;
        fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    } else {
        sweep_stale_temps(path);
    }
    result
}

/// Remove temp files of `path` left by writers that no longer run (a crash
/// between create and rename). Best effort: failures are ignored because a
/// leftover temp file is harmless, only untidy.
fn sweep_stale_temps(path: &Path) {
    let (Some(name), Ok(entries)) = (path.file_name().and_then(|n| n.to_str()), fs::read_dir(parent_of(path))) else {
        return;
    };
    let prefix = format!("{name}.");
    for entry in entries.flatten() {
        let fname = entry.file_name();
        let Some(fname) = fname.to_str() else { continue };
        let Some(middle) = fname.strip_prefix(&prefix).and_then(|r| r.strip_suffix(TMP_SUFFIX)) else {
            continue;
        };
        let Some(pid) = middle.split('.').next().and_then(|p| p.parse::<i32>().ok()) else { continue };
        if !process_alive(pid) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn process_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Atomically exchange two existing paths (`renameat2(RENAME_EXCHANGE)`).
///
/// Returns `Ok(false)`, touching nothing, where the kernel or filesystem
/// cannot exchange (and on systems other than Linux).
pub fn exchange(a: &Path, b: &Path) -> Result<bool, FileIoError> {
    #[cfg(target_os = "linux")]
    {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| {
            CString::new(p.as_os_str().as_bytes())
                .map_err(|e| FileIoError::new("exchange", p, io::Error::new(io::ErrorKind::InvalidInput, e)))
        };
        let (ca, cb) = (c(a)?, c(b)?);
        // SAFETY: both are valid NUL-terminated paths that live across the call.
        let rc =
            unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), libc::RENAME_EXCHANGE) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => Ok(false),
            _ => Err(FileIoError::new("exchange", a, err)),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (a, b);
        Ok(false)
    }
}

/// How [`replace_dir`] put the new directory in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    /// There was nothing at the target: one rename.
    Renamed,
    /// The two paths were exchanged atomically: the old directory is now at the staged path.
    Exchanged,
    /// Two renames: the old directory is now at the `aside` path.
    MovedAside,
}

/// Make the directory `staged` the directory at `target`, durably.
///
/// With nothing at `target`, one rename. Else an atomic exchange where the
/// filesystem has it (the old directory ends at `staged`), or two renames
/// (the old directory ends at `aside`; a crash between them leaves no
/// `target` and the old directory at `aside`, which the caller's next
/// attempt puts back). The parent of `target` is fsynced either way.
pub fn replace_dir(staged: &Path, target: &Path, aside: &Path) -> Result<Replaced, FileIoError> {
    let how = if fs::symlink_metadata(target).is_err() {
        fs::rename(staged, target).map_err(|e| FileIoError::new("rename", target, e))?;
        Replaced::Renamed
    } else if exchange(staged, target)? {
        Replaced::Exchanged
    } else {
        move_aside_then_rename(staged, target, aside)?;
        Replaced::MovedAside
    };
    fsync_dir(parent_of(target))?;
    Ok(how)
}

/// The two renames of [`replace_dir`] where the filesystem cannot exchange.
/// A second rename that fails puts the old directory back at `target` (best
/// effort), so a failed swap leaves the store that was there, never nothing:
/// the caller removes `aside` with its attempt.
fn move_aside_then_rename(staged: &Path, target: &Path, aside: &Path) -> Result<(), FileIoError> {
    fs::rename(target, aside).map_err(|e| FileIoError::new("rename", target, e))?;
    if let Err(e) = fs::rename(staged, target) {
        let _ = fs::rename(aside, target);
        return Err(FileIoError::new("rename", staged, e));
    }
    Ok(())
}

/// Copy the closed RocksDB directory `src` (or a directory of them: a
/// segmented store) to the new directory `dst`.
///
/// SST and blob files are immutable once written, so they are hard-linked
/// (copied where linking fails, e.g. across filesystems); every other file is
/// copied, subdirectories recursively (a RocksDB among them linked alike);
/// RocksDB's `LOCK` file is left out.
/// `dst` must not exist; its parent must. The new directory is fsynced, so
/// the links it holds are durable.
pub fn link_copy_dir(src: &Path, dst: &Path) -> Result<(), FileIoError> {
    fs::create_dir(dst).map_err(|e| FileIoError::new("create directory", dst, e))?;
    for entry in fs::read_dir(src).map_err(|e| FileIoError::new("read directory", src, e))? {
        let entry = entry.map_err(|e| FileIoError::new("read directory", src, e))?;
        let name = entry.file_name();
        let (from, to) = (entry.path(), dst.join(&name));
        let kind = entry.file_type().map_err(|e| FileIoError::new("stat", &from, e))?;
        if name == "LOCK" {
            continue;
        }
        if kind.is_dir() {
            // a segmented store's segments are RocksDBs of their own: linked alike
            if from.join("CURRENT").is_file() {
                link_copy_dir(&from, &to)?;
            } else {
                copy_tree(&from, &to)?;
            }
            continue;
        }
        let immutable = name.to_str().is_some_and(|n| n.ends_with(".sst") || n.ends_with(".blob"));
        if !(immutable && fs::hard_link(&from, &to).is_ok()) {
            fs::copy(&from, &to).map_err(|e| FileIoError::new("copy", &from, e))?;
        }
    }
    fsync_dir(dst)
}

fn copy_tree(src: &Path, dst: &Path) -> Result<(), FileIoError> {
    fs::create_dir(dst).map_err(|e| FileIoError::new("create directory", dst, e))?;
    for entry in fs::read_dir(src).map_err(|e| FileIoError::new("read directory", src, e))? {
        let entry = entry.map_err(|e| FileIoError::new("read directory", src, e))?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        if entry.file_type().map_err(|e| FileIoError::new("stat", &from, e))?.is_dir() {
            copy_tree(&from, &to)?;
        } else {
            fs::copy(&from, &to).map_err(|e| FileIoError::new("copy", &from, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        atomic_write(&p, b"one").unwrap();
        atomic_write(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "no temp file left: {names:?}");
    }

    #[test]
    fn missing_parent_is_an_error_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("gone").join("f");
        let err = atomic_write(&p, b"x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("No such file or directory"));
        assert!(!dir.path().join("gone").exists());
    }

    #[test]
    fn stale_temp_of_dead_writer_is_swept_and_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        // pid 0 is never a live writer
        let stale = dir.path().join("f.0.7.tmp");
        fs::write(&stale, b"partial").unwrap();
        atomic_write(&p, b"new").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert!(!stale.exists());
    }

    fn dir_with(root: &Path, name: &str, file: &str) -> PathBuf {
        let d = root.join(name);
        fs::create_dir(&d).unwrap();
        fs::write(d.join("CURRENT"), file).unwrap();
        d
    }

    #[test]
    fn a_failed_second_rename_puts_the_old_directory_back() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir_with(dir.path(), "store", "one");
        let (missing, aside) = (dir.path().join("staged-gone"), dir.path().join("aside"));
        let err = move_aside_then_rename(&missing, &target, &aside).unwrap_err();
        assert!(err.to_string().contains("staged-gone"), "{err}");
        assert_eq!(fs::read_to_string(target.join("CURRENT")).unwrap(), "one");
        assert!(!aside.exists());
    }

    #[test]
    fn replace_dir_swaps_and_keeps_the_old_one_reachable() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("store");
        let first = dir_with(dir.path(), "a", "one");
        assert_eq!(replace_dir(&first, &target, &dir.path().join("aside")).unwrap(), Replaced::Renamed);
        let second = dir_with(dir.path(), "b", "two");
        let how = replace_dir(&second, &target, &dir.path().join("aside")).unwrap();
        assert_eq!(fs::read_to_string(target.join("CURRENT")).unwrap(), "two");
        let old = match how {
            Replaced::Exchanged => second,
            Replaced::MovedAside => dir.path().join("aside"),
            Replaced::Renamed => panic!("the target existed"),
        };
        assert_eq!(fs::read_to_string(old.join("CURRENT")).unwrap(), "one");
    }

    #[test]
    fn exchange_of_a_missing_path_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir_with(dir.path(), "a", "x");
        let missing = dir.path().join("missing");
        match exchange(&a, &missing) {
            Ok(false) => {} // no exchange on this filesystem: nothing was touched
            Ok(true) => panic!("exchanged with a missing path"),
            Err(e) => assert!(e.to_string().contains("exchange"), "{e}"),
        }
        assert!(a.join("CURRENT").exists());
    }

    #[test]
    fn link_copy_links_immutable_files_copies_the_rest_and_skips_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir_with(dir.path(), "src", "MANIFEST-1");
        fs::write(src.join("000007.sst"), b"table").unwrap();
        fs::write(src.join("LOCK"), b"").unwrap();
        fs::create_dir(src.join("sub")).unwrap();
        fs::write(src.join("sub").join("x"), b"nested").unwrap();
        let dst = dir.path().join("dst");
        link_copy_dir(&src, &dst).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            fs::metadata(src.join("000007.sst")).unwrap().ino(),
            fs::metadata(dst.join("000007.sst")).unwrap().ino()
        );
        assert_ne!(fs::metadata(src.join("CURRENT")).unwrap().ino(), fs::metadata(dst.join("CURRENT")).unwrap().ino());
        assert_eq!(fs::read(dst.join("sub").join("x")).unwrap(), b"nested");
        assert!(!dst.join("LOCK").exists());
        assert!(link_copy_dir(&src, &dst).is_err(), "an existing destination is refused");
    }
}
