//! Binding of [`crate::fileio`].

use std::io::ErrorKind;
use std::path::PathBuf;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyPermissionError};
use pyo3::prelude::*;

use crate::fileio::deferred::{self, Marker, Recovery};
use crate::fileio::{self, FileIoError, Replaced};

/// The OS error as its Python class (`FileNotFoundError`, `PermissionError`, else `OSError`), message naming the path.
fn to_py(e: FileIoError) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
        _ => PyOSError::new_err(msg),
    }
}

/// Replace the file at `path` with `data` atomically and durably: temp file in
/// the same directory, write, fsync, rename over the target, fsync the
/// directory. The parent directory is never created. The GIL is released.
#[pyfunction]
fn atomic_write(py: Python<'_>, path: PathBuf, data: &[u8]) -> PyResult<()> {
    py.detach(|| fileio::atomic_write(&path, data)).map_err(to_py)
}

/// fsync the directory at `path`, so that renames and links inside it are durable.
#[pyfunction]
fn fsync_dir(py: Python<'_>, path: PathBuf) -> PyResult<()> {
    py.detach(|| fileio::fsync_dir(&path)).map_err(to_py)
}

/// Make directory `staged` the directory at `target` durably: a rename when
/// nothing is there, else an atomic exchange (the old one ends at `staged`)
/// or, where the filesystem cannot exchange, two renames (the old one ends at
/// `aside`). Returns `"renamed"`, `"exchanged"` or `"moved_aside"`. The GIL is released.
#[pyfunction]
fn replace_dir(py: Python<'_>, staged: PathBuf, target: PathBuf, aside: PathBuf) -> PyResult<&'static str> {
    let how = py.detach(|| fileio::replace_dir(&staged, &target, &aside)).map_err(to_py)?;
    Ok(match how {
        Replaced::Renamed => "renamed",
        Replaced::Exchanged => "exchanged",
        Replaced::MovedAside => "moved_aside",
    })
}

/// Copy the closed RocksDB directory `src` to the new directory `dst`: SST and
/// blob files hard-linked, the rest copied, `LOCK` left out, `dst` fsynced.
/// The GIL is released.
#[pyfunction]
fn link_copy_dir(py: Python<'_>, src: PathBuf, dst: PathBuf) -> PyResult<()> {
    py.detach(|| fileio::link_copy_dir(&src, &dst)).map_err(to_py)
}

/// The marker a restore job that created the store at `path` and deferred
/// its syncs left beside it, if the job did not finish: `None`,
/// `"this_boot"` (the process died; every write is in the kernel's hands),
/// `"earlier_boot"` (the machine went down; any write may be lost) or
/// `"sync_failed"` (the job's last sync failed; any write may be lost).
#[pyfunction]
fn unsynced_marker(path: PathBuf) -> PyResult<Option<&'static str>> {
    Ok(match deferred::marker_state(&path).map_err(to_py)? {
        Marker::Absent => None,
        Marker::ThisBoot => Some("this_boot"),
        Marker::EarlierBoot => Some("earlier_boot"),
        Marker::SyncFailed => Some("sync_failed"),
    })
}

/// Deal with that marker as a restore does: `"clean"` (none), `"synced"`
/// (this boot's: the store's file system synced, the store kept) or
/// `"wiped"` (an earlier boot's or a failed sync's: the store removed). The marker is removed.
/// The GIL is released.
#[pyfunction]
fn recover_unsynced(py: Python<'_>, path: PathBuf) -> PyResult<&'static str> {
    Ok(match py.detach(|| deferred::recover(&path)).map_err(to_py)? {
        Recovery::Clean => "clean",
        Recovery::Synced => "synced",
        Recovery::Wiped => "wiped",
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(unsynced_marker, m)?)?;
    m.add_function(wrap_pyfunction!(recover_unsynced, m)?)?;
    m.add_function(wrap_pyfunction!(atomic_write, m)?)?;
    m.add_function(wrap_pyfunction!(fsync_dir, m)?)?;
    m.add_function(wrap_pyfunction!(replace_dir, m)?)?;
    m.add_function(wrap_pyfunction!(link_copy_dir, m)?)?;
    Ok(())
}
