//! Binding of [`crate::store`]: whole-store calls used by tools and tests
//! (`verify`, `inspect`, interop checks). The processing path uses rocksdict.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use rocksdb::{IteratorMode, WriteBatch};

use super::error;
use crate::store::{Store, StoreError};

fn store_err(e: StoreError) -> PyErr {
    error("StoreError", e.to_string())
}

type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Write `items` (a value of `None` deletes the key) and `offsets`
/// (`"<topic>-<partition>"` -> offset) to the store at `path` in one batch,
/// optionally with a status marker, then flush. Creates the store if needed.
#[pyfunction]
#[pyo3(signature = (path, items, offsets, status=None))]
fn store_write_batch(
    py: Python<'_>,
    path: PathBuf,
    items: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    offsets: BTreeMap<String, i64>,
    status: Option<i64>,
) -> PyResult<()> {
    py.detach(|| {
        let store = Store::open(&path, true)?;
        let mut b = WriteBatch::default();
        for (k, v) in &items {
            match v {
                Some(v) => b.put(k, v),
                None => b.delete(k),
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
        if !path.is_dir() {
            return Err(StoreError::new(&path, "no store here (directory missing)"));
        }
        let store = Store::open(&path, false)?;
        let mut entries = Vec::new();
        for item in store.db().iterator(IteratorMode::Start) {
            let (k, v) = item.map_err(|e| StoreError::new(&path, format!("reading data: {e}")))?;
            entries.push((k.to_vec(), v.to_vec()));
        }
        Ok((entries, store.offsets()?, store.status()?))
    })
    .map_err(store_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(store_write_batch, m)?)?;
    m.add_function(wrap_pyfunction!(store_dump, m)?)?;
    Ok(())
}
