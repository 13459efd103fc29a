//! `handoff data ls|show|cat|tree|fetch|verify|gc`: the data commands over a stack of catalogs and their cache.
//!
//! `main` mounts [`Args`] as the `data` subcommand and calls [`run`].

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};

use handoff_data::{Blob, Cache, CacheConfig, CatalogStack, DataSet, Opened, StorageConfig, TreeEntry, DRIVERS};

/// Arguments of `handoff data`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// A catalog, a DataSets.jl Data.toml (or a folder holding one); give it several times for a stack
    /// searched in order (default: $HANDOFF_CATALOG, a `:`-separated list, else ./Data.toml).
    #[arg(long, global = true, value_name = "FILE")]
    pub catalog: Vec<PathBuf>,
    /// The cache directory (default: $HANDOFF_CACHE_DIR, else $XDG_CACHE_HOME/handoff/data).
    #[arg(long, global = true, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Serve only what is cached; never contact storage.
    #[arg(long, global = true)]
    pub offline: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The data subcommands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum Command {
    /// List the datasets, the catalog each comes from, and what the cache holds of each.
    Ls {
        /// Print one JSON document instead: `catalogs` (file, number of datasets), `datasets` (per dataset its
        /// name, uuid, type, driver, description and what the table shows) and `cache`.
        #[arg(long)]
        json: bool,
    },
    /// Show what a spec selects, as DataSets.jl's `dataset(project, spec)`: the dataset (name, uuid, type, driver,
    /// catalog), the spec's query and fragment, and what it opens to (a blob and its size, or a tree).
    Show {
        /// The dataset spec, e.g. `a_tree_example?x=1#1.csv` or a uuid.
        spec: String,
        /// Print one JSON document: `spec`, `dataset`, `uuid`, `type`, `driver`, `catalog`, `query`, `fragment`,
        /// `opens` (`Blob` or `BlobTree`), `path` (within the dataset) and `size` (a blob's bytes).
        #[arg(long)]
        json: bool,
    },
    /// Write a blob's bytes to standard output (through the cache for remote storage), as Julia's
    /// `open(String, dataset(spec))`. SPEC is `name[?query][#fragment]`; in a tree the fragment names the file.
    Cat {
        /// The dataset spec, e.g. `a_tree_example#1.csv`.
        spec: String,
    },
    /// List a tree: every file below it with its size (DataSets.jl's walk), or with --list what lies directly in
    /// it (folders end in `/`, as DataSets.jl's readdir). SPEC is a BlobTree dataset, or `name#folder`.
    Tree {
        /// The dataset spec, e.g. `a_tree_example` or `embedded_tree#d01`.
        spec: String,
        /// Only the files and folders directly in the tree.
        #[arg(long)]
        list: bool,
        /// Print one JSON document: `dataset`, `uuid`, `catalog`, `path` (the folder within the dataset), `list`
        /// (entries directly in it: `path`, `is_dir`, `size`) and `walk` (every file below: `path`, `size`).
        #[arg(long)]
        json: bool,
    },
    /// Download datasets into the cache (all of them when none is named).
    Fetch {
        /// Dataset specs (names or uuids, with `#path` for part of a tree).
        names: Vec<String>,
    },
    /// Re-hash every cached file and report corrupt ones.
    Verify {
        /// Remove corrupt files (they are fetched again on next use).
        #[arg(long)]
        repair: bool,
    },
    /// Evict least recently used entries (not those in use) until the cache holds at most SIZE.
    Gc {
        /// Target size: bytes, or with a unit (K, M, G, T; powers of 1024), e.g. 10G; 0 empties the cache.
        #[arg(long, value_name = "SIZE")]
        to: String,
    },
}

/// Runs a data command, writing its report to stdout (progress bars go to stderr on a terminal).
pub async fn run(args: Args) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    run_to(args, &mut out).await
}

/// Runs a data command, writing its report to `out`.
pub async fn run_to(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let dir = args.cache_dir.clone().unwrap_or_else(CacheConfig::default_dir);
    let cache = Cache::open(CacheConfig::new(&dir).offline(args.offline))?;
    if let Command::Gc { to } = &args.command {
        // gc needs no catalog.
        let target = parse_size(to)?;
        let c = cache.clone();
        let report = tokio::task::spawn_blocking(move || c.evict_to(target)).await??;
        writeln!(
            out,
            "gc {}: {} -> {} ({} evicted, {} in use kept)",
            dir.display(),
            human(report.before_bytes),
            human(report.after_bytes),
            report.evicted,
            report.skipped_in_use
        )?;
        return Ok(());
    }
    if let Command::Verify { repair } = args.command {
        let c = cache.clone();
        let report = tokio::task::spawn_blocking(move || c.verify(repair)).await??;
        for bad in &report.corrupt {
            let fate = if bad.removed {
                "removed"
            } else {
                "kept (use --repair to remove)"
            };
            writeln!(
                out,
                "CORRUPT {}: expected {}, found {}; {fate}",
                bad.file.display(),
                bad.expected,
                bad.actual
            )?;
        }
        writeln!(
            out,
            "verified {} files ({}) in {}: {} corrupt",
            report.checked,
            human(report.bytes),
            dir.display(),
            report.corrupt.len()
        )?;
        if !report.corrupt.is_empty() && !repair {
            bail!(
                "{} corrupt cache files in {}; run `handoff data verify --repair`",
                report.corrupt.len(),
                dir.display()
            );
        }
        return Ok(());
    }
    let stack = load_stack(&args.catalog, cache.clone())?;
    match args.command {
        Command::Ls { json } => ls(&stack, &cache, json, out),
        Command::Show { spec, json } => show(&stack, &spec, json, out).await,
        Command::Cat { spec } => cat(&stack, &spec, out).await,
        Command::Tree { spec, list, json } => tree(&stack, &spec, list, json, out).await,
        Command::Fetch { names } => fetch(&stack, &cache, &names, out).await,
        Command::Gc { .. } | Command::Verify { .. } => unreachable!("handled above"),
    }
}

/// The catalogs given with `--catalog`, else those `$HANDOFF_CATALOG` lists, else `./Data.toml`.
fn load_stack(given: &[PathBuf], cache: Arc<Cache>) -> anyhow::Result<CatalogStack> {
    if !given.is_empty() {
        return Ok(CatalogStack::load(given, cache)?);
    }
    if let Some(list) = std::env::var_os("HANDOFF_CATALOG") {
        let list = list.to_string_lossy();
        let paths = CatalogStack::paths_of(&list);
        if paths.is_empty() {
            bail!("$HANDOFF_CATALOG is {list:?}, which names no catalog file");
        }
        return CatalogStack::load(&paths, cache).with_context(|| format!("loading $HANDOFF_CATALOG ({list})"));
    }
    CatalogStack::load(&[PathBuf::from("Data.toml")], cache).with_context(|| {
        "no catalog was given, so Data.toml in the current folder was read; give one with --catalog FILE \
         or $HANDOFF_CATALOG"
    })
}

fn storage_text(ds: &DataSet) -> String {
    match ds.storage() {
        StorageConfig::FileSystem { path } => format!("FileSystem {}", path.display()),
        StorageConfig::ObjectStore { url, .. } => url.clone(),
        s @ StorageConfig::TomlData { .. } => format!("TomlDataStorage {}", s.location()),
        StorageConfig::Unavailable { driver } => format!("driver {driver}"),
    }
}

/// What `data ls` shows of one dataset: the cells of its row, and its JSON object.
struct Listed {
    row: Vec<String>,
    description: Option<String>,
    json: serde_json::Value,
}

fn ls(stack: &CatalogStack, cache: &Cache, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let entries = cache.entries();
    let blocks = cache.block_sets();
    let several = stack.catalogs().len() > 1;
    // A catalog by its place in the stack (the lines above the table say which file each is).
    let index = |file: &std::path::Path| stack.catalogs().iter().position(|c| c.file() == file).unwrap_or(0);
    let place = |file: &std::path::Path| format!("#{}", index(file) + 1);
    let mut listed: Vec<Listed> = Vec::new();
    for e in &stack.entries() {
        let ds = &e.dataset;
        let mut counts = serde_json::Value::Null;
        let cached = if let Some(why) = ds.invalid_name() {
            format!("cannot be opened: {why}")
        } else if !ds.storage().is_available() {
            format!("not available here: this build reads {}", DRIVERS.join(", "))
        } else if ds.object_store().is_none() {
            "local files, read in place".to_string()
        } else {
            let id = ds.source().identity();
            let root = ds.source().key_path("").to_string();
            let under = |p: &str| p == root || root.is_empty() || p.starts_with(&format!("{root}/"));
            let (n, bytes) = entries
                .iter()
                .filter(|(e, present)| *present && e.identity == id && under(&e.path))
                .fold((0, 0), |(n, b), (e, _)| (n + 1, b + e.size));
            let (bn, bbytes) = blocks
                .iter()
                .filter(|(m, _, _)| m.identity == id && under(&m.path))
                .fold((0, 0), |(n, b), (_, k, bytes)| (n + k, b + bytes));
            counts = serde_json::json!({"objects": n, "bytes": bytes, "blocks": bn, "block_bytes": bbytes});
            let mut s = format!("cached: {n} objects, {}", human(bytes));
            if bn > 0 {
                s.push_str(&format!("; {bn} blocks, {}", human(bbytes)));
            }
            s
        };
        let mut row = vec![
            ds.name().to_string(),
            ds.kind().as_str().to_string(),
            ds.uuid().to_string(),
        ];
        if several {
            let mut from = place(&e.catalog);
            if let Some(by) = &e.shadowed_by {
                from.push_str(&format!(" (shadowed by {})", place(by)));
            }
            row.push(from);
        }
        row.push(storage_text(ds));
        row.push(format!("[{cached}]"));
        let json = serde_json::json!({
            "name": ds.name(),
            "uuid": ds.uuid(),
            "type": ds.kind().as_str(),
            "driver": ds.storage().driver(),
            "description": ds.description(),
            "catalog": e.catalog.display().to_string(),
            "catalog_index": index(&e.catalog) + 1,
            "shadowed_by": e.shadowed_by.as_ref().map(|p| p.display().to_string()),
            "storage": storage_text(ds),
            "location": ds.storage().location(),
            "available": ds.storage().is_available(),
            "invalid_name": ds.invalid_name(),
            "cache": cached,
            "cached": counts,
        });
        listed.push(Listed {
            row,
            description: ds.description().map(str::to_string),
            json,
        });
    }
    if json {
        let doc = serde_json::json!({
            "catalogs": stack.catalogs().iter().map(|c| serde_json::json!({
                "file": c.file().display().to_string(),
                "datasets": c.datasets().len(),
            })).collect::<Vec<_>>(),
            "datasets": listed.into_iter().map(|l| l.json).collect::<Vec<_>>(),
            "cache": {
                "dir": cache.dir().display().to_string(),
                "usage_bytes": cache.usage(),
                "max_bytes": cache.max_bytes(),
            },
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    for (i, c) in stack.catalogs().iter().enumerate() {
        let number = if several { format!(" #{}", i + 1) } else { String::new() };
        writeln!(
            out,
            "catalog{number} {} ({} datasets)",
            c.file().display(),
            c.datasets().len()
        )?;
    }
    let header: &[&str] = if several {
        &["NAME", "TYPE", "UUID", "CATALOG", "STORAGE", "CACHE"]
    } else {
        &["NAME", "TYPE", "UUID", "STORAGE", "CACHE"]
    };
    let rows: Vec<Vec<String>> = listed.iter().map(|l| l.row.clone()).collect();
    let lines = crate::table::render(header, &rows);
    let mut lines = lines.lines();
    writeln!(out, "{}", lines.next().unwrap_or_default())?;
    for (line, l) in lines.zip(&listed) {
        writeln!(out, "{line}")?;
        if let Some(d) = &l.description {
            writeln!(out, "    {d}")?;
        }
    }
    let cap = cache.max_bytes().map(human).unwrap_or_else(|| "no cap".into());
    writeln!(out, "cache {}: {} ({cap})", cache.dir().display(), human(cache.usage()))?;
    Ok(())
}

/// `data show SPEC`: the dataset a spec selects, with its query and fragment, and what it opens to.
async fn show(stack: &CatalogStack, spec: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let (catalog, sel) = stack.locate(spec)?;
    let (opens, path, size) = match stack.open(spec).await? {
        Opened::Blob(blob) => {
            let size = blob
                .size()
                .await
                .with_context(|| format!("reading the size of {spec}"))?;
            ("Blob", blob.path().to_string(), Some(size))
        }
        Opened::Tree(tree) => ("BlobTree", tree.path().to_string(), None),
    };
    let ds = sel.dataset();
    if json {
        let doc = serde_json::json!({
            "spec": spec,
            "dataset": ds.name(),
            "uuid": ds.uuid(),
            "type": ds.kind().as_str(),
            "driver": ds.storage().driver(),
            "catalog": catalog.file().display().to_string(),
            "query": sel.query(),
            "fragment": sel.fragment(),
            "opens": opens,
            "path": path,
            "size": size,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    writeln!(out, "dataset   {} ({})", ds.name(), ds.uuid())?;
    writeln!(out, "type      {} ({})", ds.kind().as_str(), storage_text(ds))?;
    writeln!(out, "catalog   {}", catalog.file().display())?;
    if let Some(q) = sel.query() {
        let pairs: Vec<String> = q.iter().map(|(k, v)| format!("{k:?}={v:?}")).collect();
        writeln!(out, "query     {}", pairs.join(" "))?;
    }
    if let Some(f) = sel.fragment() {
        writeln!(out, "fragment  {f:?}")?;
    }
    let what = if path.is_empty() {
        String::new()
    } else {
        format!(" {path}")
    };
    match size {
        Some(n) => writeln!(out, "opens     {opens}{what} ({})", human(n))?,
        None => writeln!(out, "opens     {opens}{what}")?,
    }
    Ok(())
}

/// `data tree SPEC`: a tree's files (its walk), or with `list` what lies directly in it; a blob is refused.
async fn tree(stack: &CatalogStack, spec: &str, list: bool, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let (catalog, _) = stack.locate(spec)?;
    let tree = match stack.open(spec).await? {
        Opened::Tree(tree) => tree,
        Opened::Blob(_) => bail!("{spec} is a blob, not a tree: read its bytes with `handoff data cat {spec}`"),
    };
    let listing =
        |what: &'static str, e: handoff_data::Error| anyhow::Error::new(e).context(format!("listing {what} of {spec}"));
    let entries = if json || list {
        tree.list().await.map_err(|e| listing("the entries", e))?
    } else {
        Vec::new()
    };
    let files = if json || !list {
        tree.walk().await.map_err(|e| listing("the files", e))?
    } else {
        Vec::new()
    };
    if json {
        let ds = tree.dataset();
        let doc = serde_json::json!({
            "dataset": ds.name(),
            "uuid": ds.uuid(),
            "catalog": catalog.file().display().to_string(),
            "path": tree.path(),
            "list": entries,
            "walk": files.iter().map(|e| serde_json::json!({"path": e.path, "size": e.size})).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    let shown = if list { &entries } else { &files };
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|e| vec![e.shown(), e.size.map_or_else(|| "-".to_string(), |n| n.to_string())])
        .collect();
    write!(out, "{}", crate::table::render(&["PATH", "BYTES"], &rows))?;
    let (n, bytes) = shown
        .iter()
        .filter(|e| !e.is_dir)
        .fold((0, 0), |(n, b), e| (n + 1, b + e.size.unwrap_or(0)));
    let dirs = shown.iter().filter(|e| e.is_dir).count();
    let folders = if dirs > 0 {
        format!(", {dirs} folders")
    } else {
        String::new()
    };
    writeln!(out, "{n} files ({}){folders}", human(bytes))?;
    Ok(())
}

/// `data cat SPEC`: the blob's bytes to `out`; a tree without a fragment fails, naming its entries.
async fn cat(stack: &CatalogStack, spec: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    match stack.open(spec).await? {
        Opened::Blob(blob) => {
            let bytes = blob.read_all().await.with_context(|| format!("reading {spec}"))?;
            out.write_all(&bytes)?;
            out.flush()?;
            Ok(())
        }
        Opened::Tree(tree) => {
            let entries = tree.list().await?;
            let names: Vec<String> = entries.iter().map(TreeEntry::shown).collect();
            bail!(
                "{spec} is a tree, not a blob: name a file in it with #path, e.g. {}#{}; it has: {}",
                spec.split('#').next().unwrap_or(spec),
                names
                    .iter()
                    .find(|n| !n.ends_with('/'))
                    .map(String::as_str)
                    .unwrap_or("FILE"),
                if names.is_empty() {
                    "nothing".to_string()
                } else {
                    names.join(", ")
                }
            )
        }
    }
}

async fn fetch(stack: &CatalogStack, cache: &Cache, names: &[String], out: &mut dyn Write) -> anyhow::Result<()> {
    let specs: Vec<String> = if names.is_empty() {
        // All that this build can read and a lookup finds; the others are listed as skipped.
        let mut specs = Vec::new();
        for e in stack.entries() {
            let ds = &e.dataset;
            if let Some(why) = ds.invalid_name() {
                writeln!(out, "skipped {:?}: {why}", ds.name())?;
            } else if let Some(by) = &e.shadowed_by {
                writeln!(
                    out,
                    "skipped {} of {}: shadowed by {}",
                    ds.name(),
                    e.catalog.display(),
                    by.display()
                )?;
            } else if !ds.storage().is_available() {
                writeln!(
                    out,
                    "skipped {}: its driver {} is not available here",
                    ds.name(),
                    ds.storage().driver()
                )?;
            } else {
                specs.push(ds.name().to_string());
            }
        }
        specs
    } else {
        names.to_vec()
    };
    let mut blobs: Vec<(String, Blob)> = Vec::new();
    for spec in &specs {
        match stack.open(spec).await? {
            Opened::Blob(blob) => blobs.push((spec.clone(), blob)),
            Opened::Tree(tree) => {
                let name = tree.dataset().name().to_string();
                let base = if tree.path().is_empty() {
                    name
                } else {
                    format!("{name}/{}", tree.path())
                };
                for e in tree.walk().await? {
                    blobs.push((format!("{base}/{}", e.path), tree.blob(&e.path)?));
                }
            }
        }
    }
    let terminal = std::io::stderr().is_terminal();
    let mut total = 0u64;
    for (label, blob) in blobs {
        let size = blob.size().await?;
        let start = Instant::now();
        let bar = terminal.then(|| {
            let bar = indicatif::ProgressBar::new(size);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(label.clone());
            bar
        });
        let progress = bar.clone().map(|b| move |n: u64| b.set_position(n));
        let progress_ref = progress.as_ref().map(|p| p as &(dyn Fn(u64) + Send + Sync));
        let got = blob
            .fetch(progress_ref)
            .await
            .with_context(|| format!("fetching {label}"))?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let secs = start.elapsed().as_secs_f64();
        match got {
            Some(f) => writeln!(
                out,
                "fetched {label}: {} in {secs:.2}s, blake3 {}",
                human(size),
                f.digest()
            )?,
            None => writeln!(out, "local {label}: {} (FileSystem, read in place)", human(size))?,
        }
        total += size;
    }
    let s = cache.stats();
    writeln!(
        out,
        "{} in all; {} downloaded ({} GETs), {} already cached",
        human(total),
        human(s.bytes_fetched),
        s.gets,
        s.hits
    )?;
    Ok(())
}

/// Parses `123`, `10K`, `64M`, `1.5G`, `2T` (powers of 1024; `KiB`/`KB` spellings accepted).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .with_context(|| format!("size {s:?}: expected a number with an optional unit, e.g. 10G"))?;
    let mult = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1u64,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        other => bail!("size {s:?}: unknown unit {other:?}; use K, M, G or T"),
    };
    Ok((n * mult as f64) as u64)
}

/// `1.5 MiB`-style sizes.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// A folder removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(what: &str) -> TempDir {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("handoff-data-cmd-{what}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Deterministic bytes that differ per offset.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| ((i * 31 + (i >> 13)) as u8) ^ seed).collect()
    }

    /// A `file://` store under `dir` with a catalog over it: datasets `blob`, `big`, `tree` (a BlobTree) and
    /// `missing`; returns the catalog file.
    fn file_store_catalog(dir: &Path) -> PathBuf {
        let root = dir.join("store/base");
        let mut toml = String::from("data_config_version = 1\n");
        for (name, uuid, ty, rel) in [
            ("blob", "11111111-1111-4111-8111-111111111111", "Blob", "blob.bin"),
            ("big", "22222222-2222-4222-8222-222222222222", "Blob", "big.bin"),
            ("tree", "33333333-3333-4333-8333-333333333333", "BlobTree", "tree"),
            (
                "missing",
                "44444444-4444-4444-8444-444444444444",
                "Blob",
                "nothing-here.bin",
            ),
        ] {
            toml.push_str(&format!(
                "\n[[datasets]]\nname = \"{name}\"\nuuid = \"{uuid}\"\n\n[datasets.storage]\ndriver = \"ObjectStore\"\n\
                 type = \"{ty}\"\nurl = \"file://{}/{rel}\"\n",
                root.display()
            ));
        }
        let put = |rel: &str, data: &[u8]| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, data).unwrap();
        };
        put("blob.bin", b"blob");
        put("big.bin", &pattern(1 << 20, 1));
        put("tree/x.txt", b"x");
        put("tree/y/z.txt", b"zz");
        let file = dir.join("Data.toml");
        std::fs::write(&file, toml).unwrap();
        file
    }

    async fn cli(catalog: &Path, cache_dir: &Path, command: Command) -> (anyhow::Result<()>, String) {
        let args = Args {
            catalog: vec![catalog.to_path_buf()],
            cache_dir: Some(cache_dir.to_path_buf()),
            offline: false,
            command,
        };
        let mut out = Vec::new();
        let res = run_to(args, &mut out).await;
        (res, String::from_utf8(out).unwrap())
    }

    /// `handoff data ls | fetch | verify | gc` against a file:// store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn data_commands() {
        let tmp = TempDir::new("commands");
        let file = file_store_catalog(tmp.path());
        let cache_dir = tmp.path().join("cache");

        let (res, out) = cli(&file, &cache_dir, Command::Ls { json: false }).await;
        res.unwrap();
        assert!(
            out.contains("blob") && out.contains("BlobTree") && out.contains("cached: 0 objects"),
            "{out}"
        );

        let (res, out) = cli(
            &file,
            &cache_dir,
            Command::Fetch {
                names: vec!["big".into(), "tree".into()],
            },
        )
        .await;
        res.unwrap();
        assert!(
            out.contains("fetched big: 1.0 MiB") && out.contains("fetched tree/y/z.txt"),
            "{out}"
        );
        assert!(out.contains("3 GETs"), "{out}");

        let (res, out) = cli(&file, &cache_dir, Command::Ls { json: false }).await;
        res.unwrap();
        let big_line = out.lines().find(|l| l.starts_with("big ")).unwrap();
        assert!(big_line.contains("cached: 1 objects, 1.0 MiB"), "{out}");
        let tree_line = out.lines().find(|l| l.starts_with("tree ")).unwrap();
        assert!(tree_line.contains("cached: 2 objects"), "{out}");

        let (res, out) = cli(&file, &cache_dir, Command::Verify { repair: false }).await;
        res.unwrap();
        assert!(out.contains("verified 3 files") && out.contains("0 corrupt"), "{out}");

        // Corrupt one object file: verify reports it and fails; --repair removes it.
        let cache = Cache::open(CacheConfig::new(&cache_dir)).unwrap();
        let catalog = handoff_data::Catalog::load(&file, cache).unwrap();
        let path = catalog
            .blob("big")
            .unwrap()
            .local_path()
            .await
            .unwrap()
            .path()
            .to_path_buf();
        let mut perm = std::fs::metadata(&path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perm.set_readonly(false);
        std::fs::set_permissions(&path, perm).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[7] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let (res, out) = cli(&file, &cache_dir, Command::Verify { repair: false }).await;
        assert!(
            res.is_err() && out.contains("CORRUPT") && out.contains("1 corrupt"),
            "{out}"
        );
        let (res, out) = cli(&file, &cache_dir, Command::Verify { repair: true }).await;
        res.unwrap();
        assert!(out.contains("removed"), "{out}");

        let (res, out) = cli(&file, &cache_dir, Command::Gc { to: "0".into() }).await;
        res.unwrap();
        assert!(out.contains("-> 0 B"), "{out}");
        assert_eq!(catalog.cache().usage(), 0);
    }

    /// `handoff data ls`, `fetch` and `verify` on a DataSets.jl catalog with a driver handoff lacks (the fixture
    /// is handoff-data's).
    #[tokio::test]
    async fn data_ls_marks_what_this_build_cannot_read() {
        let embedded = Path::new(env!("CARGO_MANIFEST_DIR")).join("../handoff-data/tests/fixtures/julia/Embedded.toml");
        let tmp = TempDir::new("embedded");
        let cache_dir = tmp.path().join("cache");
        let run = |command| cli(&embedded, &cache_dir, command);
        let (res, out) = run(Command::Ls { json: false }).await;
        res.unwrap();
        let old = out.lines().find(|l| l.starts_with("old_backend_blob")).expect("listed");
        assert!(
            old.contains("driver OldBackendAPI") && old.contains("not available here"),
            "{out}"
        );
        let blob = out.lines().find(|l| l.starts_with("embedded_blob")).expect("listed");
        assert!(blob.contains("TomlDataStorage (in the catalog: 8 bytes)"), "{out}");

        let (res, out) = run(Command::Fetch { names: vec![] }).await;
        res.unwrap();
        assert!(
            out.contains("skipped old_backend_blob: its driver OldBackendAPI is not available here")
                && out.contains("fetched embedded_tree/d02/b.txt"),
            "{out}"
        );
        let (res, out) = run(Command::Verify { repair: false }).await;
        res.unwrap();
        assert!(out.contains("0 corrupt"), "{out}");
        let (res, _) = run(Command::Fetch {
            names: vec!["old_backend_blob".into()],
        })
        .await;
        let msg = format!("{:#}", res.unwrap_err());
        assert!(
            msg.contains("OldBackendAPI") && msg.contains("this build reads"),
            "{msg}"
        );
    }

    fn julia(file: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../handoff-data/tests/fixtures/julia")
            .join(file)
    }

    async fn cli_stack(catalogs: &[PathBuf], cache_dir: &Path, command: Command) -> (anyhow::Result<()>, String) {
        let args = Args {
            catalog: catalogs.to_vec(),
            cache_dir: Some(cache_dir.to_path_buf()),
            offline: false,
            command,
        };
        let mut out = Vec::new();
        let res = run_to(args, &mut out).await;
        (res, String::from_utf8_lossy(&out).into_owned())
    }

    /// `handoff data cat SPEC`: a blob's bytes, a file of a tree by its fragment, and a tree refused with its
    /// entries; through a stack, the first catalog's dataset.
    #[tokio::test]
    async fn data_cat_writes_what_a_spec_selects() {
        let tmp = TempDir::new("cat");
        let cache_dir = tmp.path().join("cache");
        let one = [julia("Data.toml")];
        let cat = |spec: &str| Command::Cat { spec: spec.into() };
        let (res, out) = cli_stack(&one, &cache_dir, cat("a_text_file")).await;
        res.unwrap();
        assert_eq!(out, "Hello world!\n");
        let (res, out) = cli_stack(&one, &cache_dir, cat("a_tree_example#2.csv")).await;
        res.unwrap();
        assert!(out.starts_with("Name,Age\n"), "{out}");
        let (res, _) = cli_stack(&one, &cache_dir, cat("a_tree_example")).await;
        let msg = format!("{:#}", res.unwrap_err());
        assert!(msg.contains("is a tree") && msg.contains("1.csv, 2.csv"), "{msg}");
        let (res, _) = cli_stack(&one, &cache_dir, cat("a_tree_example#9.csv")).await;
        assert!(format!("{:#}", res.unwrap_err()).contains("\"9.csv\""));
        let (res, _) = cli_stack(&one, &cache_dir, cat("a text file")).await;
        assert!(format!("{:#}", res.unwrap_err()).contains("invalid dataset specification"));
        let stack = [julia("stack"), julia("Data.toml")];
        let (res, out) = cli_stack(&stack, &cache_dir, cat("a_text_file")).await;
        res.unwrap();
        assert_eq!(out, "From the first catalog\n");
    }

    /// `data ls --json`: one document with every dataset's fields; `data tree`: a tree's walk and listing, as text
    /// and as JSON (DataSets.jl's embedded tree: four folders of two files).
    #[tokio::test]
    async fn data_ls_json_and_tree_read_a_catalog() {
        let tmp = TempDir::new("json");
        let cache_dir = tmp.path().join("cache");
        let embedded = [julia("Embedded.toml")];
        let (res, out) = cli_stack(&embedded, &cache_dir, Command::Ls { json: true }).await;
        res.unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(doc["catalogs"][0]["datasets"], 6, "{doc}");
        let tree = &doc["datasets"][1];
        assert_eq!(tree["name"], "embedded_tree");
        assert_eq!(tree["type"], "BlobTree");
        assert_eq!(tree["driver"], "TomlDataStorage");
        assert_eq!(tree["description"], "A data tree embedded in the TOML");
        assert_eq!(tree["storage"], "TomlDataStorage (in the catalog: 8 files)");
        assert_eq!(tree["cached"]["objects"], 0);
        let old = &doc["datasets"][4];
        assert_eq!(
            (&old["driver"], &old["available"]),
            (&"OldBackendAPI".into(), &false.into())
        );
        assert!(
            old["cache"].as_str().unwrap().starts_with("not available here"),
            "{doc}"
        );
        let file = &doc["datasets"][2];
        assert_eq!(
            (&file["type"], &file["description"]),
            (&"Blob".into(), &"The newer type names: a File".into())
        );

        let tree_cmd = |spec: &str, list: bool, json: bool| Command::Tree {
            spec: spec.into(),
            list,
            json,
        };
        let (res, out) = cli_stack(&embedded, &cache_dir, tree_cmd("embedded_tree", false, true)).await;
        res.unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        let walk: Vec<&str> = doc["walk"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(walk.len(), 8, "{doc}");
        assert_eq!((walk[0], walk[7]), ("d01/a.txt", "d04/b.txt"));
        assert_eq!(doc["walk"][7]["size"], 11);
        let list: Vec<(&str, bool)> = doc["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["path"].as_str().unwrap(), e["is_dir"].as_bool().unwrap()))
            .collect();
        assert_eq!(list, [("d01", true), ("d02", true), ("d03", true), ("d04", true)]);
        let (res, out) = cli_stack(&embedded, &cache_dir, tree_cmd("embedded_tree#d04", false, true)).await;
        res.unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(doc["path"], "d04");
        assert_eq!(doc["walk"][1]["path"], "b.txt");

        let (res, out) = cli_stack(&embedded, &cache_dir, tree_cmd("embedded_tree", true, false)).await;
        res.unwrap();
        assert!(
            out.starts_with("PATH") && out.contains("d03/") && out.ends_with("0 files (0 B), 4 folders\n"),
            "{out}"
        );
        let (res, out) = cli_stack(&embedded, &cache_dir, tree_cmd("embedded_tree", false, false)).await;
        res.unwrap();
        assert!(
            out.contains("d04/b.txt  11") && out.ends_with("8 files (88 B)\n"),
            "{out}"
        );
        let (res, _) = cli_stack(&embedded, &cache_dir, tree_cmd("embedded_file", false, false)).await;
        let msg = format!("{:#}", res.unwrap_err());
        assert!(
            msg.contains("is a blob") && msg.contains("handoff data cat embedded_file"),
            "{msg}"
        );
        let (res, _) = cli_stack(&embedded, &cache_dir, tree_cmd("embedded_tree#d09", false, false)).await;
        assert!(format!("{:#}", res.unwrap_err()).contains("\"d09\""));

        let show = |spec: &str, json: bool| Command::Show {
            spec: spec.into(),
            json,
        };
        let (res, out) = cli_stack(&embedded, &cache_dir, show("embedded_tree?k=v#d04/b.txt", true)).await;
        res.unwrap();
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            (&doc["dataset"], &doc["opens"], &doc["path"]),
            (&"embedded_tree".into(), &"Blob".into(), &"d04/b.txt".into())
        );
        assert_eq!(
            (&doc["query"]["k"], &doc["fragment"], &doc["size"]),
            (&"v".into(), &"d04/b.txt".into(), &11.into())
        );
        let (res, out) = cli_stack(&embedded, &cache_dir, show("embedded_tree#d03", false)).await;
        res.unwrap();
        assert!(
            out.contains("opens     BlobTree d03") && out.contains("fragment  \"d03\""),
            "{out}"
        );
        let (res, _) = cli_stack(
            &embedded,
            &cache_dir,
            show("b498f769-a7f6-4f67-8d74-40b770398f26", false),
        )
        .await;
        assert!(format!("{:#}", res.unwrap_err()).contains("names several datasets"));
    }

    /// `data ls` over a stack: a CATALOG column that marks shadowed datasets, invalid names listed as such, and
    /// every column aligned whatever the names' lengths and scripts.
    #[tokio::test]
    async fn data_ls_shows_each_catalog_and_keeps_its_columns() {
        let tmp = TempDir::new("ls");
        let cache_dir = tmp.path().join("cache");
        let long = tmp.path().join("Long.toml");
        std::fs::write(
            &long,
            format!(
                "data_config_version = 1\n[[datasets]]\nname = \"{}\"\nuuid = \"5e1e7c2a-0000-4000-8000-000000000001\"\n\
                 [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Blob\"\npath = \"{}\"\n\
                 [[datasets]]\nname = \"données/été\"\nuuid = \"5e1e7c2a-0000-4000-8000-000000000002\"\n\
                 [datasets.storage]\ndriver = \"FileSystem\"\ntype = \"Blob\"\npath = \"{}\"\n",
                "a_really_long_dataset_name/with/many/segments/that_goes_on",
                julia("data/file.txt").display(),
                julia("data/file.txt").display(),
            ),
        )
        .unwrap();
        let stack = [long, julia("stack"), julia("Data.toml"), julia("Names.toml")];
        let (res, out) = cli_stack(&stack, &cache_dir, Command::Ls { json: false }).await;
        res.unwrap();
        let rows: Vec<&str> = out
            .lines()
            .skip_while(|l| !l.starts_with("NAME"))
            .filter(|l| !l.starts_with("    ") && !l.starts_with("cache "))
            .collect();
        assert!(rows.len() >= 9, "{out}");
        let column = |line: &str, word: &str| line.find(word).map(|b| line[..b].chars().count());
        let uuid_at = column(rows[0], "UUID").unwrap();
        for row in &rows[1..] {
            let at = row
                .char_indices()
                .filter(|(_, c)| *c == '-')
                .map(|(i, _)| i)
                .find(|&i| {
                    row.get(i.saturating_sub(8)..i)
                        .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
                });
            let at = at.map(|i| row[..i - 8].chars().count());
            assert_eq!(at, Some(uuid_at), "the uuid column is aligned:\n{out}");
        }
        let first = rows
            .iter()
            .find(|l| l.starts_with("a_text_file") && l.contains("314996ef"))
            .unwrap();
        assert!(!first.contains("shadowed"), "{out}");
        let second = rows
            .iter()
            .find(|l| l.starts_with("a_text_file") && l.contains("b498f769"))
            .unwrap();
        assert!(second.contains("shadowed by"), "{out}");
        let bad = rows.iter().find(|l| l.starts_with("bad name")).unwrap();
        assert!(
            bad.contains("cannot be opened") && bad.contains("DataSets.jl's rule"),
            "{out}"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("10K").unwrap(), 10240);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("64 MiB").unwrap(), 64 << 20);
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5Q").is_err());
        assert_eq!(human(1536), "1.5 KiB");
    }
}
