//! The one place where data-plane errors become Python exceptions.
//!
//! Every exception the extension raises is an instance of a class of
//! `statestore.errors` (one hierarchy for the whole library), chosen here from
//! the error's kind, with the fields that module promises -- `path`, `topic`,
//! `partition`, `offset` -- filled from the error so tools need not parse
//! messages.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

use crate::log::{LogError, LogErrorKind};
use crate::restore::{ErrorKind, RestoreError};
use crate::store::StoreError;

/// The classes of `statestore.errors` the data plane raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    Lock,
    Log,
    Unavailable,
    CorruptLog,
    UnsupportedCompression,
    ProducerFenced,
    TransactionState,
    Store,
    StoreCorrupted,
    Restore,
    TaskCorrupted,
}

impl ErrorClass {
    /// Its name in `statestore.errors`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorClass::Lock => "LockError",
            ErrorClass::Log => "LogError",
            ErrorClass::Unavailable => "ChangelogUnavailableError",
            ErrorClass::CorruptLog => "CorruptLogError",
            ErrorClass::UnsupportedCompression => "UnsupportedCompressionError",
            ErrorClass::ProducerFenced => "ProducerFencedError",
            ErrorClass::TransactionState => "TransactionStateError",
            ErrorClass::Store => "StoreError",
            ErrorClass::StoreCorrupted => "StoreCorruptedError",
            ErrorClass::Restore => "RestoreError",
            ErrorClass::TaskCorrupted => "TaskCorruptedError",
        }
    }

    /// An exception of this class with `message` and no fields.
    pub fn err(self, message: impl Into<String>) -> PyErr {
        raise(self, message.into(), &Fields::default())
    }
}

/// What an error is about, where known.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    pub path: Option<PathBuf>,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
}

/// Build the exception. If `statestore.errors` cannot be imported (a broken
/// install) the import error itself is returned, which names the problem.
pub fn raise(class: ErrorClass, message: String, fields: &Fields) -> PyErr {
    Python::attach(|py| {
        let build = || -> PyResult<PyErr> {
            let cls = py.import("statestore.errors")?.getattr(class.name())?.cast_into::<PyType>()?;
            let kw = PyDict::new(py);
            if let Some(p) = &fields.path {
                kw.set_item("path", p.to_string_lossy())?;
            }
            if let Some(t) = &fields.topic {
                kw.set_item("topic", t)?;
            }
            if let Some(p) = fields.partition {
                kw.set_item("partition", p)?;
            }
            if let Some(o) = fields.offset {
                kw.set_item("offset", o)?;
            }
            let exc = cls.call((message,), Some(&kw))?;
            Ok(PyErr::from_value(exc))
        };
        build().unwrap_or_else(|e| e)
    })
}

impl From<LogError> for PyErr {
    fn from(e: LogError) -> PyErr {
        let class = match e.kind {
            LogErrorKind::Corrupt => ErrorClass::CorruptLog,
            LogErrorKind::UnsupportedCompression => ErrorClass::UnsupportedCompression,
            LogErrorKind::Fenced => ErrorClass::ProducerFenced,
            LogErrorKind::TxnState => ErrorClass::TransactionState,
            LogErrorKind::Lock => ErrorClass::Lock,
            LogErrorKind::OutOfRange => ErrorClass::TaskCorrupted,
            LogErrorKind::Unavailable => ErrorClass::Unavailable,
            LogErrorKind::Other => ErrorClass::Log,
        };
        raise(class, e.message, &Fields { path: e.path, offset: e.offset, ..Fields::default() })
    }
}

impl From<StoreError> for PyErr {
    fn from(e: StoreError) -> PyErr {
        // Damaged store files are `StoreCorruptedError` (a `TaskCorruptedError`:
        // wipe and restore the task); anything else is `StoreError`.
        let class = if e.corruption { ErrorClass::StoreCorrupted } else { ErrorClass::Store };
        let message = e.to_string();
        raise(class, message, &Fields { path: Some(e.path), ..Fields::default() })
    }
}

/// The class a restore error is raised as.
pub fn restore_class(kind: ErrorKind) -> ErrorClass {
    match kind {
        ErrorKind::Restore | ErrorKind::Listener => ErrorClass::Restore,
        ErrorKind::Store => ErrorClass::Store,
        ErrorKind::CorruptLog => ErrorClass::CorruptLog,
        ErrorKind::UnsupportedCompression => ErrorClass::UnsupportedCompression,
        ErrorKind::Log => ErrorClass::Log,
        ErrorKind::Unavailable => ErrorClass::Unavailable,
        ErrorKind::OutOfRange => ErrorClass::TaskCorrupted,
        ErrorKind::StoreCorrupted => ErrorClass::StoreCorrupted,
    }
}

impl From<RestoreError> for PyErr {
    fn from(e: RestoreError) -> PyErr {
        let fields = Fields { path: e.path, topic: e.topic, partition: e.partition, offset: e.offset };
        raise(restore_class(e.kind), e.message, &fields)
    }
}
