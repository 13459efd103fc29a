//! One dataset of a catalog, as a Python object.

use std::sync::Arc;

use handoff_data::DataSet;
use pyo3::prelude::*;

/// One dataset of a catalog, as written and checked.
#[pyclass(module = "handoff._native", frozen)]
pub struct DataSetInfo {
    pub(crate) dataset: Arc<DataSet>,
}

pub(crate) fn info(dataset: &Arc<DataSet>) -> DataSetInfo {
    DataSetInfo {
        dataset: dataset.clone(),
    }
}

#[pymethods]
impl DataSetInfo {
    #[getter]
    fn name(&self) -> &str {
        self.dataset.name()
    }
    #[getter]
    fn uuid(&self) -> &str {
        self.dataset.uuid()
    }
    #[getter]
    fn description(&self) -> Option<&str> {
        self.dataset.description()
    }
    /// `"Blob"` or `"BlobTree"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.dataset.kind().as_str()
    }
    #[getter]
    fn driver(&self) -> &str {
        self.dataset.storage().driver()
    }
    /// Whether this build reads its driver.
    #[getter]
    fn available(&self) -> bool {
        self.dataset.storage().is_available()
    }
    /// Why the name breaks DataSets.jl's rule, if it does.
    #[getter]
    fn invalid_name(&self) -> Option<&str> {
        self.dataset.invalid_name()
    }
    /// The storage's identity: what the cache keys its objects by.
    #[getter]
    fn identity(&self) -> &str {
        self.dataset.source().identity()
    }
    /// Where the storage is: a path, a url, or the catalog's embedded data.
    #[getter]
    fn location(&self) -> String {
        self.dataset.storage().location()
    }
    /// `[datasets.storage]` as written, as JSON.
    #[getter]
    fn storage_json(&self) -> PyResult<String> {
        serde_json::to_string(self.dataset.storage_table())
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
    }
}
