//! Private temporary folders (0700, removed when dropped) and secret files (0600) for the child nodes that the
//! demo and the bench start.

use anyhow::{Context, Result};

/// A private temporary folder, removed when dropped.
pub struct TempDir(std::path::PathBuf);

impl TempDir {
    /// The folder.
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh private folder (0700) under the system's temporary folder.
pub fn private_dir() -> Result<TempDir> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("handoff-demo-{}-{}", std::process::id(), rand::random::<u32>()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    Ok(TempDir(dir))
}

/// Writes the cluster secret into a fresh private folder (0700, file 0600) for a child node.
pub fn write_secret(secret: &str) -> Result<(TempDir, std::path::PathBuf)> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = private_dir()?;
    let path = dir.path().join("secret");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, secret.as_bytes())?;
    Ok((dir, path))
}
