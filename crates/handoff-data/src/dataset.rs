//! One dataset of a catalog: its `[[datasets]]` entry parsed and checked (name, uuid, type, storage), and its
//! storage opened as a [`Source`]. The catalog holds a list of these; blobs and trees read through them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::embedded::Embedded;
use crate::error::{CatalogError, Result};
use crate::kind::DataKind;
use crate::source::Source;
use crate::storage::StorageConfig;

/// One dataset of a catalog.
#[derive(Debug)]
pub struct DataSet {
    name: String,
    invalid_name: Option<String>,
    uuid: String,
    description: Option<String>,
    kind: DataKind,
    storage: StorageConfig,
    storage_table: toml::Table,
    table: toml::Table,
    source: Arc<Source>,
}

impl DataSet {
    /// The dataset's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Why the name breaks DataSets.jl's rule ([`crate::name`]), if it does: such a dataset is listed and
    /// cannot be opened.
    pub fn invalid_name(&self) -> Option<&str> {
        self.invalid_name.as_deref()
    }
    /// The dataset's uuid, lower case.
    pub fn uuid(&self) -> &str {
        &self.uuid
    }
    /// The description, if the catalog has one.
    pub fn description(&self) -> Option<&str> {
        self.description.as_deref()
    }
    /// `Blob` or `BlobTree`.
    pub fn kind(&self) -> DataKind {
        self.kind
    }
    /// The parsed storage configuration.
    pub fn storage(&self) -> &StorageConfig {
        &self.storage
    }
    /// Every key of `[datasets.storage]` as written, including driver-specific keys handoff does not use.
    pub fn storage_table(&self) -> &toml::Table {
        &self.storage_table
    }
    /// The whole `[[datasets]]` entry as written, including keys handoff does not use (DataSets.jl's `tags`,
    /// `layers`, ...).
    pub fn table(&self) -> &toml::Table {
        &self.table
    }
    /// The opened storage of this dataset.
    pub fn source(&self) -> &Arc<Source> {
        &self.source
    }
    /// The underlying object store (for tools and tests); `None` for the `FileSystem` driver.
    pub fn object_store(&self) -> Option<Arc<dyn object_store::ObjectStore>> {
        self.source.object_store()
    }
}

/// A catalog error about one field of one dataset.
pub(crate) fn field_err(file: &Path, dataset: &str, field: &str, problem: &str) -> CatalogError {
    CatalogError::Field {
        file: file.to_path_buf(),
        dataset: dataset.to_string(),
        field: field.to_string(),
        problem: problem.to_string(),
    }
}

fn string_field<'a>(file: &Path, label: &str, table: &'a toml::Table, key: &str, prefix: &str) -> Result<&'a str> {
    match table.get(key) {
        Some(toml::Value::String(s)) if !s.is_empty() => Ok(s),
        Some(toml::Value::String(_)) => Err(field_err(file, label, &format!("{prefix}{key}"), "is empty").into()),
        Some(_) => Err(field_err(file, label, &format!("{prefix}{key}"), "must be a string").into()),
        None => Err(field_err(file, label, &format!("{prefix}{key}"), "is missing").into()),
    }
}

/// Parses the `index`th `[[datasets]]` entry of `file` (whose folder is `dir`) and opens its storage; `memory`
/// shares `memory://` stores between the catalog's datasets.
pub(crate) fn parse_dataset(
    file: &Path,
    dir: &Path,
    index: usize,
    entry: &toml::Value,
    memory: &mut HashMap<String, Arc<object_store::memory::InMemory>>,
) -> Result<DataSet> {
    let position = format!("#{}", index + 1);
    let table = entry
        .as_table()
        .ok_or_else(|| field_err(file, &position, "[[datasets]]", "must be a table"))?;
    let name = string_field(file, &position, table, "name", "")?.to_string();
    let label = format!("{position} ({name})");
    let uuid = string_field(file, &label, table, "uuid", "")?;
    let uuid = check_uuid(uuid).ok_or_else(|| {
        field_err(
            file,
            &label,
            "uuid",
            &format!("{uuid:?} is not a uuid (like b498f769-a7f6-4f67-8d74-40b770398f26)"),
        )
    })?;
    let description = match table.get("description") {
        None => None,
        Some(toml::Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(field_err(file, &label, "description", "must be a string").into()),
    };
    let storage_table = match table.get("storage") {
        Some(toml::Value::Table(t)) => t.clone(),
        Some(_) => return Err(field_err(file, &label, "storage", "must be a table ([datasets.storage])").into()),
        None => return Err(field_err(file, &label, "storage", "is missing: add a [datasets.storage] table").into()),
    };
    let kind = match string_field(file, &label, &storage_table, "type", "storage.")? {
        "Blob" | "File" => DataKind::Blob,
        "BlobTree" | "FileTree" => DataKind::BlobTree,
        other => {
            return Err(field_err(
                file,
                &label,
                "storage.type",
                &format!("is {other:?}; use \"Blob\" or \"BlobTree\""),
            )
            .into())
        }
    };
    let driver = string_field(file, &label, &storage_table, "driver", "storage.")?;
    let storage = match driver {
        "FileSystem" => {
            let raw = string_field(file, &label, &storage_table, "path", "storage.")?;
            StorageConfig::FileSystem {
                path: expand_dir(raw, dir),
            }
        }
        "ObjectStore" => {
            let url = string_field(file, &label, &storage_table, "url", "storage.")?.to_string();
            let mut options = BTreeMap::new();
            match storage_table.get("options") {
                None => {}
                Some(toml::Value::Table(t)) => {
                    for (k, v) in t {
                        let v = match v {
                            toml::Value::String(s) => s.clone(),
                            toml::Value::Integer(_) | toml::Value::Boolean(_) | toml::Value::Float(_) => v.to_string(),
                            _ => {
                                let f = format!("storage.options.{k}");
                                return Err(field_err(file, &label, &f, "must be a string, number or boolean").into());
                            }
                        };
                        options.insert(k.clone(), v);
                    }
                }
                Some(_) => return Err(field_err(file, &label, "storage.options", "must be a table").into()),
            }
            StorageConfig::ObjectStore { url, options }
        }
        "TomlDataStorage" => StorageConfig::TomlData {
            content: Embedded::parse(kind, storage_table.get("data"))
                .map_err(|problem| field_err(file, &label, "storage.data", &problem))?,
        },
        other => StorageConfig::Unavailable {
            driver: other.to_string(),
        },
    };
    let source = Source::open(&storage, memory).map_err(|message| CatalogError::Store {
        file: file.to_path_buf(),
        dataset: label.clone(),
        url: storage.location(),
        message,
    })?;
    Ok(DataSet {
        invalid_name: crate::name::check_name(&name).err(),
        name,
        uuid,
        description,
        kind,
        storage,
        storage_table,
        table: table.clone(),
        source: Arc::new(source),
    })
}

/// Expands DataSets.jl's `@__DIR__` (the catalog's folder); a relative path is taken relative to that folder too.
fn expand_dir(raw: &str, dir: &Path) -> PathBuf {
    let expanded = match raw.strip_prefix("@__DIR__") {
        Some(rest) => dir.join(rest.trim_start_matches(['/', '\\'])),
        None => PathBuf::from(raw),
    };
    if expanded.is_absolute() {
        expanded
    } else {
        dir.join(expanded)
    }
}

/// Checks the 8-4-4-4-12 hex form and returns it in lower case.
fn check_uuid(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        };
        if !ok {
            return None;
        }
    }
    Some(s.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_dir() {
        assert_eq!(
            expand_dir("@__DIR__/data/x.txt", Path::new("/c")),
            PathBuf::from("/c/data/x.txt")
        );
        assert_eq!(expand_dir("rel/x", Path::new("/c")), PathBuf::from("/c/rel/x"));
        assert_eq!(expand_dir("/abs/x", Path::new("/c")), PathBuf::from("/abs/x"));
    }

    #[test]
    fn uuids() {
        assert_eq!(
            check_uuid("B498F769-a7f6-4f67-8d74-40b770398f26").unwrap(),
            "b498f769-a7f6-4f67-8d74-40b770398f26"
        );
        assert!(check_uuid("b498f769a7f64f678d7440b770398f26").is_none());
        assert!(check_uuid("g498f769-a7f6-4f67-8d74-40b770398f26").is_none());
    }
}
