//! The same-host transport's setting: where a node's Unix socket lives, and who may
//! connect to it. (Reading and writing it, descriptors included, is `wire`'s.)

use std::path::{Path, PathBuf};

use tokio::net::UnixStream;

use crate::{Error, Result};

/// The folder for this user's node sockets: `$HANDOFF_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/handoff`, else `/tmp/handoff-UID`; created with mode 0700, and
/// refused if another user owns it or others can enter it.
pub(crate) fn runtime_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let uid = rustix::process::geteuid().as_raw();
    let dir = if let Some(d) = std::env::var_os("HANDOFF_RUNTIME_DIR") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        Path::new(&d).join("handoff")
    } else {
        PathBuf::from(format!("/tmp/handoff-{uid}"))
    };
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) => {
            return Err(Error::io(
                format!("creating the runtime directory {}", dir.display()),
                e,
            ))
        }
    }
    let meta = std::fs::metadata(&dir).map_err(|e| Error::io(format!("checking {}", dir.display()), e))?;
    if meta.uid() != uid {
        return Err(Error::Config(format!(
            "the runtime directory {} belongs to uid {}, not to us (uid {uid}); set HANDOFF_RUNTIME_DIR",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io(format!("restricting {} to mode 0700", dir.display()), e))?;
    }
    Ok(dir)
}

/// Checks that the process at the other end of `stream` runs as our user; returns its pid.
pub(crate) fn check_peer_uid(stream: &UnixStream) -> Result<Option<u32>> {
    let cred = stream
        .peer_cred()
        .map_err(|e| Error::io("reading the peer's credentials (SO_PEERCRED)", e))?;
    let ours = rustix::process::geteuid().as_raw();
    if cred.uid() != ours {
        return Err(Error::Config(format!(
            "refusing a same-host peer running as uid {} (we are uid {ours}, pid {:?})",
            cred.uid(),
            cred.pid()
        )));
    }
    Ok(cred.pid().and_then(|pid| u32::try_from(pid).ok()))
}
