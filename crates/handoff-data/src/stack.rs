//! A stack of catalogs searched in order: DataSets.jl's `StackedDataProject`, which Julia builds from
//! `JULIA_DATASETS_PATH`; handoff builds it from `--catalog` given several times or `$HANDOFF_CATALOG`.
//!
//! A name (or uuid) is looked up in each catalog in turn, and the first catalog that has it answers, as
//! in Julia: a dataset of the same name further down is *shadowed*. What that catalog says is final: a
//! name its datasets share is refused as ambiguous there, and the search does not go on past it.
//!
//! A path list is `:`-separated. Each entry is a `Data.toml` file or a folder holding one; `~` is the home
//! folder. As in Julia, `@` is the active Julia project (the `Data.toml` beside `$JULIA_PROJECT`, skipped
//! when none is set) and an empty entry is `~/.julia/datasets/Data.toml` (skipped when it does not exist).
//! Any other entry must exist: a missing catalog is an error that names it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "node")]
use handoff::Resources;

use crate::blob::Blob;
use crate::cache::Cache;
use crate::catalog::{open_selected, Catalog};
use crate::dataset::DataSet;
use crate::error::{Error, Result};
use crate::selection::{Opened, Selection};
use crate::spec::DataSpec;
use crate::tag::BlobTag;
use crate::tree::BlobTree;

/// Catalogs searched in order (the first is searched first).
#[derive(Debug, Clone)]
pub struct CatalogStack {
    catalogs: Vec<Arc<Catalog>>,
}

/// One dataset of a stack as `data ls` shows it.
#[derive(Debug, Clone)]
pub struct StackEntry {
    /// The catalog file it comes from.
    pub catalog: PathBuf,
    /// The dataset.
    pub dataset: Arc<DataSet>,
    /// The catalog whose dataset of the same name a lookup finds first, when that is not this one.
    pub shadowed_by: Option<PathBuf>,
}

impl CatalogStack {
    /// A stack of loaded catalogs, searched in this order.
    pub fn new(catalogs: impl IntoIterator<Item = Catalog>) -> CatalogStack {
        CatalogStack {
            catalogs: catalogs.into_iter().map(Arc::new).collect(),
        }
    }

    /// Loads each catalog file (or folder holding a `Data.toml`) in order, all with `cache`.
    pub fn load(paths: &[PathBuf], cache: Arc<Cache>) -> Result<CatalogStack> {
        let mut catalogs = Vec::with_capacity(paths.len());
        for p in paths {
            let file = if p.is_dir() { p.join("Data.toml") } else { p.clone() };
            catalogs.push(Catalog::load(file, cache.clone())?);
        }
        Ok(CatalogStack::new(catalogs))
    }

    /// The catalog files a `:`-separated list names (see the module docs for `@`, an empty entry and `~`).
    pub fn paths_of(list: &str) -> Vec<PathBuf> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let mut out = Vec::new();
        for entry in list.split(':') {
            match entry {
                "" => {
                    if let Some(home) = &home {
                        let p = home.join(".julia/datasets/Data.toml");
                        if p.exists() {
                            out.push(p);
                        }
                    }
                }
                "@" => {
                    // Julia takes an empty JULIA_PROJECT as unset: no active project.
                    let project = std::env::var_os("JULIA_PROJECT").filter(|p| !p.is_empty());
                    if let Some(project) = project.map(PathBuf::from) {
                        let dir = if project.is_dir() {
                            project
                        } else {
                            project.parent().map(Path::to_path_buf).unwrap_or_default()
                        };
                        out.push(dir.join("Data.toml"));
                    }
                }
                _ => {
                    let p = match (entry.strip_prefix("~/").or((entry == "~").then_some("")), &home) {
                        (Some(rest), Some(home)) => home.join(rest),
                        _ => PathBuf::from(entry),
                    };
                    out.push(p);
                }
            }
        }
        out
    }

    /// The catalogs, in search order.
    pub fn catalogs(&self) -> &[Arc<Catalog>] {
        &self.catalogs
    }

    /// The catalog that answers for a spec's name, and the dataset it found with the spec's query and
    /// fragment: the first catalog that has the name or uuid.
    pub fn locate(&self, spec: &str) -> Result<(&Arc<Catalog>, Selection)> {
        let parsed = DataSpec::parse(spec)?;
        for catalog in &self.catalogs {
            if let Some(ds) = catalog.find(&parsed.name)? {
                return Ok((catalog, Selection::new(ds.clone(), parsed)));
            }
        }
        Err(Error::NoSuchDatasetInStack {
            key: parsed.name,
            files: self.files(),
            known: self.known_names(),
        })
    }

    /// The dataset a spec names (DataSets.jl's `dataset(stack, spec)`).
    pub fn dataset(&self, spec: &str) -> Result<Selection> {
        Ok(self.locate(spec)?.1)
    }

    /// A lazy `Blob` handle (see [`Catalog::blob`]), from the first catalog that has the name.
    pub fn blob(&self, spec: &str) -> Result<Blob> {
        self.locate(spec)?.0.blob(spec)
    }

    /// A lazy `BlobTree` handle (see [`Catalog::tree`]), from the first catalog that has the name.
    pub fn tree(&self, spec: &str) -> Result<BlobTree> {
        self.locate(spec)?.0.tree(spec)
    }

    /// What a spec opens to (see [`Catalog::open`]), from the first catalog that has the name.
    pub async fn open(&self, spec: &str) -> Result<Opened> {
        let (catalog, sel) = self.locate(spec)?;
        let ds = catalog.available(sel.dataset())?;
        open_selected(ds, sel.fragment(), catalog.cache().clone()).await
    }

    /// Binds a received tag to the first catalog that has its dataset's uuid.
    pub fn open_tag(&self, tag: &BlobTag) -> Result<Blob> {
        let lower = tag.dataset.to_ascii_lowercase();
        match self
            .catalogs
            .iter()
            .find(|c| c.datasets().iter().any(|d| d.uuid() == lower))
        {
            Some(catalog) => catalog.open_tag(tag),
            None => Err(Error::UnknownTag {
                uuid: tag.dataset.clone(),
                name: tag.name.clone().unwrap_or_else(|| "no name given".into()),
                file: PathBuf::from(self.files()),
            }),
        }
    }

    /// Makes every catalog answer for its datasets in a node's resources, in stack order (the first
    /// catalog that has a uuid binds the handles that name it).
    #[cfg(feature = "node")]
    pub fn serve(&self, resources: &Resources) {
        for c in &self.catalogs {
            c.serve(resources);
        }
    }

    /// Every dataset of every catalog in search order, each with the catalog that shadows it, if one does.
    pub fn entries(&self) -> Vec<StackEntry> {
        let mut first: std::collections::HashMap<&str, &Path> = std::collections::HashMap::new();
        let mut out = Vec::new();
        for c in &self.catalogs {
            for d in c.datasets() {
                let owner = *first.entry(d.name()).or_insert(c.file());
                out.push(StackEntry {
                    catalog: c.file().to_path_buf(),
                    dataset: d.clone(),
                    shadowed_by: (owner != c.file()).then(|| owner.to_path_buf()),
                });
            }
        }
        out
    }

    fn files(&self) -> String {
        let files: Vec<String> = self.catalogs.iter().map(|c| c.file().display().to_string()).collect();
        if files.is_empty() {
            "(no catalogs)".into()
        } else {
            files.join(":")
        }
    }

    fn known_names(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for c in &self.catalogs {
            for d in c.datasets() {
                if !names.contains(&d.name()) {
                    names.push(d.name());
                }
            }
        }
        if names.is_empty() {
            "no datasets".into()
        } else {
            names.join(", ")
        }
    }
}
