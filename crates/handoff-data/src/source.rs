//! A dataset's storage, opened: a local folder read in place, or an `object_store` store with a root prefix.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path as StorePath;
use object_store::{ObjectStore, RetryConfig};

use crate::relpath::{join_store_path, raw_store_path};
use crate::storage::StorageConfig;

/// Url schemes enabled by this build's cargo features beyond s3, http(s), file and memory.
#[cfg(all(feature = "gcp", feature = "azure"))]
pub(crate) const EXTRA_SCHEMES: &str = ", gs://, az://";
/// Url schemes enabled by this build's cargo features beyond s3, http(s), file and memory.
#[cfg(all(feature = "gcp", not(feature = "azure")))]
pub(crate) const EXTRA_SCHEMES: &str = ", gs://";
/// Url schemes enabled by this build's cargo features beyond s3, http(s), file and memory.
#[cfg(all(not(feature = "gcp"), feature = "azure"))]
pub(crate) const EXTRA_SCHEMES: &str = ", az://";
/// Url schemes enabled by this build's cargo features beyond s3, http(s), file and memory.
#[cfg(not(any(feature = "gcp", feature = "azure")))]
pub(crate) const EXTRA_SCHEMES: &str = "";

/// How a source reaches its bytes.
#[derive(Debug)]
pub(crate) enum Backend {
    /// DataSets.jl's FileSystem driver: read the files in place.
    Local {
        /// The dataset's file or folder.
        root: PathBuf,
    },
    /// An object store, read through the cache.
    Store {
        /// The store.
        store: Arc<dyn ObjectStore>,
        /// The dataset's object or prefix within the store.
        root: StorePath,
        /// For `file://` urls, the local path of `root` (used to refuse symlinks out of a tree).
        local_root: Option<PathBuf>,
    },
}

/// A dataset's opened storage and the identity that keys its cache entries.
#[derive(Debug)]
pub struct Source {
    identity: String,
    pub(crate) backend: Backend,
}

static MEMORY_INSTANCE: AtomicU64 = AtomicU64::new(0);

impl Source {
    /// A source behind an object store that has no local files.
    fn remote(identity: String, store: Arc<dyn ObjectStore>, root: StorePath) -> Source {
        Source {
            identity,
            backend: Backend::Store {
                store,
                root,
                local_root: None,
            },
        }
    }

    /// Opens the storage a catalog entry describes. The error is a message; the catalog adds file and dataset.
    pub(crate) fn open(
        config: &StorageConfig,
        memory: &mut HashMap<String, Arc<object_store::memory::InMemory>>,
    ) -> Result<Source, String> {
        match config {
            StorageConfig::FileSystem { path } => Ok(Source {
                identity: format!("file://{}", path.display()),
                backend: Backend::Local { root: path.clone() },
            }),
            StorageConfig::ObjectStore { url, options } => open_url(url, options, memory),
            StorageConfig::TomlData { content } => {
                let (store, root) = content.store()?;
                Ok(Source::remote(content.identity(), store, root))
            }
            // Never read: the catalog refuses to open it. An empty store stands in.
            StorageConfig::Unavailable { driver } => Ok(Source::remote(
                format!("unavailable:{driver}"),
                Arc::new(object_store::memory::InMemory::new()),
                StorePath::from(""),
            )),
        }
    }

    /// The identity of the storage (store url with endpoint): part of every cache key.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The object store, unless this is a FileSystem (read in place) source.
    pub fn object_store(&self) -> Option<Arc<dyn ObjectStore>> {
        match &self.backend {
            Backend::Local { .. } => None,
            Backend::Store { store, .. } => Some(store.clone()),
        }
    }

    /// The local path of `rel` below the root, for FileSystem sources and `file://` stores.
    pub(crate) fn local_path(&self, rel: &str) -> Option<PathBuf> {
        let root = match &self.backend {
            Backend::Local { root } => root,
            Backend::Store {
                local_root: Some(root), ..
            } => root,
            Backend::Store { .. } => return None,
        };
        Some(if rel.is_empty() { root.clone() } else { root.join(rel) })
    }

    /// The local root, for FileSystem sources and `file://` stores.
    pub(crate) fn local_root(&self) -> Option<&std::path::Path> {
        match &self.backend {
            Backend::Local { root } => Some(root),
            Backend::Store { local_root, .. } => local_root.as_deref(),
        }
    }

    /// The object path of `rel` (already normalized) below the store root, as requests to the store name it: the
    /// parts of `rel` verbatim, so that a file `é.txt` of a tree is the object `…/é.txt` (see [`Source::key_path`]
    /// for the cache's spelling).
    pub fn object_path(&self, rel: &str) -> StorePath {
        match &self.backend {
            Backend::Store { root, .. } => raw_store_path(root, rel),
            Backend::Local { .. } => StorePath::from(rel),
        }
    }

    /// The object path of `rel` as cache keys spell it (spec/CACHE.md §2.3): the parts of `rel` percent-encoded as
    /// `object_store` encodes them. `key_path("")` is the root, under which the cache's entries for this dataset lie
    /// (`handoff data ls` counts them so).
    pub fn key_path(&self, rel: &str) -> StorePath {
        match &self.backend {
            Backend::Store { root, .. } => join_store_path(root, rel),
            Backend::Local { .. } => StorePath::from(rel),
        }
    }
}

fn retry() -> RetryConfig {
    RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(20),
        ..Default::default()
    }
}

fn open_url(
    url: &str,
    options: &std::collections::BTreeMap<String, String>,
    memory: &mut HashMap<String, Arc<object_store::memory::InMemory>>,
) -> Result<Source, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("not a url ({e})"))?;
    let url_path = parsed.path().trim_matches('/').to_string();
    let root = StorePath::from_url_path(&url_path).map_err(|e| e.to_string())?;
    match parsed.scheme() {
        "s3" | "s3a" => {
            use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
            let mut b = AmazonS3Builder::from_env().with_url(url).with_retry(retry());
            for (k, v) in options {
                let key: AmazonS3ConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_option(k, "s3"))?;
                b = b.with_config(key, v);
            }
            let endpoint = b.get_config_value(&AmazonS3ConfigKey::Endpoint);
            if endpoint.as_deref().is_some_and(|e| e.starts_with("http://")) && !options.contains_key("allow_http") {
                b = b.with_config(
                    AmazonS3ConfigKey::Client(object_store::ClientConfigKey::AllowHttp),
                    "true",
                );
            }
            let store = b.build().map_err(|e| e.to_string())?;
            let bucket = parsed.host_str().unwrap_or_default();
            let identity = match endpoint {
                Some(e) => format!("s3://{bucket}/{url_path}?endpoint={e}"),
                None => format!("s3://{bucket}/{url_path}"),
            };
            Ok(Source::remote(identity, Arc::new(store), root))
        }
        "http" | "https" => {
            use object_store::http::HttpBuilder;
            use object_store::ClientConfigKey;
            let origin = &parsed[..url::Position::BeforePath];
            let mut b = HttpBuilder::new().with_url(origin).with_retry(retry());
            if parsed.scheme() == "http" && !options.contains_key("allow_http") {
                b = b.with_config(ClientConfigKey::AllowHttp, "true");
            }
            for (k, v) in options {
                let key: ClientConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_option(k, "http"))?;
                b = b.with_config(key, v);
            }
            let store = b.build().map_err(|e| e.to_string())?;
            let identity = format!("{origin}/{url_path}");
            Ok(Source::remote(identity, Arc::new(store), root))
        }
        "file" => {
            let local = parsed
                .to_file_path()
                .map_err(|_| "file:// url must hold an absolute local path".to_string())?;
            let store = object_store::local::LocalFileSystem::new();
            let root = StorePath::from_absolute_path(&local).map_err(|e| e.to_string())?;
            let identity = format!("file://{}", local.display());
            Ok(Source {
                identity,
                backend: Backend::Store {
                    store: Arc::new(store),
                    root,
                    local_root: Some(local),
                },
            })
        }
        "memory" => {
            let name = parsed.host_str().unwrap_or_default().to_string();
            let store = memory
                .entry(name.clone())
                .or_insert_with(|| Arc::new(object_store::memory::InMemory::new()));
            let instance = MEMORY_INSTANCE.fetch_add(1, Ordering::Relaxed);
            let identity = format!("memory://{name}/{url_path}#{}-{instance}", std::process::id());
            Ok(Source {
                identity,
                backend: Backend::Store {
                    store: store.clone(),
                    root,
                    local_root: None,
                },
            })
        }
        #[cfg(feature = "gcp")]
        "gs" => {
            use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url).with_retry(retry());
            for (k, v) in options {
                let key: GoogleConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_option(k, "gcs"))?;
                b = b.with_config(key, v);
            }
            let store = b.build().map_err(|e| e.to_string())?;
            let identity = format!("gs://{}/{url_path}", parsed.host_str().unwrap_or_default());
            Ok(Source::remote(identity, Arc::new(store), root))
        }
        #[cfg(feature = "azure")]
        "az" | "azure" | "abfs" | "abfss" | "adl" => {
            use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url).with_retry(retry());
            for (k, v) in options {
                let key: AzureConfigKey = k.to_ascii_lowercase().parse().map_err(|_| unknown_option(k, "azure"))?;
                b = b.with_config(key, v);
            }
            let store = b.build().map_err(|e| e.to_string())?;
            let identity = format!(
                "{}://{}/{url_path}",
                parsed.scheme(),
                parsed.host_str().unwrap_or_default()
            );
            Ok(Source::remote(identity, Arc::new(store), root))
        }
        other => Err(format!(
            "unsupported url scheme {other:?}; use s3://, http(s)://, file://, memory://{EXTRA_SCHEMES} \
             (gs:// and az:// need handoff-data's cargo features \"gcp\" and \"azure\")"
        )),
    }
}

fn unknown_option(key: &str, store: &str) -> String {
    format!("unknown {store} option {key:?} in [datasets.storage.options] (see object_store's config keys for {store})")
}
