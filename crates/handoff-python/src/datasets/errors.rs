//! `handoff-data`'s errors as the exceptions of `handoff.datasets`.
//!
//! The Python package registers one factory, `(kind, message) -> exception`, at import; each
//! error of the Rust crate is given a kind that names its exception class there.

use std::sync::Mutex;

use handoff_data::{Error, SpecError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The factory `handoff.datasets` registered.
static FACTORY: Mutex<Option<Py<PyAny>>> = Mutex::new(None);

/// Registers `factory(kind, message)`, which returns the exception to raise.
#[pyfunction]
pub fn data_set_errors(factory: Py<PyAny>) {
    *FACTORY.lock().unwrap_or_else(|e| e.into_inner()) = Some(factory);
}

/// The kind `handoff.datasets` maps to an exception class.
fn kind(e: &Error) -> &'static str {
    match e {
        Error::Catalog(_) | Error::WrongType { .. } => "catalog",
        Error::Ambiguous { .. } => "ambiguous",
        Error::DriverUnavailable { .. } => "driver-unavailable",
        Error::InvalidSpec(_) => "invalid-spec",
        Error::InvalidName { .. } => "invalid-name",
        Error::NoSuchPath { .. } | Error::FragmentOfBlob { .. } => "no-such-path",
        Error::NoSuchDataset { .. } | Error::NoSuchDatasetInStack { .. } | Error::UnknownTag { .. } => {
            "no-such-dataset"
        }
        Error::BadPath { .. } => "bad-path",
        Error::Range { .. } => "range",
        Error::NotFound { .. } | Error::Storage { .. } | Error::Offline { .. } | Error::Io { .. } => "storage",
        _ => "blob",
    }
}

/// The exception for `(kind, message)`: the registered factory's, else a `ValueError`.
pub(crate) fn raise(kind: &str, message: String) -> PyErr {
    Python::attach(|py| {
        let factory = FACTORY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|f| f.clone_ref(py));
        match factory.map(|f| f.call1(py, (kind, message.as_str()))) {
            Some(Ok(exc)) => PyErr::from_value(exc.into_bound(py)),
            Some(Err(e)) => e,
            None => PyValueError::new_err(message),
        }
    })
}

/// A `handoff-data` error as its Python exception.
pub(crate) fn to_py(e: Error) -> PyErr {
    raise(kind(&e), e.to_string())
}

/// A spec that is not one, as `InvalidSpec`.
pub(crate) fn spec_to_py(e: SpecError) -> PyErr {
    raise("invalid-spec", e.to_string())
}
