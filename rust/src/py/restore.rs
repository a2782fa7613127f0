//! Binding of the restore engine ([`crate::restore::engine`]): one call per
//! restore (or per list of restores), the GIL released for all of it; the
//! Python listener is called from the restoring thread, throttled.
//!
//! The changelog is a segment log directory (a path) or a Python changelog
//! object such as `statestore.kafka.KafkaChangelog`, fed through
//! [`super::feed`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::errors::ErrorClass;
use super::feed::{PyFeedLog, Raised};
use super::kafka::PyKafkaClient;
use crate::kafka::client::{KafkaClient, KafkaLog, SessionLog};
use crate::log::SegmentLogDir;
use crate::restore::engine::{self, Mode, RestoreOutcome, RestoreSpec, DEFAULT_MEMORY_BUDGET};
use crate::restore::open_stores::OpenStores;
use crate::restore::replay::DEFAULT_CHUNK_BYTES;
use crate::restore::{ErrorKind, Listener, RestoreError};
use crate::segments::Segmentation;
use crate::source::{Changelog, JobPart};
use crate::store::StoreFormat;

/// What one restore did (`statestore.restore.RestoreResult` is built from it).
#[pyclass(module = "statestore._native", name = "RestoreOutcome", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct PyRestoreOutcome {
    /// `"replay"` or `"bulk"`: the mode used.
    mode: &'static str,
    start_offset: i64,
    end_offset: i64,
    records_applied: u64,
    skipped_aborted: u64,
    skipped_control: u64,
    skipped_null_key: u64,
    bytes_read: u64,
    seconds: f64,
    /// Of `seconds`, the merge a replay with deferred compactions ends with (0.0 without one).
    merge_seconds: f64,
    /// The offset the store records afterwards.
    offset: Option<i64>,
    /// `(start, end, last_stable)` of the partition as the restore left the
    /// log, when it can tell nothing was written since the restore asked.
    log_bounds: Option<(i64, i64, i64)>,
    /// The Kafka topic id (a UUID string) the records were read under; None:
    /// none read, or a log without topic ids.
    topic_id: Option<String>,
}

impl From<&RestoreOutcome> for PyRestoreOutcome {
    fn from(o: &RestoreOutcome) -> Self {
        Self {
            mode: o.mode.name(),
            start_offset: o.start_offset,
            end_offset: o.end_offset,
            records_applied: o.records_applied,
            skipped_aborted: o.skipped.aborted,
            skipped_control: o.skipped.control,
            skipped_null_key: o.skipped_null_key,
            bytes_read: o.bytes_read,
            seconds: o.seconds,
            merge_seconds: o.merge_seconds,
            offset: o.offset,
            log_bounds: o.log_bounds.map(|b| (b.start, b.end, b.last_stable)),
            topic_id: o.topic_id.map(|id| uuid::Uuid::from_bytes(id).to_string()),
        }
    }
}

#[pymethods]
impl PyRestoreOutcome {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

/// A Python object with `on_restore_start/on_batch_restored/on_restore_end`.
/// The exception it raises is kept so that it becomes the `__cause__` of the
/// `RestoreError`.
struct PyListener {
    obj: Py<PyAny>,
    tp: Py<PyAny>,
    store_name: String,
    raised: Arc<Mutex<Option<PyErr>>>,
}

impl PyListener {
    fn call(&mut self, method: &str, a: i64, b: Option<i64>) -> Result<(), String> {
        Python::attach(|py| {
            let tp = self.tp.clone_ref(py);
            let name = self.store_name.clone();
            let r = match b {
                Some(b) => self.obj.call_method1(py, method, (tp, name, a, b)),
                None => self.obj.call_method1(py, method, (tp, name, a)),
            };
            r.map(drop).map_err(|e| {
                let msg = e.to_string();
                *self.raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                msg
            })
        })
    }
}

impl Listener for PyListener {
    fn on_start(&mut self, start_offset: i64, end_offset: i64) -> Result<(), String> {
        self.call("on_restore_start", start_offset, Some(end_offset))
    }
    fn on_batch(&mut self, batch_end_offset: i64, num_restored: u64) -> Result<(), String> {
        self.call("on_batch_restored", batch_end_offset, Some(num_restored as i64))
    }
    fn on_end(&mut self, total_restored: u64) -> Result<(), String> {
        self.call("on_restore_end", total_restored as i64, None)
    }
}

fn to_pyerr(e: RestoreError, raised: &Arc<Mutex<Option<PyErr>>>, fed: Option<&Raised>) -> PyErr {
    // An exception of the Python changelog (e.g. `TaskCorruptedError` for an
    // offset out of range) is raised as it is: its class says what to do.
    if let Some(cause) = fed.and_then(|f| f.lock().unwrap_or_else(|p| p.into_inner()).take()) {
        return cause;
    }
    let listener = e.kind == ErrorKind::Listener;
    let err = PyErr::from(e);
    if listener {
        if let Some(cause) = raised.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Python::attach(|py| err.set_cause(py, Some(cause)));
        }
    }
    err
}

/// One restore as Python describes it.
struct Job {
    log: Box<dyn Changelog + Send>,
    spec: RestoreSpec,
    listener: Option<PyListener>,
    raised: Arc<Mutex<Option<PyErr>>>,
    /// Where the Python changelog keeps the exception it raised (not for a segment log).
    fed: Option<Raised>,
    /// The native Kafka client `log` reads through, if it does.
    kafka: Option<Arc<KafkaClient>>,
}

impl engine::RestoreJob for Job {
    fn parts(&self) -> (&dyn Changelog, &RestoreSpec) {
        (&*self.log, &self.spec)
    }
    fn parts_mut(&mut self) -> (&dyn Changelog, &mut RestoreSpec, Option<&mut dyn Listener>) {
        (&*self.log, &mut self.spec, self.listener.as_mut().map(|l| l as &mut dyn Listener))
    }
}

/// Seconds a Python changelog may go without handing out anything before a
/// restore gives up, unless it says otherwise (`restore_stall_timeout`).
const DEFAULT_STALL_SECONDS: f64 = 60.0;

/// A segment log directory (a `str` or `os.PathLike`), an object naming one
/// in `log_dir` (`statestore.SegmentLog`), or a Python changelog object.
/// Which changelog `log` is: the log, where a Python changelog keeps the
/// exception it raised, and the native Kafka client it reads through.
type Resolved = (Box<dyn Changelog + Send>, Option<Raised>, Option<Arc<KafkaClient>>);

fn changelog(log: &Bound<'_, PyAny>, format: StoreFormat) -> PyResult<Resolved> {
    if let Ok(dir) = log.extract::<PathBuf>() {
        return Ok((Box::new(SegmentLogDir(dir)), None, None));
    }
    if let Ok(dir) = log.getattr("log_dir").and_then(|d| d.extract::<PathBuf>()) {
        return Ok((Box::new(SegmentLogDir(dir)), None, None));
    }
    // A Kafka changelog the native fetcher serves (`KafkaChangelog.native`),
    // or the native client itself; else the Python feed below.
    let native = log
        .cast::<PyKafkaClient>()
        .ok()
        .cloned()
        .or_else(|| log.getattr("native").ok().and_then(|n| n.cast::<PyKafkaClient>().ok().cloned()));
    if let Some(k) = native {
        let client = k.get().client.clone();
        return Ok((Box::new(KafkaLog(client.clone())), None, Some(client)));
    }
    let stall = match log.getattr("restore_stall_timeout") {
        Ok(v) => v.extract::<f64>()?,
        Err(_) => DEFAULT_STALL_SECONDS,
    };
    if !(stall > 0.0 && stall.is_finite()) {
        return Err(ErrorClass::Restore.err(format!("restore_stall_timeout must be > 0 seconds, got {stall}")));
    }
    let f = PyFeedLog::new(log.clone().unbind(), Duration::from_secs_f64(stall))
        .with_timestamps(format.is_timestamped() || format.is_versioned())
        .with_headers(format.has_headers());
    let raised = f.raised();
    Ok((Box::new(f), Some(raised), None))
}

/// One restore as Python describes it: the attributes of
/// `statestore.restore.engine.RestoreSpec`, read by name.
#[derive(FromPyObject)]
struct SpecArgs {
    #[pyo3(attribute)]
    store_path: PathBuf,
    #[pyo3(attribute("changelog"))]
    log: Py<PyAny>,
    #[pyo3(attribute)]
    tp: Py<PyAny>,
    #[pyo3(attribute)]
    end_offset: Option<i64>,
    #[pyo3(attribute)]
    mode: String,
    #[pyo3(attribute)]
    memory_budget_bytes: usize,
    #[pyo3(attribute)]
    listener: Option<Py<PyAny>>,
    #[pyo3(attribute)]
    progress_interval: f64,
    /// One of `STORE_FORMATS`.
    #[pyo3(attribute)]
    format: String,
    /// Retention of a window or session store, history retention of a versioned store (ms).
    #[pyo3(attribute)]
    retention_ms: Option<i64>,
    /// Segment interval of a window, session or versioned store (ms; None: the default for the
    /// retention, the DSL's or `Stores.persistentVersionedKeyValueStore`'s).
    #[pyo3(attribute)]
    segment_interval_ms: Option<i64>,
    /// The Kafka topic id (a UUID string) the store's records were read under; None: not known.
    #[pyo3(attribute)]
    topic_id: Option<String>,
}

/// The segmentation a store of `format` needs: retention (and segment
/// interval) for a window or session store, history retention (and segment
/// interval) for a versioned store, nothing for a key-value store.
fn segmentation(
    format: StoreFormat,
    retention_ms: Option<i64>,
    segment_interval_ms: Option<i64>,
) -> Result<Option<Segmentation>, String> {
    if format.is_versioned() {
        let r = retention_ms.ok_or("a versioned store needs its history retention (retention_ms)")?;
        let h = crate::versioned::History::new(r, segment_interval_ms)?;
        return Ok(Some(Segmentation {
            retention_ms: h.history_retention_ms,
            segment_interval_ms: h.segment_interval_ms,
        }));
    }
    match (format.key_schema(), retention_ms) {
        (Some(_), Some(r)) => Segmentation::new(r, segment_interval_ms).map(Some),
        (Some(_), None) => Err(format!("a {} store needs its retention (retention_ms)", format.name())),
        (None, None) if segment_interval_ms.is_none() => Ok(None),
        (None, _) => Err(format!(
            "retention and segment interval belong to window, session and versioned stores, not to a {} store",
            format.name()
        )),
    }
}

fn job(py: Python<'_>, a: SpecArgs) -> PyResult<Job> {
    let tp = a.tp.bind(py);
    let topic: String = tp.getattr("topic")?.extract()?;
    let partition: i32 = tp.getattr("partition")?.extract()?;
    let mode =
        Mode::parse(&a.mode).map_err(|m| ErrorClass::Restore.err(format!("restoring {topic}-{partition}: {m}")))?;
    let interval = a.progress_interval;
    if !(interval >= 0.0 && interval.is_finite()) {
        return Err(ErrorClass::Restore.err(format!("progress interval must be >= 0 seconds, got {interval}")));
    }
    let format = StoreFormat::parse(&a.format)
        .map_err(|m| ErrorClass::Restore.err(format!("restoring {topic}-{partition}: {m}")))?;
    let seg = segmentation(format, a.retention_ms, a.segment_interval_ms)
        .map_err(|m| ErrorClass::Restore.err(format!("restoring {topic}-{partition}: {m}")))?;
    let mut spec = RestoreSpec::new(a.store_path, &topic, partition);
    spec.topic_id = match a.topic_id {
        Some(id) => Some(
            *uuid::Uuid::parse_str(&id)
                .map_err(|e| ErrorClass::Restore.err(format!("restoring {topic}-{partition}: topic id {id:?}: {e}")))?
                .as_bytes(),
        ),
        None => None,
    };
    spec.format = format;
    spec.segmentation = seg;
    spec.end_offset = a.end_offset;
    spec.mode = mode;
    spec.memory_budget = a.memory_budget_bytes;
    spec.progress_interval = Duration::from_secs_f64(interval);
    let raised = Arc::new(Mutex::new(None));
    let store_name = spec.store_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let listener = a.listener.map(|obj| PyListener { obj, tp: a.tp.clone_ref(py), store_name, raised: raised.clone() });
    let (log, fed, kafka) = changelog(a.log.bind(py), spec.format)?;
    Ok(Job { log, spec, listener, raised, fed, kafka })
}

/// Restore the store at `store_path` from partition `tp` (a `TopicPartition`)
/// of `log`: the segment log in that directory, or a Python changelog. Returns the outcome; raises the
/// `statestore.errors` class of the failure. The GIL is released throughout.
/// `write_buffer_bytes` (memtable size; by default its share of the budget) and
/// `chunk_bytes` (most log bytes per `WriteBatch`) are tuning knobs for tests and tools; `bulk_threads` splits
/// a bulk restore's sort, merge and SST writing by key range across that many threads;
/// `defer_compactions_from` is the offsets from which a key-value replay defers RocksDB's compactions to
/// one merge at its end (`None`: the engine's default, `restore::DEFERRED_COMPACTION_OFFSETS`).
#[pyfunction]
#[pyo3(signature = (store_path, log, tp, end_offset=None, mode="auto", memory_budget_bytes=DEFAULT_MEMORY_BUDGET, listener=None, progress_interval=0.1, write_buffer_bytes=None, chunk_bytes=DEFAULT_CHUNK_BYTES, read_ahead=true, format="plain", retention_ms=None, segment_interval_ms=None, bulk_threads=1, defer_compactions_from=None, topic_id=None))]
#[allow(clippy::too_many_arguments)]
fn restore_store(
    py: Python<'_>,
    store_path: PathBuf,
    log: &Bound<'_, PyAny>,
    tp: &Bound<'_, PyAny>,
    end_offset: Option<i64>,
    mode: &str,
    memory_budget_bytes: usize,
    listener: Option<Py<PyAny>>,
    progress_interval: f64,
    write_buffer_bytes: Option<usize>,
    chunk_bytes: usize,
    read_ahead: bool,
    format: &str,
    retention_ms: Option<i64>,
    segment_interval_ms: Option<i64>,
    bulk_threads: usize,
    defer_compactions_from: Option<i64>,
    topic_id: Option<String>,
) -> PyResult<PyRestoreOutcome> {
    let args = SpecArgs {
        store_path,
        log: log.clone().unbind(),
        tp: tp.clone().unbind(),
        end_offset,
        mode: mode.to_string(),
        memory_budget_bytes,
        listener,
        progress_interval,
        format: format.to_string(),
        retention_ms,
        segment_interval_ms,
        topic_id,
    };
    let mut j = job(py, args)?;
    j.spec.write_buffer_bytes = write_buffer_bytes;
    j.spec.chunk_bytes = chunk_bytes.max(1);
    j.spec.read_ahead = read_ahead;
    j.spec.bulk_threads = bulk_threads.max(1);
    if let Some(offsets) = defer_compactions_from {
        j.spec.defer_compactions_from = offsets;
    }
    let r = py.detach(|| engine::restore(&*j.log, &j.spec, j.listener.as_mut().map(|l| l as &mut dyn Listener)));
    r.map(|o| PyRestoreOutcome::from(&o)).map_err(|e| to_pyerr(e, &j.raised, j.fed.as_ref()))
}

/// Restore many stores on `threads` native threads. `specs` are objects with
/// the attributes of `statestore.restore.engine.RestoreSpec` (`store_path`, `log`,
/// `tp`, `end_offset`, `mode`, `memory_budget_bytes`, `listener`,
/// `progress_interval`, `format`, `retention_ms`, `segment_interval_ms`, `topic_id`), read by name. Returns, per spec in order, its
/// `RestoreOutcome` or the exception it failed with. With `open_stores`, each
/// store is taken from there if open and kept there afterwards, a replay
/// leaving it unflushed.
#[pyfunction]
#[pyo3(signature = (specs, threads, open_stores=None))]
fn restore_many(
    py: Python<'_>,
    specs: Vec<SpecArgs>,
    threads: usize,
    open_stores: Option<PyRef<'_, PyOpenStores>>,
) -> PyResult<Vec<Py<PyAny>>> {
    let mut jobs = specs.into_iter().map(|s| job(py, s)).collect::<PyResult<Vec<_>>>()?;
    if let Some(kept) = open_stores {
        for j in &mut jobs {
            j.spec.kept_open = Some(kept.inner.clone());
        }
    }
    let sessions = share_fetch_sessions(&mut jobs);
    let raised: Vec<_> = jobs.iter().map(|j| (j.raised.clone(), j.fed.clone())).collect();
    let results = py.detach(|| {
        for (session, parts) in sessions {
            session.read_ahead(&parts);
        }
        engine::restore_jobs(jobs, threads)
    });
    results
        .into_iter()
        .zip(raised)
        .map(|(r, (raised, fed))| match r {
            Ok(o) => Ok(Py::new(py, PyRestoreOutcome::from(&o))?.into_any()),
            Err(e) => Ok(to_pyerr(e, &raised, fed.as_ref()).into_value(py).into_any()),
        })
        .collect()
}

/// Stores kept open between restores of them (`restore_many(...,
/// open_stores=)`): the state updater's rounds. Their memtables share
/// `memory_budget_bytes`; whoever records a store's offsets outside it (a
/// checkpoint file) flushes it first. A store must not be flushed or closed
/// while a restore of it runs. A store closed here because a flush failed
/// unheard (one flushed to make room for another) makes its next `flush` or
/// `close` raise that error: what it held unflushed is lost.
#[pyclass(module = "statestore._native", name = "OpenStores", frozen)]
pub struct PyOpenStores {
    inner: Arc<OpenStores>,
}

#[pymethods]
impl PyOpenStores {
    #[new]
    #[pyo3(signature = (memory_budget_bytes=DEFAULT_MEMORY_BUDGET))]
    fn new(memory_budget_bytes: usize) -> Self {
        Self { inner: Arc::new(OpenStores::new(memory_budget_bytes)) }
    }

    /// Flush the store open at `path` to disk; whether one was open.
    fn flush(&self, py: Python<'_>, path: PathBuf) -> PyResult<bool> {
        Ok(py.detach(|| self.inner.flush(&path))?)
    }

    /// Flush and close the store open at `path`; whether one was open.
    fn close(&self, py: Python<'_>, path: PathBuf) -> PyResult<bool> {
        Ok(py.detach(|| self.inner.close(&path))?)
    }

    /// Flush and close every store open here.
    fn close_all(&self, py: Python<'_>) -> PyResult<()> {
        Ok(py.detach(|| self.inner.close_all())?)
    }

    /// The paths of the stores open here, sorted.
    fn paths(&self) -> Vec<PathBuf> {
        self.inner.paths()
    }

    /// Bytes the memtables of these stores hold now.
    fn memtable_bytes(&self) -> u64 {
        self.inner.memtable_bytes()
    }

    fn __len__(&self) -> usize {
        self.inner.paths().len()
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// The native Kafka restores of one job read through one fetch session per
/// client: one fetch thread, one connection and one Fetch at a time per
/// broker for all the partitions it leads ([`SessionLog`]). Each session
/// comes back with the partitions its restores read, which it reads ahead
/// ([`Changelog::read_ahead`]) once the GIL is released.
fn share_fetch_sessions(jobs: &mut [Job]) -> Vec<(SessionLog, Vec<JobPart>)> {
    let mut sessions: Vec<(SessionLog, Vec<JobPart>)> = Vec::new();
    for j in jobs.iter_mut() {
        let Some(client) = j.kafka.take() else { continue };
        let i = match sessions.iter().position(|(s, _)| Arc::ptr_eq(s.0.client(), &client)) {
            Some(i) => i,
            None => {
                sessions.push((SessionLog::new(client), Vec::new()));
                sessions.len() - 1
            }
        };
        let (session, parts) = &mut sessions[i];
        parts.push(engine::job_part(&j.spec));
        j.log = Box::new(session.clone());
    }
    sessions
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The restore modes, from the one list (`Mode::ALL`).
    m.add("MODES", PyTuple::new(m.py(), Mode::ALL.map(Mode::name))?)?;
    m.add("DEFAULT_MEMORY_BUDGET", DEFAULT_MEMORY_BUDGET)?;
    m.add_function(wrap_pyfunction!(restore_store, m)?)?;
    m.add_function(wrap_pyfunction!(restore_many, m)?)?;
    m.add_class::<PyRestoreOutcome>()?;
    m.add_class::<PyOpenStores>()?;
    Ok(())
}
