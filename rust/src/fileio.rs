//! Atomic file replacement: the only way statestore writes a file that must
//! survive a crash.
//!
//! The new contents go to a temporary sibling, are fsynced, renamed over the
//! target, and the directory is fsynced so the rename itself is durable. A
//! reader therefore sees either the old file or the new one, never a mix. The
//! parent directory is never created: a missing directory means the owner of
//! the file is gone (e.g. the cleaner removed a task directory), and writing
//! anyway would resurrect it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

fn parent_of(path: &Path) -> &Path {
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
    let (Some(name), Ok(entries)) = (path.file_name().and_then(|n| n.to_str()), fs::read_dir(parent_of(path)))
    else {
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
}
