//! Classes 5 and 14: what a peer that has not proven the secret can send, and learn, before authentication.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use handoff::wire::Header;

use super::common::{Findings, Target};
use crate::hostile::raw::{framed, framed_raw, Identity, Raw};

/// A header of kind `kind` at the handshake limit: its `f` is an array of empty maps (about
/// 65 000 values in 64 KiB), then `key` with 32 bytes, as a challenge's `nonce` or an
/// auth's `mac`.
fn bomb(kind: &str, key: &str) -> Result<Vec<u8>> {
    let mut h = vec![0x83, 0xa1, b'k', 0xa0 | kind.len() as u8];
    h.extend_from_slice(kind.as_bytes());
    h.extend_from_slice(&[0xa1, b'f', 0xdc]);
    let maps = 65_536 - 64;
    h.extend_from_slice(&(maps as u16).to_be_bytes());
    h.extend(std::iter::repeat_n(0x80, maps));
    h.extend_from_slice(&[0xa0 | key.len() as u8]);
    h.extend_from_slice(key.as_bytes());
    h.extend_from_slice(&[0xc4, 32]);
    h.extend_from_slice(&[9u8; 32]);
    if h.len() > 65_536 {
        bail!("the bomb must fit the handshake limit");
    }
    Ok(framed_raw(&h))
}

/// What a peer that has proven nothing can send, at the handshake limits: an over-long
/// length prefix, then (protocol version 2) a `challenge` and an `auth` full of empty maps,
/// and a version-1 `hello` like them (refused at the preambles by a victim that does not
/// accept v1). Each gets its error and a legitimate handshake right after is quick. And
/// none of those peers learns who the victim is (issue 11, item 14): nothing it sent them
/// before the handshake completed holds an identity key or the victim's id, name, host,
/// addresses or socket path.
pub(super) async fn hello_bomb(t: &Target, f: &mut Findings) -> Result<()> {
    use handoff::wire::Preamble;
    let mut unproven: Vec<Vec<u8>> = Vec::new();
    // An over-long length prefix, with more input behind it that the victim never reads.
    let mut raw = Raw::tcp(&t.listen).await?;
    raw.write(&Preamble::OURS.encode()).await?;
    raw.write(&(16u32 << 20).to_be_bytes()).await?;
    raw.write(&vec![0x42u8; 256 << 10]).await?;
    raw.skip(16).await?; // its preamble
    let answer = raw.error_before_close(Duration::from_secs(10)).await;
    f.check(
        answer.as_ref().is_some_and(|(c, _)| c == "header-too-large"),
        format!("a 16 MiB length prefix before authentication gets its error, not a reset (got {answer:?})"),
    );
    unproven.push(raw.seen);

    let rounds = 20;
    let (challenge_bomb, auth_bomb, v1_bomb) = (
        bomb("challenge", "nonce")?,
        bomb("auth", "mac")?,
        bomb("hello", "nonce")?,
    );
    let mut answered = [0; 3];
    for _ in 0..rounds {
        // The first header of version 2.
        let mut raw = Raw::tcp(&t.listen).await?;
        raw.write(&Preamble::OURS.encode()).await?;
        raw.write(&challenge_bomb).await?;
        raw.skip(16).await?; // its preamble
        answered[0] += raw.error_before_close(Duration::from_secs(10)).await.is_some() as usize;
        unproven.push(raw.seen);
        // The second: a valid challenge first, then an auth of 64 KiB.
        let mut raw = Raw::tcp(&t.listen).await?;
        raw.write(&Preamble::OURS.encode()).await?;
        raw.write(&framed(&crate::hostile::raw::challenge())).await?;
        raw.skip(16).await?; // its preamble
        let _its_challenge = raw.read_header_bytes().await?;
        raw.write(&auth_bomb).await?;
        answered[1] += raw.error_before_close(Duration::from_secs(10)).await.is_some() as usize;
        unproven.push(raw.seen);
        // Version 1's hello, from a peer that speaks only v1.
        let mut raw = Raw::tcp(&t.listen).await?;
        raw.write(&Preamble::V1_ONLY.encode()).await?;
        raw.write(&v1_bomb).await?;
        raw.skip(16).await?; // its preamble
        answered[2] += raw.error_before_close(Duration::from_secs(10)).await.is_some() as usize;
        unproven.push(raw.seen);
    }
    for (count, what) in answered
        .iter()
        .zip(["challenges", "auths after a challenge", "v1 hellos"])
    {
        f.check(
            *count == rounds,
            format!("{rounds} {what} of 64 KiB full of empty maps are refused with an error ({count} were)"),
        );
    }
    // A peer that speaks only version 1: refused at the preambles, before any hello.
    let mut raw = Raw::tcp(&t.listen).await?;
    let v1 = raw.handshake_v1(&Identity::fresh("v1-only"), &t.secret).await;
    let v1 = v1.err().map(|e| e.to_string());
    f.check(
        v1.as_deref().is_some_and(|e| e.contains("[unsupported-version]")),
        format!("a peer that speaks only version 1 is refused with unsupported-version ({v1:?})"),
    );
    unproven.push(raw.seen);
    // A peer that answers the challenge with a wrong proof.
    let mut raw = Raw::tcp(&t.listen).await?;
    raw.write(&Preamble::OURS.encode()).await?;
    raw.write(&framed(&crate::hostile::raw::challenge())).await?;
    raw.skip(16).await?;
    let _its_challenge = raw.read_header_bytes().await?;
    raw.write(&framed(&Header::Auth { mac: vec![7; 32] })).await?;
    let refused = raw.error_before_close(Duration::from_secs(10)).await;
    f.check(
        refused.as_ref().is_some_and(|(c, _)| c == "auth-failed"),
        format!("a wrong proof is refused with auth-failed (got {refused:?})"),
    );
    unproven.push(raw.seen);

    let started = Instant::now();
    let legit = Raw::tcp_handshaken(&t.listen, &Identity::fresh("legit"), &t.secret).await;
    let took = started.elapsed();
    f.check(
        legit.is_ok() && took < Duration::from_secs(1),
        format!("a legitimate handshake right after takes {took:?}"),
    );
    let victim = legit?.peer.context("a handshaken peer knows the victim")?;
    let mut secrets = vec![
        victim.node_id.clone(),
        victim.name.clone(),
        victim.host_id.clone(),
        victim.process_id.clone(),
        t.listen.clone(),
    ];
    secrets.extend(victim.listen.clone());
    secrets.extend(victim.unix.clone());
    // The keys of an identity, as msgpack strs: no hello or ident went out at all.
    let keys: Vec<Vec<u8>> = ["node", "host", "pid", "proc", "listen", "unix"]
        .iter()
        .map(|k| [&[0xa0 | k.len() as u8][..], k.as_bytes()].concat())
        .collect();
    let leaked: Vec<String> = unproven
        .iter()
        .flat_map(|bytes| {
            let text = secrets.iter().filter(|s| contains(bytes, s.as_bytes())).cloned();
            let keys = keys
                .iter()
                .filter(|k| contains(bytes, k))
                .map(|k| format!("key {:?}", String::from_utf8_lossy(&k[1..])));
            text.chain(keys).collect::<Vec<_>>()
        })
        .collect();
    f.check(
        leaked.is_empty(),
        format!(
            "{} connections that proved nothing got {} bytes, none of them naming the victim (found: {leaked:?})",
            unproven.len(),
            unproven.iter().map(Vec::len).sum::<usize>()
        ),
    );
    Ok(())
}

/// Whether `needle` occurs in `haystack`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
