//! `handoff.datasets` on `handoff-data`: DataSets.jl catalogs, stacks, specs, names, the
//! shared cache, and lazy blob and tree handles, the same implementation as the Rust CLI's.
//! Reads run on a small tokio runtime of their own; the event loop learns of their results
//! through a wake pipe (see [`runtime`]).

use pyo3::prelude::*;

mod catalog;
mod dataset;
mod errors;
mod handles;
mod runtime;

/// Adds the data layer's classes and functions to `handoff._native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<catalog::DataCache>()?;
    m.add_class::<catalog::DataCatalogs>()?;
    m.add_class::<dataset::DataSetInfo>()?;
    m.add_class::<handles::DataBlob>()?;
    m.add_class::<handles::DataTree>()?;
    m.add_function(wrap_pyfunction!(errors::data_set_errors, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::data_wake_fd, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::data_completions, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::data_cancel, m)?)?;
    m.add_function(wrap_pyfunction!(catalog::data_parse_spec, m)?)?;
    m.add_function(wrap_pyfunction!(catalog::data_check_name, m)?)?;
    m.add_function(wrap_pyfunction!(catalog::data_paths_of, m)?)?;
    m.add_function(wrap_pyfunction!(catalog::data_local_file, m)?)?;
    m.add("DATA_DRIVERS", handoff_data::DRIVERS.to_vec())?;
    m.add("DATA_NAME_RULE", handoff_data::NAME_RULE)?;
    Ok(())
}
