//! Binding of the native Kafka fetcher ([`crate::kafka`]): `KafkaClient`, the
//! cluster a `statestore.kafka.KafkaChangelog` restores from (the restore
//! binding takes it as a changelog, see `py::restore`), its offsets, and a
//! read_committed reader for `KafkaChangelog.read`. Every call that talks to a
//! broker releases the GIL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::errors::ErrorClass;
use super::log::{push_record, records_to_py, PartitionBounds};
use crate::kafka::fetch::FetchCursor;
use crate::kafka::{ClientConfig, ConfigError, KafkaClient, KafkaError};
use crate::source::RecordChunk;

/// A fetcher error as the `statestore.errors` class of its kind (through
/// [`crate::log::LogError`], the one error type of changelogs).
pub fn kafka_err(e: KafkaError) -> PyErr {
    crate::log::LogError::from(e).into()
}

fn seconds(name: &str, s: f64) -> PyResult<Duration> {
    if !(s > 0.0 && s.is_finite()) {
        return Err(ErrorClass::Log.err(format!("{name} must be > 0 seconds, got {s}")));
    }
    Ok(Duration::from_secs_f64(s))
}

fn parse(
    config: &HashMap<String, String>,
    request_timeout: f64,
    stall_timeout: f64,
) -> PyResult<Result<ClientConfig, ConfigError>> {
    Ok(ClientConfig::parse(
        config.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        seconds("request_timeout", request_timeout)?,
        seconds("stall_timeout", stall_timeout)?,
    ))
}

/// A Kafka cluster restores fetch from natively. `config` holds
/// confluent-kafka style properties as strings.
#[pyclass(module = "statestore._native", name = "KafkaClient", frozen)]
pub struct PyKafkaClient {
    pub client: Arc<KafkaClient>,
}

#[pymethods]
impl PyKafkaClient {
    #[new]
    #[pyo3(signature = (config, request_timeout=30.0, stall_timeout=60.0))]
    fn new(config: HashMap<String, String>, request_timeout: f64, stall_timeout: f64) -> PyResult<Self> {
        match parse(&config, request_timeout, stall_timeout)? {
            Ok(c) => Ok(PyKafkaClient { client: KafkaClient::new(c) }),
            Err(e) => Err(ErrorClass::Log.err(format!("Kafka configuration: {e}"))),
        }
    }

    /// Why the native fetcher cannot serve `config` (a SASL mechanism or
    /// security setting it does not implement), or None when it can.
    /// Invalid configurations raise `LogError`.
    #[staticmethod]
    fn unsupported(config: HashMap<String, String>) -> PyResult<Option<String>> {
        match parse(&config, 1.0, 1.0)? {
            Ok(_) => Ok(None),
            Err(ConfigError::Unsupported(why)) => Ok(Some(why)),
            Err(e) => Err(ErrorClass::Log.err(format!("Kafka configuration: {e}"))),
        }
    }

    /// Why the native fetcher cannot talk TLS to this cluster although the
    /// configuration is one it takes (rustls refused a bootstrap server's
    /// handshake: a CN-only certificate, an old protocol or cipher suite),
    /// or None. Connects to one bootstrap server when TLS is on (the
    /// connection is kept for the first request).
    fn tls_refused(&self, py: Python<'_>) -> Option<String> {
        py.detach(|| self.client.tls_refused())
    }

    /// The bootstrap servers.
    #[getter]
    fn bootstrap_servers(&self) -> String {
        self.client.servers()
    }

    /// Start, end and last stable offset of a partition (ListOffsets
    /// earliest, latest, latest under read_committed).
    fn offsets(&self, py: Python<'_>, topic: &str, partition: i32) -> PyResult<PartitionBounds> {
        let b = py.detach(|| self.client.offsets(topic, partition)).map_err(kafka_err)?;
        Ok(b.into())
    }

    /// A read_committed reader of `topic-partition` from `start`.
    fn reader(&self, topic: &str, partition: i32, start: i64) -> KafkaReaderCore {
        KafkaReaderCore { inner: Mutex::new(FetchCursor::new(self.client.clone(), topic, partition, start)) }
    }
}

/// The native half of `KafkaChangelog.read`: the restore engine's fetch
/// cursor, handing records to Python a chunk at a time.
#[pyclass(module = "statestore._native", name = "KafkaReaderCore", frozen)]
pub struct KafkaReaderCore {
    inner: Mutex<FetchCursor>,
}

#[pymethods]
impl KafkaReaderCore {
    /// Next offset to read (steps over markers and aborted records).
    #[getter]
    fn position(&self) -> i64 {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).position()
    }

    /// `(aborted, control)` records stepped over so far.
    #[getter]
    fn skipped(&self) -> (u64, u64) {
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner()).skipped();
        (s.aborted, s.control)
    }

    /// The records of about `max_bytes` of log below `end`: a list of
    /// `(offset, key, value, timestamp, headers)`; empty once `end` is reached.
    fn poll<'py>(&self, py: Python<'py>, end: i64, max_bytes: usize) -> PyResult<Bound<'py, PyList>> {
        let decoded = py
            .detach(|| {
                let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                let mut d = RecordChunk::default();
                let mut n = 0usize;
                // Markers and aborted batches yield nothing: go on until something is.
                loop {
                    let more = c.read(end, max_bytes, &mut |r| {
                        push_record(&mut d, r);
                        n += 1;
                    })?;
                    if !more || n > 0 {
                        break;
                    }
                }
                Ok::<_, KafkaError>(d)
            })
            .map_err(kafka_err)?;
        records_to_py(py, &decoded)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKafkaClient>()?;
    m.add_class::<KafkaReaderCore>()?;
    Ok(())
}
