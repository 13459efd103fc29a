//! Catalogs, stacks of them, their datasets and the cache, as Python objects.

use std::path::PathBuf;
use std::sync::Arc;

use handoff_data::{BlobTag, Cache, CacheConfig, Catalog, CatalogStack, DataSpec, Opened, Selection};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::dataset::{info, DataSetInfo};
use super::errors::{spec_to_py, to_py};
use super::handles::{DataBlob, DataTree};
use super::runtime::{finish, spawn};

/// A cache folder (spec/CACHE.md), shared by the processes of both languages that open it.
#[pyclass(module = "handoff._native", frozen)]
pub struct DataCache {
    pub(crate) cache: Arc<Cache>,
}

#[pymethods]
impl DataCache {
    /// Opens (creating it if needed) the cache in `directory` (default: `$HANDOFF_CACHE_DIR`,
    /// else `$XDG_CACHE_HOME/handoff/data`, else `~/.cache/handoff/data`).
    #[new]
    #[pyo3(signature = (directory=None, max_bytes=None, offline=false))]
    fn new(py: Python<'_>, directory: Option<PathBuf>, max_bytes: Option<u64>, offline: bool) -> PyResult<Self> {
        let dir = directory.unwrap_or_else(CacheConfig::default_dir);
        let config = CacheConfig::new(dir).max_bytes(max_bytes).offline(offline);
        let cache = py.detach(|| Cache::open(config)).map_err(to_py)?;
        Ok(DataCache { cache })
    }

    /// The cache's folder.
    #[getter]
    fn dir(&self) -> PathBuf {
        self.cache.dir().to_path_buf()
    }

    /// The size cap in bytes, if any.
    #[getter]
    fn max_bytes(&self) -> Option<u64> {
        self.cache.max_bytes()
    }

    /// Whether reads that miss the cache fail instead of asking storage.
    #[getter]
    fn get_offline(&self) -> bool {
        self.cache.is_offline()
    }

    #[setter]
    fn set_offline(&self, offline: bool) {
        self.cache.set_offline(offline);
    }

    /// This process's counters: hits, misses, gets, heads, bytes_fetched, evictions, corrupt.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.cache.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("hits", s.hits),
            ("misses", s.misses),
            ("gets", s.gets),
            ("heads", s.heads),
            ("bytes_fetched", s.bytes_fetched),
            ("evictions", s.evictions),
            ("corrupt", s.corrupt),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }
}

/// A catalog, or a stack of them searched in order: the lookups both answer.
enum Lookup {
    One(Arc<Catalog>),
    Stack(CatalogStack),
}

/// A loaded catalog or stack of catalogs.
#[pyclass(module = "handoff._native", frozen)]
pub struct DataCatalogs {
    lookup: Lookup,
}

/// A spec's selection as `(dataset, query, fragment)`.
type Selected = (
    DataSetInfo,
    Option<std::collections::BTreeMap<String, String>>,
    Option<String>,
);

fn selected(sel: &Selection) -> Selected {
    (
        info(sel.dataset()),
        sel.query().cloned(),
        sel.fragment().map(str::to_string),
    )
}

/// What `open` gives: a blob or a tree.
fn opened(py: Python<'_>, o: Opened) -> PyResult<Py<PyAny>> {
    match o {
        Opened::Blob(b) => Ok(Py::new(py, DataBlob::from(b))?.into_any()),
        Opened::Tree(t) => Ok(Py::new(py, DataTree::from(t))?.into_any()),
    }
}

#[pymethods]
impl DataCatalogs {
    /// Reads and checks a catalog file, whose object-store reads go through `cache`.
    #[staticmethod]
    fn load(py: Python<'_>, file: PathBuf, cache: &DataCache) -> PyResult<Self> {
        let cache = cache.cache.clone();
        let c = py.detach(|| Catalog::load(file, cache)).map_err(to_py)?;
        Ok(DataCatalogs {
            lookup: Lookup::One(Arc::new(c)),
        })
    }

    /// Parses catalog text as if read from `file` (whose folder is `@__DIR__`).
    #[staticmethod]
    fn parse(text: &str, file: PathBuf, cache: &DataCache) -> PyResult<Self> {
        let c = Catalog::parse(text, file, cache.cache.clone()).map_err(to_py)?;
        Ok(DataCatalogs {
            lookup: Lookup::One(Arc::new(c)),
        })
    }

    /// Loads each catalog file (or folder holding a `Data.toml`) in order, all with `cache`.
    #[staticmethod]
    fn stack(py: Python<'_>, files: Vec<PathBuf>, cache: &DataCache) -> PyResult<Self> {
        let cache = cache.cache.clone();
        let s = py.detach(|| CatalogStack::load(&files, cache)).map_err(to_py)?;
        Ok(DataCatalogs {
            lookup: Lookup::Stack(s),
        })
    }

    /// The catalog files, in search order.
    fn files(&self) -> Vec<PathBuf> {
        self.catalogs().iter().map(|c| c.file().to_path_buf()).collect()
    }

    /// Each catalog of a stack on its own (a catalog: itself).
    fn each(&self) -> Vec<DataCatalogs> {
        self.catalogs()
            .iter()
            .map(|c| DataCatalogs {
                lookup: Lookup::One(c.clone()),
            })
            .collect()
    }

    /// Every dataset, each as `(catalog file, dataset, file of the catalog that shadows it)`.
    fn entries(&self) -> Vec<(PathBuf, DataSetInfo, Option<PathBuf>)> {
        match &self.lookup {
            Lookup::One(c) => c
                .datasets()
                .iter()
                .map(|d| (c.file().to_path_buf(), info(d), None))
                .collect(),
            Lookup::Stack(s) => s
                .entries()
                .into_iter()
                .map(|e| (e.catalog, info(&e.dataset), e.shadowed_by))
                .collect(),
        }
    }

    /// The dataset a spec names, with the spec's query and fragment.
    fn dataset(&self, spec: &str) -> PyResult<Selected> {
        let sel = match &self.lookup {
            Lookup::One(c) => c.dataset(spec),
            Lookup::Stack(s) => s.dataset(spec),
        };
        Ok(selected(&sel.map_err(to_py)?))
    }

    /// The dataset with this name or uuid in the first catalog that has it, `None` if none has
    /// it; a shared key or a name that breaks the rule is an error.
    fn find(&self, key: &str) -> PyResult<Option<DataSetInfo>> {
        for c in self.catalogs() {
            if let Some(ds) = c.find(key).map_err(to_py)? {
                return Ok(Some(info(ds)));
            }
        }
        Ok(None)
    }

    /// The index of the catalog that answers for a spec, and what it found.
    fn locate(&self, spec: &str) -> PyResult<(usize, Selected)> {
        match &self.lookup {
            Lookup::One(c) => Ok((0, selected(&c.dataset(spec).map_err(to_py)?))),
            Lookup::Stack(s) => {
                let (c, sel) = s.locate(spec).map_err(to_py)?;
                let index = s.catalogs().iter().position(|x| Arc::ptr_eq(x, c)).unwrap_or(0);
                Ok((index, selected(&sel)))
            }
        }
    }

    /// A lazy handle to a Blob dataset, or (with a fragment) to a file of a tree.
    fn blob(&self, spec: &str) -> PyResult<DataBlob> {
        let b = match &self.lookup {
            Lookup::One(c) => c.blob(spec),
            Lookup::Stack(s) => s.blob(spec),
        };
        Ok(b.map_err(to_py)?.into())
    }

    /// A lazy handle to a BlobTree dataset, or (with a fragment) to a folder of it.
    fn tree(&self, spec: &str) -> PyResult<DataTree> {
        let t = match &self.lookup {
            Lookup::One(c) => c.tree(spec),
            Lookup::Stack(s) => s.tree(spec),
        };
        Ok(t.map_err(to_py)?.into())
    }

    /// Read `id`: the blob or the tree a spec opens to (a fragment that names neither fails).
    fn open(&self, spec: String, id: u64) -> PyResult<()> {
        let lookup = match &self.lookup {
            Lookup::One(c) => Lookup::One(c.clone()),
            Lookup::Stack(s) => Lookup::Stack(s.clone()),
        };
        spawn(id, async move {
            let o = match &lookup {
                Lookup::One(c) => c.open(&spec).await,
                Lookup::Stack(s) => s.open(&spec).await,
            };
            finish(o, opened)
        })
    }

    /// Binds a tag received from another node: the dataset of its uuid, the path checked.
    #[pyo3(signature = (dataset, path, name=None, size=None, digest=None, version=None))]
    fn open_tag(
        &self,
        dataset: String,
        path: String,
        name: Option<String>,
        size: Option<u64>,
        digest: Option<String>,
        version: Option<String>,
    ) -> PyResult<DataBlob> {
        let tag = BlobTag {
            dataset,
            name,
            path,
            size,
            digest,
            version,
        };
        let b = match &self.lookup {
            Lookup::One(c) => c.open_tag(&tag),
            Lookup::Stack(s) => s.open_tag(&tag),
        };
        Ok(b.map_err(to_py)?.into())
    }
}

impl DataCatalogs {
    fn catalogs(&self) -> &[Arc<Catalog>] {
        match &self.lookup {
            Lookup::One(c) => std::slice::from_ref(c),
            Lookup::Stack(s) => s.catalogs(),
        }
    }
}

/// `(name, query, fragment)` of a DataSets.jl spec, `name[?query][#fragment]`.
#[pyfunction]
pub fn data_parse_spec(spec: &str) -> PyResult<SpecParts> {
    let s = DataSpec::parse(spec).map_err(spec_to_py)?;
    Ok((s.name, s.query, s.fragment))
}

/// A parsed spec's parts.
pub type SpecParts = (
    String,
    Option<std::collections::BTreeMap<String, String>>,
    Option<String>,
);

/// Why a name breaks DataSets.jl's rule, or `None`.
#[pyfunction]
pub fn data_check_name(name: &str) -> Option<String> {
    handoff_data::check_name(name).err()
}

/// The catalog files a `:`-separated list names, as Julia's `JULIA_DATASETS_PATH` does.
#[pyfunction]
pub fn data_paths_of(list: &str) -> Vec<PathBuf> {
    CatalogStack::paths_of(list)
}

/// The file a tag's `path` names in a local dataset at `root` (a file, or a folder of them),
/// checked as a `FileSystem` dataset's paths are; `what` names the dataset in errors, which
/// are raised as `error(message)`.
#[pyfunction]
pub fn data_local_file(py: Python<'_>, what: &str, root: PathBuf, path: &str, error: Py<PyAny>) -> PyResult<PathBuf> {
    handoff_data::local_file(what, &root, path).map_err(|e| match error.call1(py, (e.to_string(),)) {
        Ok(exc) => PyErr::from_value(exc.into_bound(py)),
        Err(e) => e,
    })
}
