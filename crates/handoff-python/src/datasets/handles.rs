//! Lazy handles to a dataset's objects, as Python objects whose reads are awaitables.

use bytes::Bytes;
use handoff_data::{Blob, BlobTag, BlobTree, TreeEntry};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::dataset::{info, DataSetInfo};
use super::errors::to_py;
use super::runtime::{finish, spawn};

/// One object of a dataset: nothing is read until asked.
#[pyclass(module = "handoff._native", frozen)]
pub struct DataBlob {
    blob: Blob,
}

impl From<Blob> for DataBlob {
    fn from(blob: Blob) -> Self {
        DataBlob { blob }
    }
}

/// A tag as the dict `handoff.data.BlobTag.from_map` reads.
fn tag_dict(py: Python<'_>, tag: BlobTag) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    d.set_item("dataset", tag.dataset)?;
    d.set_item("path", tag.path)?;
    for (k, v) in [("name", tag.name), ("digest", tag.digest), ("version", tag.version)] {
        if let Some(v) = v {
            d.set_item(k, v)?;
        }
    }
    if let Some(size) = tag.size {
        d.set_item("size", size)?;
    }
    Ok(d.unbind())
}

fn bytes_of(py: Python<'_>, data: Bytes) -> PyResult<Py<PyAny>> {
    Ok(PyBytes::new(py, &data).into_any().unbind())
}

#[pymethods]
impl DataBlob {
    /// The dataset it belongs to.
    #[getter]
    fn dataset(&self) -> DataSetInfo {
        info(self.blob.dataset())
    }

    /// Its path within the dataset (`""` for a Blob dataset).
    #[getter]
    fn path(&self) -> &str {
        self.blob.path()
    }

    /// Where the bytes of the last whole read came from.
    #[getter]
    fn last_origin(&self) -> Option<&'static str> {
        self.blob.last_origin().map(|o| o.as_str())
    }

    /// The tag for what this handle knows now (size, digest and version once read).
    fn tag(&self, py: Python<'_>) -> PyResult<Py<PyDict>> {
        tag_dict(py, self.blob.tag())
    }

    /// Read `id`: the tag after learning the size and version (one HEAD unless known).
    fn describe(&self, id: u64) -> PyResult<()> {
        let blob = self.blob.clone();
        spawn(id, async move {
            finish(blob.describe().await, |py, tag| Ok(tag_dict(py, tag)?.into_any()))
        })
    }

    /// Read `id`: the object's size in bytes.
    fn size(&self, id: u64) -> PyResult<()> {
        let blob = self.blob.clone();
        spawn(id, async move {
            finish(blob.size().await, |py, n| Ok(n.into_pyobject(py)?.into_any().unbind()))
        })
    }

    /// Read `id`: the whole object, checked against the tag it was opened from.
    fn read_all(&self, id: u64) -> PyResult<()> {
        let blob = self.blob.clone();
        spawn(id, async move { finish(blob.read_all().await, bytes_of) })
    }

    /// Read `id`: bytes `start .. end` (only the blocks they touch are fetched).
    fn read_range(&self, start: u64, end: u64, id: u64) -> PyResult<()> {
        let blob = self.blob.clone();
        spawn(id, async move { finish(blob.read_range(start..end).await, bytes_of) })
    }
}

/// A folder (or prefix) of a BlobTree dataset.
#[pyclass(module = "handoff._native", frozen)]
pub struct DataTree {
    tree: BlobTree,
}

impl From<BlobTree> for DataTree {
    fn from(tree: BlobTree) -> Self {
        DataTree { tree }
    }
}

/// Entries as `(path, is_dir, size)`.
fn listed(py: Python<'_>, entries: Vec<TreeEntry>) -> PyResult<Py<PyAny>> {
    let rows: Vec<(String, bool, Option<u64>)> = entries.into_iter().map(|e| (e.path, e.is_dir, e.size)).collect();
    Ok(rows.into_pyobject(py)?.into_any().unbind())
}

#[pymethods]
impl DataTree {
    /// The dataset it belongs to.
    #[getter]
    fn dataset(&self) -> DataSetInfo {
        info(self.tree.dataset())
    }

    /// Its path within the dataset (`""` for the dataset's root).
    #[getter]
    fn path(&self) -> &str {
        self.tree.path()
    }

    /// The folder `rel` below this one (`..` may not leave the dataset).
    fn join(&self, rel: &str) -> PyResult<DataTree> {
        Ok(self.tree.join(rel).map_err(to_py)?.into())
    }

    /// The file `rel` below this folder.
    fn blob(&self, rel: &str) -> PyResult<DataBlob> {
        Ok(self.tree.blob(rel).map_err(to_py)?.into())
    }

    /// Read `id`: the files and folders directly in this folder, sorted by path.
    fn list(&self, id: u64) -> PyResult<()> {
        let tree = self.tree.clone();
        spawn(id, async move { finish(tree.list().await, listed) })
    }

    /// Read `id`: every file below this folder, recursively, sorted by path.
    fn walk(&self, id: u64) -> PyResult<()> {
        let tree = self.tree.clone();
        spawn(id, async move { finish(tree.walk().await, listed) })
    }
}
