//! Binding of [`crate::store`]: whole-store calls used by tools and tests
//! (`verify`, `inspect`, interop checks). The processing path uses rocksdict.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use rocksdb::{IteratorMode, WriteBatch};

use super::error;
use crate::store::{self, Store, StoreError, StoreFormat};

/// Damaged store files are `StoreCorruptedError` (a `TaskCorruptedError`:
/// wipe and restore the task); anything else is `StoreError`.
fn store_err(e: StoreError) -> PyErr {
    error(if e.corruption { "StoreCorruptedError" } else { "StoreError" }, e.to_string())
}

type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Write `items` (a value of `None` deletes the key) and `offsets`
/// (`"<topic>-<partition>"` -> offset) to the store at `path` in one batch,
/// optionally with a status marker, then flush. Creates the store if needed.
#[pyfunction]
#[pyo3(signature = (path, items, offsets, status=None, format=None))]
fn store_write_batch(
    py: Python<'_>,
    path: PathBuf,
    items: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    offsets: BTreeMap<String, i64>,
    status: Option<i64>,
    format: Option<&str>,
) -> PyResult<()> {
    let format = format
        .map(|f| StoreFormat::parse(f).ok_or_else(|| error("StoreError", format!("unknown store format {f:?}"))))
        .transpose()?;
    py.detach(|| {
        let store = match format {
            Some(f) => Store::open_format(&path, store::store_options(true), f)?,
            None => Store::open(&path, true)?,
        };
        let mut b = WriteBatch::default();
        let cf = store.data_cf();
        for (k, v) in &items {
            match v {
                Some(v) => b.put_cf(cf, k, v),
                None => b.delete_cf(cf, k),
            }
        }
        for (tp, off) in &offsets {
            store.put_offset(&mut b, tp, *off);
        }
        if let Some(s) = status {
            store.put_status(&mut b, s);
        }
        store.write(b, false)?;
        store.flush()
    })
    .map_err(store_err)
}

/// Read a whole store: `(entries, offsets, status)` where entries are the data
/// column family in key order and offsets exclude the status marker.
#[pyfunction]
fn store_dump(py: Python<'_>, path: PathBuf) -> PyResult<(Entries, BTreeMap<String, i64>, Option<i64>)> {
    py.detach(|| {
        let store = Store::open_read_only(&path)?;
        let mut entries = Vec::new();
        for item in store.db().iterator_cf(store.data_cf(), IteratorMode::Start) {
            let (k, v) = item.map_err(|e| StoreError::rocksdb(&path, "reading data", &e))?;
            entries.push((k.to_vec(), v.to_vec()));
        }
        Ok((entries, store.offsets()?, store.status()?))
    })
    .map_err(store_err)
}

/// What a tool shows about a store, read without taking its lock:
/// `(offsets, status, estimated number of keys)`. With `check_blocks`, every
/// block is read first with its checksum verified, so a damaged data block is
/// `StoreCorruptedError` here rather than on the first read that reaches it.
#[pyfunction]
#[pyo3(signature = (path, check_blocks=false))]
fn store_info(
    py: Python<'_>,
    path: PathBuf,
    check_blocks: bool,
) -> PyResult<(BTreeMap<String, i64>, Option<i64>, u64)> {
    py.detach(|| {
        let store = Store::open_read_only(&path)?;
        if check_blocks {
            store.check_blocks()?;
        }
        let keys = store
            .db()
            .property_int_value_cf(store.data_cf(), "rocksdb.estimate-num-keys")
            .map_err(|e| StoreError::rocksdb(&path, "reading key estimate", &e))?
            .unwrap_or(0);
        Ok((store.offsets()?, store.status()?, keys))
    })
    .map_err(store_err)
}


/// The format of the store at `path` as found on disk (`"plain"` or
/// `"timestamped"`), None where there is no RocksDB yet. A store of a type
/// statestore does not know (windowed, session, versioned, headers, extra
/// column families) raises `StoreError` naming its column families.
#[pyfunction]
fn store_format(py: Python<'_>, path: PathBuf) -> PyResult<Option<&'static str>> {
    py.detach(|| Store::detect_format(&path)).map(|f| f.map(StoreFormat::name)).map_err(store_err)
}

/// Compare the data of two stores (read-only): `(expected digest, actual
/// digest, expected entries, actual entries, first difference)` where the
/// first difference is `(key, expected value, actual value)` in key order.
#[pyfunction]
fn store_compare(
    py: Python<'_>,
    expected: PathBuf,
    actual: PathBuf,
) -> PyResult<(String, String, u64, u64, Option<store::Difference>)> {
    py.detach(|| {
        let e = Store::open_read_only(&expected)?;
        let a = Store::open_read_only(&actual)?;
        let c = store::compare(&e, &a)?;
        Ok((c.expected_digest, c.actual_digest, c.expected_entries, c.actual_entries, c.first_difference))
    })
    .map_err(store_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(store_info, m)?)?;
    m.add_function(wrap_pyfunction!(store_compare, m)?)?;
    m.add_function(wrap_pyfunction!(store_write_batch, m)?)?;
    m.add_function(wrap_pyfunction!(store_dump, m)?)?;
    m.add_function(wrap_pyfunction!(store_format, m)?)?;
    Ok(())
}
