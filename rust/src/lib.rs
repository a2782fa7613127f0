//! statestore's data plane.
//!
//! Each module is one domain of the design: the Kafka record batch codec, the
//! segment log, the native Kafka fetcher, restoring a store from its
//! changelog (the engine, replay and bulk SST restore), atomic file I/O and
//! the store layout shared by all of them. This file only wires them together
//! and, with the `python` feature, binds them as `statestore._native`; there
//! is no logic here.
//!
//! The modules that need RocksDB (`store`, `segments`, `restore`, and `versioned`'s store) are behind the default
//! feature `store`; without it the crate is the codec, the segment log, the
//! Kafka fetcher, the source seam, the offsets encoding and file I/O (what
//! the fuzz targets build).

pub mod codec;
pub mod fileio;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod kafka;
pub mod log;
pub mod offsets;
#[cfg(feature = "store")]
pub mod restore;
#[cfg(feature = "store")]
pub mod segments;
pub mod source;
#[cfg(feature = "store")]
pub mod store;
#[cfg(feature = "store")]
mod threads;
pub mod versioned;

#[cfg(feature = "python")]
mod py;

#[cfg(feature = "python")]
use pyo3::prelude::*;

/// The `statestore._native` extension module.
#[cfg(feature = "python")]
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::fileio::register(m)?;
    py::kafka::register(m)?;
    py::log::register(m)?;
    py::restore::register(m)?;
    py::store::register(m)?;
    py::testing::register(m)?;
    Ok(())
}
