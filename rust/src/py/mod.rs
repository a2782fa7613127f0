//! PyO3 bindings, one file per domain. Each `register` adds that domain's
//! functions and classes to `statestore._native`. Bindings convert arguments,
//! release the GIL around the work, and map errors to the classes of
//! `statestore.errors`; they hold no logic of their own.

pub mod feed;
pub mod fileio;
pub mod kafka;
pub mod log;
pub mod restore;
pub mod store;

use pyo3::prelude::*;
use pyo3::types::PyType;

/// Build an exception of class `statestore.errors.<class>` with `message`.
///
/// The classes live in Python so that there is one hierarchy for the whole
/// library; if the module cannot be imported (a broken install) the import
/// error itself is returned, which names the problem.
pub fn error(class: &str, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| {
        let cls = py
            .import("statestore.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
        match cls {
            Ok(cls) => PyErr::from_type(cls, (message,)),
            Err(e) => e,
        }
    })
}
