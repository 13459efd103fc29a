//! Classes 2 and 4: shared-memory segments that are truncated under the reader (SIGBUS), not memfds, or sparse.

use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{Context, Result};
use handoff::wire::{Buffer, Descriptor};
use handoff::Message;
use rustix::fs::SealFlags;

use super::common::{answer_of, msg, rmp_decode, Findings, Target};
use crate::hostile::raw::{memfd, Identity, Raw};
use crate::protocol::Hold;

fn shm_frame(n: u64, off: u64, size: u64, lease: u64, sealed: bool) -> Descriptor {
    Descriptor::Shm {
        len: n,
        offset: off,
        size,
        lease,
        sealed,
    }
}

pub(super) async fn sigbus(t: &Target, f: &mut Findings) -> Result<()> {
    let unix = t.unix.as_deref().context("the victim has no Unix socket")?;
    let size = 64 << 10;
    let cases: Vec<(&str, std::os::fd::OwnedFd, bool)> = vec![
        (
            "an unsealed memfd, truncated to 0 after sending",
            memfd(size, SealFlags::empty())?,
            false,
        ),
        (
            "a memfd sealed against writes only, claimed sealed",
            memfd(size, SealFlags::WRITE)?,
            true,
        ),
        ("a regular file", regular_file(size)?, false),
    ];
    for (i, (what, fd, sealed)) in cases.into_iter().enumerate() {
        let mut raw = Raw::unix_handshaken(unix, &Identity::fresh("sigbus"), &t.secret).await?;
        let hold = msg(
            &Hold {
                id: i as u64,
                data: Buffer::new(),
            },
            vec![shm_frame(4096, 0, size, 1, sealed)],
        );
        raw.write_with_fds(&hold, &[fd.as_fd()]).await?;
        // What a hostile sender does next: shrink the segment under the receiver.
        let _ = rustix::fs::ftruncate(&fd, 0);
        let answer = raw.error_before_close(Duration::from_secs(10)).await;
        f.check(
            answer.as_ref().is_some_and(|(code, _)| code == "bad-shm"),
            format!("{what}: refused with bad-shm (got {answer:?})"),
        );
    }
    Ok(())
}

fn regular_file(size: u64) -> Result<std::os::fd::OwnedFd> {
    let path = std::env::temp_dir().join(format!("handoff-hostile-file-{}", rand::random::<u64>()));
    let file = std::fs::File::create(&path)?;
    file.set_len(size)?;
    std::fs::remove_file(&path)?;
    Ok(file.into())
}

pub(super) async fn sparse_segments(t: &Target, f: &mut Findings) -> Result<()> {
    let unix = t.unix.as_deref().context("the victim has no Unix socket")?;
    let mut raw = Raw::unix_handshaken(unix, &Identity::fresh("sparse"), &t.secret).await?;
    let before = crate::hostile::victim::memory(t.pid).unwrap_or_default();
    let huge = 1u64 << 40;
    let count = 300u64;
    let mut held = 0;
    // In rounds of 16, reading the answers in between (the victim queues 64 at most).
    for round in 0..count / 16 {
        for i in round * 16..(round + 1) * 16 {
            let fd = memfd(huge, SealFlags::SHRINK | SealFlags::GROW)?;
            let hold = msg(
                &Hold {
                    id: i,
                    data: Buffer::new(),
                },
                vec![shm_frame(1, i * 4096 + 1, huge, i + 1, false)],
            );
            raw.write_with_fds(&hold, &[fd.as_fd()]).await?;
        }
        for _ in 0..16 {
            let (body, _) = answer_of(&mut raw, crate::protocol::Held::TYPE_NAME).await?;
            let h: crate::protocol::Held = rmp_decode(&body)?;
            held += (h.bytes > 0) as u64;
        }
    }
    let count = count / 16 * 16;
    let after = crate::hostile::victim::memory(t.pid).unwrap_or_default();
    let grown = after.vm.saturating_sub(before.vm);
    f.check(
        grown < 1 << 30,
        format!(
            "{count} one-byte windows of 1 TiB segments grew the address space by {} MiB",
            grown >> 20
        ),
    );
    f.check(
        held <= t.bounds.max_held as u64,
        format!("{held} of them were kept (at most {} per peer)", t.bounds.max_held),
    );
    Ok(())
}
