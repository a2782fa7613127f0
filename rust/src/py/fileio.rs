//! Binding of [`crate::fileio`].

use std::io::ErrorKind;
use std::path::PathBuf;

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyPermissionError};
use pyo3::prelude::*;

use crate::fileio;

/// Replace the file at `path` with `data` atomically and durably: temp file in
/// the same directory, write, fsync, rename over the target, fsync the
/// directory. The parent directory is never created. The GIL is released.
#[pyfunction]
fn atomic_write(py: Python<'_>, path: PathBuf, data: &[u8]) -> PyResult<()> {
    py.detach(|| fileio::atomic_write(&path, data)).map_err(|e| {
        let msg = e.to_string();
        match e.kind() {
            ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
            ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
            _ => PyOSError::new_err(msg),
        }
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(atomic_write, m)?)?;
    Ok(())
}
