//! Classes 10 and 11: peers that read slowly, say nothing, hold descriptors before the handshake, or stall mid-
//! frame.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use handoff::wire::Descriptor;
use rustix::fs::SealFlags;

use super::common::{blob, ping, Findings, Target};
use crate::hostile::raw::{framed, memfd, Identity, Raw};
use crate::hostile::victim::{open_fds, open_fds_naming};

pub(super) async fn slow_reader(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("never-reads"), &t.secret).await?;
    let count = 20_000u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut sent = 0;
    let mut batch = Vec::new();
    for seq in 0..count {
        batch.extend_from_slice(&ping(seq));
        if batch.len() > 64 << 10 {
            match tokio::time::timeout_at(deadline, raw.write(&batch)).await {
                Ok(Ok(())) => sent = seq,
                _ => break,
            }
            batch.clear();
        }
    }
    f.check(sent > 0, format!("{sent} pings sent by a peer that reads no answer"));
    // Hold the connection (unread) a little longer while the legitimate peer is measured.
    tokio::time::sleep(Duration::from_secs(2)).await;
    drop(raw);
    Ok(())
}

pub(super) async fn slowloris(t: &Target, f: &mut Findings) -> Result<()> {
    raise_fd_limit();
    let before = crate::hostile::victim::memory(t.pid).unwrap_or_default();
    let mut idle = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let mut raw = Raw::tcp(&t.listen).await?;
        raw.write(b"H").await?;
        idle.push(raw);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peak = crate::hostile::victim::memory(t.pid).unwrap_or_default();
    let started = Instant::now();
    let legit = Raw::tcp_handshaken(&t.listen, &Identity::fresh("legit"), &t.secret).await;
    let took = started.elapsed();
    let grown = peak.rss.saturating_sub(before.rss);
    f.check(
        grown < 64 << 20,
        format!(
            "2000 idle unauthenticated connections cost the victim {} MiB",
            grown >> 20
        ),
    );
    f.check(
        legit.is_ok() && took < Duration::from_secs(1),
        format!("meanwhile a legitimate client connects in {took:?} ({:?})", legit.err()),
    );
    drop(idle);
    Ok(())
}

/// Raises this process's descriptor limit to its hard limit (the attacker opens thousands).
fn raise_fd_limit() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    let _ = rustix::process::setrlimit(rustix::process::Resource::Nofile, raised);
}

/// Descriptors before the handshake (spec §5.1): closed at once, and the connection failed
/// at once. First the attack of issue 24: 80 connections, each sending the preamble one byte
/// at a time with 64 descriptors on every write and then holding the connection open; the
/// victim's descriptor count, read while all 80 are open, stays where it was, each
/// connection is closed within a second (not at the handshake timeout), none gets an
/// `error` (its preamble never completed, §3), and a legitimate client connects meanwhile.
/// Then descriptors on the challenge, after a whole preamble: `bad-shm`, said to the peer.
pub(super) async fn fds_before_handshake(t: &Target, f: &mut Findings) -> Result<()> {
    raise_fd_limit();
    let unix = t.unix.as_deref().context("the victim has no Unix socket")?;
    let before = open_fds(t.pid);
    let fds: Vec<_> = (0..64).map(|_| memfd(4096, SealFlags::SHRINK)).collect::<Result<_>>()?;
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let preamble = handoff::wire::Preamble::OURS.encode();
    let mut held = Vec::with_capacity(80);
    for _ in 0..80 {
        let mut raw = Raw::unix(unix).await?;
        for byte in preamble {
            // The victim closes the connection at the first of these: later writes fail.
            if raw.write_with_fds(&[byte], &borrowed).await.is_err() {
                break;
            }
        }
        held.push((raw, Instant::now()));
    }
    // The attacker's own memfds, as the victim holds them (its sockets come and go as it
    // accepts and closes them, so they are counted once all is settled, below).
    // One the victim is closing at this very moment may still show: wait for it a moment,
    // far less than the handshake timeout that held them before.
    let mut during = open_fds_naming(t.pid, "memfd:handoff-hostile");
    for _ in 0..20 {
        if during == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        during = open_fds_naming(t.pid, "memfd:handoff-hostile");
    }
    let started = Instant::now();
    let legit = Raw::unix_handshaken(unix, &Identity::fresh("legit"), &t.secret).await;
    let took = started.elapsed();
    f.check(
        legit.is_ok() && took < Duration::from_secs(1),
        format!("meanwhile a legitimate client connects in {took:?} ({:?})", legit.err()),
    );
    let (mut closed, mut told) = (0, 0);
    for (raw, opened) in &mut held {
        let (bytes, gone) = raw.until_closed(Duration::from_secs(1)).await;
        closed += (gone && opened.elapsed() < Duration::from_secs(3)) as usize;
        told += (bytes.len() > 16) as usize;
    }
    f.check(
        during == 0,
        format!("with 80 connections holding the preamble's descriptors open, the victim holds {during} of them (within a second)"),
    );
    f.check(
        closed == 80,
        format!("{closed} of 80 such connections were closed at once"),
    );
    f.check(
        told == 0,
        format!("{told} of them got more than the victim's preamble (an error before the peer's preamble is whole)"),
    );
    drop(held);

    let mut refused = 0;
    let rounds = 20;
    for _ in 0..rounds {
        let mut raw = Raw::unix(unix).await?;
        raw.write(&preamble).await?;
        raw.write_with_fds(&framed(&crate::hostile::raw::challenge()), &borrowed)
            .await?;
        raw.skip(16).await?; // its preamble
        if raw
            .error_before_close(Duration::from_secs(10))
            .await
            .is_some_and(|(code, _)| code == "bad-shm")
        {
            refused += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = open_fds(t.pid);
    f.check(
        refused == rounds,
        format!("{refused} of {rounds} connections passing descriptors with their challenge were refused with bad-shm"),
    );
    f.check(
        after <= before + 8,
        format!("the victim's open descriptors went from {before} to {after}"),
    );
    Ok(())
}

pub(super) async fn stalled_frame(t: &Target, f: &mut Findings) -> Result<()> {
    let before = crate::hostile::victim::memory(t.pid).unwrap_or_default();
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("staller"), &t.secret).await?;
        let mut m = blob(1, Descriptor::Inline { len: 1 << 30 });
        m.extend(std::iter::repeat_n(9u8, 64 << 20));
        // The victim reads one such message at a time: the others wait, unread.
        let _ = tokio::time::timeout(Duration::from_secs(3), raw.write(&m)).await;
        stalled.push(raw);
    }
    let mid = crate::hostile::victim::memory(t.pid).unwrap_or_default();
    let mut timed_out = 0;
    for raw in stalled.iter_mut() {
        let limit = Duration::from_millis(4 * t.bounds.timeout_ms + 2000);
        if let Some((code, _)) = raw.error_before_close(limit).await {
            timed_out += (code == "timeout") as usize;
        }
    }
    let grown = mid.rss.saturating_sub(before.rss);
    f.check(
        grown < (64 << 20) + (t.bounds.buffered_total),
        format!(
            "4 frames announced at 1 GiB and stalled after 64 MiB hold {} MiB",
            grown >> 20
        ),
    );
    f.check(
        timed_out >= 1,
        format!("{timed_out} of the stalled connections were closed with a timeout error"),
    );
    Ok(())
}
