//! The same-host transport's setting, for both drivers: where a node's Unix socket lives,
//! made so that only this user can reach it, and who may connect to it.

use std::os::fd::BorrowedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// Why a same-host setting failed.
#[derive(Debug)]
pub enum SameHostError {
    /// A system call failed while doing `what`.
    Io {
        /// What was being done ("creating the runtime directory /run/…").
        what: String,
        /// The system's error.
        source: std::io::Error,
    },
    /// Something to fix: a directory of another user, a peer of another user.
    Refused(String),
}

impl std::fmt::Display for SameHostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SameHostError::Io { what, source } => write!(f, "{what}: {source}"),
            SameHostError::Refused(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for SameHostError {}

fn io(what: String) -> impl FnOnce(std::io::Error) -> SameHostError {
    move |source| SameHostError::Io { what, source }
}

/// The folder for this user's node sockets: `$HANDOFF_RUNTIME_DIR`, else
/// `$XDG_RUNTIME_DIR/handoff`, else `/tmp/handoff-UID`; created with mode 0700, and
/// refused if another user owns it (others' rights on it are taken away).
pub fn runtime_dir() -> Result<PathBuf, SameHostError> {
    let uid = rustix::process::geteuid().as_raw();
    let dir = if let Some(d) = std::env::var_os("HANDOFF_RUNTIME_DIR") {
        PathBuf::from(d)
    } else if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        Path::new(&d).join("handoff")
    } else {
        PathBuf::from(format!("/tmp/handoff-{uid}"))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io(format!("creating the runtime directory {}", dir.display())))?;
    let meta = std::fs::metadata(&dir).map_err(io(format!("checking {}", dir.display())))?;
    if meta.uid() != uid {
        return Err(SameHostError::Refused(format!(
            "the runtime directory {} belongs to uid {}, not to us (uid {uid}); set HANDOFF_RUNTIME_DIR",
            dir.display(),
            meta.uid()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io(format!("restricting {} to mode 0700", dir.display())))?;
    }
    Ok(dir)
}

/// The Unix socket of node `node_id` named `name` in this user's [`runtime_dir`], bound
/// (a stale file of the same name replaced), readable and writable by this user only, and
/// non-blocking; with its path.
pub fn listen(name: &str, node_id: &str) -> Result<(UnixListener, PathBuf), SameHostError> {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(32)
        .collect();
    let id: String = node_id.chars().take(12).collect();
    let path = runtime_dir()?.join(format!("{safe}-{id}.sock"));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(io(format!("listening on {}", path.display())))?;
    let ready = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("restricting {} to mode 0600", path.display())))
        .and_then(|()| {
            listener
                .set_nonblocking(true)
                .map_err(io(format!("making {} non-blocking", path.display())))
        });
    if let Err(e) = ready {
        // Not left behind for the next node of this name to find.
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    Ok((listener, path))
}

/// Checks that the process at the other end of Unix socket `socket` runs as our user (a
/// same-host peer shares our memory, spec §7.1); returns its pid.
pub fn check_peer_uid(socket: BorrowedFd<'_>) -> Result<Option<u32>, SameHostError> {
    let (pid, uid) = peer_credentials(socket).map_err(io("reading the peer's credentials (SO_PEERCRED)".into()))?;
    let ours = rustix::process::geteuid().as_raw();
    if uid != ours {
        return Err(SameHostError::Refused(format!(
            "refusing a same-host peer running as uid {uid} (we are uid {ours}, its pid {})",
            pid.map_or_else(|| "unknown".to_string(), |p| p.to_string())
        )));
    }
    Ok(pid)
}

/// The peer's pid (`None` when the kernel gives 0: a process of a pid namespace we cannot
/// see) and uid, read as the kernel's `ucred` itself (rustix's would take pid 0 for a
/// non-zero pid).
fn peer_credentials(socket: BorrowedFd<'_>) -> std::io::Result<(Option<u32>, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a `ucred` of `len` bytes, the size SO_PEERCRED writes.
    let r = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(cred.pid).ok().filter(|p| *p > 0), cred.uid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_peer_of_our_own_user_is_let_in_with_its_pid() {
        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(check_peer_uid(a.as_fd()).unwrap(), Some(std::process::id()));
    }

    #[test]
    fn the_socket_is_ours_alone_and_its_name_is_safe() {
        let dir = std::env::temp_dir().join(format!("handoff-sys-test-{}", std::process::id()));
        // (Each test runs in a process of its own under nextest.)
        std::env::set_var("HANDOFF_RUNTIME_DIR", &dir);
        let (_listener, path) = listen("a/b c", "0123456789abcdef").unwrap();
        assert_eq!(path, dir.join("a_b_c-0123456789ab.sock"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
