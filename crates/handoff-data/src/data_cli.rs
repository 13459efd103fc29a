//! `handoff data ls|fetch|verify|gc`: the data commands, as a library the `handoff` binary mounts.
//!
//! The binary adds `Data(handoff_data::data_cli::Args)` to its subcommands and calls [`run`].

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::cache::{Cache, CacheConfig};
use crate::catalog::{Catalog, DataKind, DataSet, StorageConfig, DRIVERS};
use crate::Blob;

/// Arguments of `handoff data`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The catalog, a DataSets.jl Data.toml (default: $HANDOFF_CATALOG, else ./Data.toml).
    #[arg(long, global = true, value_name = "FILE")]
    pub catalog: Option<PathBuf>,
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
    /// List the datasets and what the cache holds of each.
    Ls,
    /// Download datasets into the cache (all of them when none is named).
    Fetch {
        /// Dataset names or uuids.
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
    let given = args
        .catalog
        .clone()
        .or_else(|| std::env::var_os("HANDOFF_CATALOG").map(PathBuf::from));
    let catalog = match &given {
        // The error names the file and what is wrong in it.
        Some(file) => Catalog::load(file, cache.clone())?,
        None => Catalog::load("Data.toml", cache.clone()).with_context(|| {
            "no catalog was given, so Data.toml in the current folder was read; give one with --catalog FILE \
             or $HANDOFF_CATALOG"
        })?,
    };
    match args.command {
        Command::Ls => ls(&catalog, out),
        Command::Fetch { names } => fetch(&catalog, &names, out).await,
        Command::Gc { .. } | Command::Verify { .. } => unreachable!("handled above"),
    }
}

fn storage_text(ds: &DataSet) -> String {
    match ds.storage() {
        StorageConfig::FileSystem { path } => format!("FileSystem {}", path.display()),
        StorageConfig::ObjectStore { url, .. } => url.clone(),
        s @ StorageConfig::TomlData { .. } => format!("TomlDataStorage {}", s.location()),
        StorageConfig::Unavailable { driver } => format!("driver {driver}"),
    }
}

fn ls(catalog: &Catalog, out: &mut dyn Write) -> anyhow::Result<()> {
    let cache = catalog.cache();
    let entries = cache.entries();
    let blocks = cache.block_sets();
    writeln!(
        out,
        "catalog {} ({} datasets)",
        catalog.file().display(),
        catalog.datasets().len()
    )?;
    for ds in catalog.datasets() {
        let cached = if !ds.storage().is_available() {
            format!("not available here: this build reads {}", DRIVERS.join(", "))
        } else if ds.object_store().is_none() {
            "local files, read in place".to_string()
        } else {
            let id = ds.source().identity();
            let root = ds.source().object_path("").to_string();
            let under = |p: &str| p == root || root.is_empty() || p.starts_with(&format!("{root}/"));
            let (n, bytes) = entries
                .iter()
                .filter(|(e, present)| *present && e.identity == id && under(&e.path))
                .fold((0, 0), |(n, b), (e, _)| (n + 1, b + e.size));
            let (bn, bbytes) = blocks
                .iter()
                .filter(|(m, _, _)| m.identity == id && under(&m.path))
                .fold((0, 0), |(n, b), (_, k, bytes)| (n + k, b + bytes));
            let mut s = format!("cached: {n} objects, {}", human(bytes));
            if bn > 0 {
                s.push_str(&format!("; {bn} blocks, {}", human(bbytes)));
            }
            s
        };
        writeln!(
            out,
            "{:<24} {:<8} {}  {}  [{}]",
            ds.name(),
            ds.kind().as_str(),
            ds.uuid(),
            storage_text(ds),
            cached
        )?;
        if let Some(d) = ds.description() {
            writeln!(out, "    {d}")?;
        }
    }
    let cap = cache.max_bytes().map(human).unwrap_or_else(|| "no cap".into());
    writeln!(out, "cache {}: {} ({cap})", cache.dir().display(), human(cache.usage()))?;
    Ok(())
}

async fn fetch(catalog: &Catalog, names: &[String], out: &mut dyn Write) -> anyhow::Result<()> {
    let selected: Vec<Arc<DataSet>> = if names.is_empty() {
        // All that this build can read; the others are listed as skipped.
        for ds in catalog.datasets().iter().filter(|d| !d.storage().is_available()) {
            writeln!(
                out,
                "skipped {}: its driver {} is not available here",
                ds.name(),
                ds.storage().driver()
            )?;
        }
        catalog
            .datasets()
            .iter()
            .filter(|d| d.storage().is_available())
            .cloned()
            .collect()
    } else {
        names
            .iter()
            .map(|n| catalog.dataset(n).cloned())
            .collect::<Result<_, _>>()?
    };
    let mut blobs: Vec<(String, Blob)> = Vec::new();
    for ds in &selected {
        match ds.kind() {
            DataKind::Blob => blobs.push((ds.name().to_string(), catalog.blob(ds.name())?)),
            DataKind::BlobTree => {
                let tree = catalog.tree(ds.name())?;
                for e in tree.walk().await? {
                    blobs.push((format!("{}/{}", ds.name(), e.path), tree.blob(&e.path)?));
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
    let s = catalog.cache().stats();
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
