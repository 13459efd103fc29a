//! Which crates to check: the library and binary targets of every workspace member, as
//! `cargo metadata` lists them.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

/// One crate to check: a package's library or binary target.
#[derive(Debug, Clone)]
pub struct CrateRoot {
    /// `package (lib)` or `package (bin name)`.
    pub label: String,
    /// The target's root file.
    pub root: PathBuf,
}

/// The lib and bin targets of every member of the workspace that `manifest` (a
/// `Cargo.toml`, or the one cargo finds from the current folder) belongs to. Tests,
/// examples, benches and build scripts are separate crates that only see the public API,
/// and are left out.
pub fn workspace_crates(manifest: Option<&PathBuf>) -> anyhow::Result<Vec<CrateRoot>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(["metadata", "--no-deps", "--format-version", "1"]);
    if let Some(manifest) = manifest {
        command.arg("--manifest-path").arg(manifest);
    }
    let output = command.output().context("running cargo metadata")?;
    if !output.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("reading cargo metadata's output")?;
    let mut crates = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or("?");
        for target in package["targets"].as_array().into_iter().flatten() {
            let kinds: Vec<&str> = target["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str())
                .collect();
            let label = if kinds.iter().any(|k| matches!(*k, "lib" | "rlib" | "proc-macro")) {
                format!("{name} (lib)")
            } else if kinds.contains(&"bin") {
                format!("{name} (bin {})", target["name"].as_str().unwrap_or("?"))
            } else {
                continue;
            };
            let Some(root) = target["src_path"].as_str() else {
                continue;
            };
            crates.push(CrateRoot {
                label,
                root: PathBuf::from(root),
            });
        }
    }
    crates.sort_by(|a, b| a.label.cmp(&b.label));
    Ok(crates)
}
