//! A changelog reached through Python -- `statestore.kafka.KafkaChangelog`,
//! a confluent-kafka read_committed consumer -- as the restore engine's
//! [`Changelog`].
//!
//! The engine runs with the GIL released; a feed takes it back once per pull
//! (one `consume()` of up to [`crate::restore::feed::MAX_PULL_RECORDS`]
//! messages) and reads offset, key and value (a header-aware store: headers too) of every `Message` through the
//! C API (vectorcalls of the client's C methods, no Python bytecode per
//! record), copying the bytes into the chunk's arena. Python code runs only
//! per pull (`poll`, `position`) and for error events (`on_error`: the end
//! of the partition, or an exception such as `TaskCorruptedError` for an
//! offset out of range). An exception raised there is kept and re-raised
//! as is by the binding, so its class survives the trip through the engine.
//!
//! The Python side implements:
//! `restore_bounds(topic, partition) -> (start, end, last_stable)`,
//! `restore_feed(topic, partition, start) -> feed` with
//! `feed.poll(max_records) -> list[Message]`, `feed.on_error(msg) -> bool`
//! (True: end of partition), `feed.position() -> int | None`, `feed.close()`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::restore::feed::{ChunkFeed, FeedChunk, FeedSource};
use crate::source::{Bounds, Changelog, ChangelogSource, LogError};

/// The first Python exception a feed raised, kept for the binding to re-raise.
pub type Raised = Arc<Mutex<Option<PyErr>>>;

fn keep(raised: &Raised, e: PyErr) -> LogError {
    let msg = e.to_string();
    let mut slot = raised.lock().unwrap_or_else(|p| p.into_inner());
    if slot.is_none() {
        *slot = Some(e);
    }
    LogError::other(msg)
}

/// A Python changelog object (see the module docs).
pub struct PyFeedLog {
    obj: Py<PyAny>,
    raised: Raised,
    stall_timeout: Duration,
    timestamps: bool,
    headers: bool,
}

impl PyFeedLog {
    pub fn new(obj: Py<PyAny>, stall_timeout: Duration) -> Self {
        Self { obj, raised: Arc::new(Mutex::new(None)), stall_timeout, timestamps: true, headers: false }
    }

    /// Whether records need their headers (a header-aware store keeps them):
    /// `Message.headers()`, a list of `(str, bytes | None)` or None, read
    /// only then.
    pub fn with_headers(mut self, headers: bool) -> Self {
        self.headers = headers;
        self
    }

    /// Whether records need their timestamps (a timestamped store does):
    /// reading them costs one more Python call per record, so a plain store
    /// skips it (its records carry timestamp -1).
    pub fn with_timestamps(mut self, timestamps: bool) -> Self {
        self.timestamps = timestamps;
        self
    }

    /// Where an exception raised by the Python side is kept.
    pub fn raised(&self) -> Raised {
        self.raised.clone()
    }
}

impl Changelog for PyFeedLog {
    fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
        Python::attach(|py| {
            let (start, end, last_stable): (i64, i64, i64) =
                self.obj.call_method1(py, intern!(py, "restore_bounds"), (topic, partition))?.extract(py)?;
            Ok(Bounds { start, end, last_stable })
        })
        .map_err(|e| keep(&self.raised, e))
    }

    fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
        let feed =
            Python::attach(|py| self.obj.call_method1(py, intern!(py, "restore_feed"), (topic, partition, start)))
                .map_err(|e| keep(&self.raised, e))?;
        let feed = PyChunkFeed {
            obj: Some(feed),
            raised: self.raised.clone(),
            timestamps: self.timestamps,
            headers: self.headers,
        };
        Ok(Box::new(FeedSource::new(feed, start, self.stall_timeout)))
    }

    /// A Python changelog (a consumer, a test double) may not expect calls
    /// from a thread beside the restore threads it was given.
    fn prepares_ahead(&self) -> bool {
        false
    }
}

/// One Python feed (a positioned consumer), closed when dropped.
struct PyChunkFeed {
    obj: Option<Py<PyAny>>,
    raised: Raised,
    timestamps: bool,
    headers: bool,
}

fn bytes<'a>(o: &'a Bound<'_, PyAny>) -> PyResult<Option<&'a [u8]>> {
    if o.is_none() {
        Ok(None)
    } else {
        Ok(Some(o.cast::<PyBytes>()?.as_bytes()))
    }
}

impl ChunkFeed for PyChunkFeed {
    fn pull(&mut self, max_records: usize, chunk: &mut FeedChunk) -> Result<(), LogError> {
        let Some(obj) = self.obj.as_ref() else {
            return Err(LogError::other("the feed is closed"));
        };
        Python::attach(|py| -> PyResult<()> {
            let feed = obj.bind(py);
            let msgs = feed.call_method1(intern!(py, "poll"), (max_records,))?;
            let msgs = msgs.cast::<PyList>()?;
            let (error, offset, key, value, timestamp) = (
                intern!(py, "error"),
                intern!(py, "offset"),
                intern!(py, "key"),
                intern!(py, "value"),
                intern!(py, "timestamp"),
            );
            let headers = intern!(py, "headers");
            for m in msgs.iter() {
                if !m.call_method0(error)?.is_none() {
                    if feed.call_method1(intern!(py, "on_error"), (&m,))?.is_truthy()? {
                        chunk.at_end = true;
                    }
                    continue;
                }
                let o: i64 = m.call_method0(offset)?.extract()?;
                let k = m.call_method0(key)?;
                let v = m.call_method0(value)?;
                // (type, ms): type 0 (not available) comes with -1
                let ts = if self.timestamps {
                    let (_kind, ts): (i32, i64) = m.call_method0(timestamp)?.extract()?;
                    ts
                } else {
                    -1
                };
                if self.headers {
                    let hs = m.call_method0(headers)?;
                    let hs: Vec<(String, Option<Vec<u8>>)> = if hs.is_none() { Vec::new() } else { hs.extract()? };
                    let hs = hs.iter().map(|(k, v)| (k.as_bytes(), v.as_deref()));
                    chunk.push_with_headers(o, ts, bytes(&k)?, bytes(&v)?, hs);
                } else {
                    chunk.push(o, ts, bytes(&k)?, bytes(&v)?);
                }
            }
            chunk.position = feed.call_method0(intern!(py, "position"))?.extract()?;
            Ok(())
        })
        .map_err(|e| keep(&self.raised, e))
    }
}

impl Drop for PyChunkFeed {
    fn drop(&mut self) {
        if let Some(obj) = self.obj.take() {
            Python::attach(|py| {
                if let Err(e) = obj.call_method0(py, intern!(py, "close")) {
                    e.write_unraisable(py, Some(obj.bind(py)));
                }
            });
        }
    }
}
