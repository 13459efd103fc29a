//! The attacks: one per class of issue 11, each against a real victim process. Each one
//! does what a hostile or buggy peer would, then checks what the victim answered; the
//! runner checks around it that the victim lives, stays within its memory bound and keeps
//! serving a legitimate peer.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use handoff::wire::{Buffer, Descriptor, Header, Limits, TicketClaim, TicketOp};
use handoff::Message;
use rustix::fs::SealFlags;
use serde::Serialize;

use super::raw::{framed, framed_raw, memfd, Identity, Raw};
use super::victim::{open_fds, Bounds};
use crate::protocol::{Blob, Hold, Issue, Payload, Ping, RawSend, SendRequest, StatsRequest};

/// What an attack found: named checks that passed or failed, with details.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Findings {
    pub passed: Vec<String>,
    pub failed: Vec<String>,
}

impl Findings {
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.passed.push(what);
        } else {
            self.failed.push(what);
        }
    }
}

/// Where the victim is, for the attacks.
pub struct Target {
    /// Which implementation the victim is (the Python worker serves fewer types).
    pub kind: super::victim::Kind,
    pub listen: String,
    pub unix: Option<String>,
    pub secret: Vec<u8>,
    pub pid: u32,
    pub bounds: Bounds,
}

/// Every attack, by the name the command line and the JSON use.
pub const ALL: &[&str] = &[
    "bad-bodies",
    "failed-redemptions",
    "sigbus",
    "huge-sizes",
    "sparse-segments",
    "hello-bomb",
    "redemption-stall",
    "inbox-bytes",
    "refusal-flood",
    "shm-leases",
    "forward-holders",
    "slow-reader",
    "slowloris",
    "fds-before-handshake",
    "stalled-frame",
    "reused-node-id",
    "ticket-addr",
];

/// The issue-11 classes (numbered as in the issue) each attack exercises.
pub fn classes(attack: &str) -> &'static [u8] {
    match attack {
        "bad-bodies" | "failed-redemptions" => &[1],
        "sigbus" => &[2],
        "huge-sizes" => &[3],
        "sparse-segments" => &[4],
        "hello-bomb" => &[5, 14],
        "redemption-stall" => &[6],
        "inbox-bytes" => &[7],
        "refusal-flood" => &[8],
        "shm-leases" | "forward-holders" => &[9],
        "slow-reader" => &[10],
        "slowloris" | "fds-before-handshake" | "stalled-frame" => &[11],
        "reused-node-id" => &[12],
        "ticket-addr" => &[13],
        _ => &[],
    }
}

/// Extra `handoff node` / worker arguments an attack needs from its victim.
pub fn victim_args(attack: &str) -> &'static [&'static str] {
    match attack {
        "forward-holders" => &["--ticket-threshold", "1024"],
        // An application that takes 20 messages a second: the inbox fills.
        "inbox-bytes" => &["--delay-ms", "50"],
        // Node-id uniqueness holds over both handshakes, for a victim that runs both.
        "reused-node-id" => &["--accept-v1"],
        _ => &[],
    }
}

/// Whether the attack makes the victim's application slow on purpose (`victim_args`).
pub fn slows_the_application(attack: &str) -> bool {
    victim_args(attack).contains(&"--delay-ms")
}

/// Runs the attack `name` against `target`.
pub async fn run(name: &str, target: &Target) -> Result<Findings> {
    let mut f = Findings::default();
    match name {
        "bad-bodies" => bad_bodies(target, &mut f).await?,
        "failed-redemptions" => failed_redemptions(target, &mut f).await?,
        "sigbus" => sigbus(target, &mut f).await?,
        "huge-sizes" => huge_sizes(target, &mut f).await?,
        "sparse-segments" => sparse_segments(target, &mut f).await?,
        "hello-bomb" => hello_bomb(target, &mut f).await?,
        "redemption-stall" => redemption_stall(target, &mut f).await?,
        "inbox-bytes" => inbox_bytes(target, &mut f).await?,
        "refusal-flood" => refusal_flood(target, &mut f).await?,
        "shm-leases" => shm_leases(target, &mut f).await?,
        "forward-holders" => forward_holders(target, &mut f).await?,
        "slow-reader" => slow_reader(target, &mut f).await?,
        "slowloris" => slowloris(target, &mut f).await?,
        "fds-before-handshake" => fds_before_handshake(target, &mut f).await?,
        "stalled-frame" => stalled_frame(target, &mut f).await?,
        "reused-node-id" => reused_node_id(target, &mut f).await?,
        "ticket-addr" => ticket_addr(target, &mut f).await?,
        other => bail!("no attack named {other:?}; attacks: {}", ALL.join(", ")),
    }
    Ok(f)
}

// ------------------------------------------------------------------ message building

/// A `msg` whose body is `value` encoded as the reference does, with `frames` as given.
fn msg<T: Message>(value: &T, frames: Vec<Descriptor>) -> Vec<u8> {
    let encoded = handoff::wire::encode(value, None).expect("encoding a test message");
    framed(&Header::Msg {
        type_name: T::TYPE_NAME,
        body: &encoded.body,
        frames,
    })
}

/// A `msg` of type `t` with a raw body and no frames.
fn raw_body(t: &str, body: &[u8]) -> Vec<u8> {
    framed(&Header::Msg {
        type_name: t,
        body,
        frames: vec![],
    })
}

/// A `Blob` whose data is the one frame `frame` (its bytes, if inline, follow).
fn blob(seq: u64, frame: Descriptor) -> Vec<u8> {
    msg(
        &Blob {
            seq,
            data: Buffer::new(),
        },
        vec![frame],
    )
}

fn ping(seq: u64) -> Vec<u8> {
    msg(
        &Ping {
            seq,
            data: vec![7; 100],
        },
        vec![],
    )
}

fn ticket(owner: &str, addr: Option<String>, len: u64, digest: [u8; 32]) -> Descriptor {
    Descriptor::Ticket(TicketClaim {
        len,
        owner: owner.to_string(),
        addr,
        lease: 1,
        token: rand::random::<[u8; 32]>().to_vec(),
        digest: digest.to_vec(),
        ttl_ms: 30_000,
        lazy: false,
    })
}

/// Reads headers until a `msg` of type `t` arrives; returns its body and descriptors.
async fn answer_of(raw: &mut Raw, t: &str) -> Result<(Vec<u8>, Vec<Descriptor>)> {
    loop {
        let h = raw.read_header_bytes().await?;
        match Header::decode(&h, &Limits::default())? {
            Header::Msg {
                type_name,
                body,
                frames,
            } => {
                let inline: u64 = frames.iter().map(Descriptor::inline_len).sum();
                raw.skip(inline).await?;
                if type_name == t {
                    return Ok((body.to_vec(), frames));
                }
            }
            Header::Error { code, message } => bail!("the victim closed with {message} [{code}]"),
            Header::Ticket(TicketOp::Pulled { len, .. }) => raw.skip(len).await?,
            _ => {}
        }
    }
}

/// A round trip on this raw connection: the victim still serves it. Only the answer with
/// `seq` counts (a victim that wrongly echoed an earlier, malformed `Ping` must not pass
/// for having served this one).
async fn served(raw: &mut Raw, seq: u64) -> bool {
    if raw.write(&ping(seq)).await.is_err() {
        return false;
    }
    let answered = async {
        loop {
            let (body, _) = answer_of(raw, Ping::TYPE_NAME).await?;
            if rmp_decode::<Ping>(&body).is_ok_and(|p| p.seq == seq) {
                return Ok::<_, anyhow::Error>(());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), answered)
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Reads the next ticket-protocol header (a `pull` the victim sends as a holder).
async fn next_ticket_op(raw: &mut Raw) -> Result<TicketOp> {
    loop {
        let h = raw.read_header_bytes().await?;
        match Header::decode(&h, &Limits::default())? {
            Header::Ticket(op) => return Ok(op),
            Header::Error { code, message } => bail!("the victim closed with {message} [{code}]"),
            Header::Msg { frames, .. } => raw.skip(frames.iter().map(Descriptor::inline_len).sum()).await?,
            _ => {}
        }
    }
}

// ------------------------------------------------------------------ 1. bodies, redemptions

async fn bad_bodies(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("bad-bodies"), &t.secret).await?;
    // {"seq": "x", "data": bin}: a field of the wrong type.
    let wrong_type = [
        0x82, 0xa3, b's', b'e', b'q', 0xa1, b'x', 0xa4, b'd', b'a', b't', b'a', 0xc4, 0x00,
    ];
    // {"seq": 1, "data": frame 5} in a message without frames.
    let bad_ref = [
        0x82, 0xa3, b's', b'e', b'q', 0x01, 0xa4, b'd', b'a', b't', b'a', 0xd6, 0x01, 0, 0, 0, 5,
    ];
    // 200 nested arrays.
    let mut deep = vec![0x82, 0xa3, b's', b'e', b'q'];
    deep.extend(std::iter::repeat_n(0x91, 200));
    deep.push(0x01);
    deep.extend_from_slice(&[0xa4, b'd', b'a', b't', b'a', 0xc4, 0x00]);
    for i in 0..300u64 {
        raw.write(&raw_body(Ping::TYPE_NAME, &wrong_type)).await?;
        raw.write(&raw_body(Blob::TYPE_NAME, &bad_ref)).await?;
        raw.write(&raw_body(Ping::TYPE_NAME, &deep)).await?;
        if i % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    f.check(
        served(&mut raw, 1).await,
        "after 900 bodies that do not decode, the same connection is served",
    );
    Ok(())
}

async fn failed_redemptions(t: &Target, f: &mut Findings) -> Result<()> {
    let len = 1u64 << 20;
    let digest = *blake3::hash(&vec![1u8; len as usize]).as_bytes();
    for (variant, what) in [
        ("digest", "bytes that do not match the digest"),
        ("refuse", "a refusal"),
        ("silence", "no answer until the pull timeout"),
        ("drop", "the owner dropping out mid-pull"),
    ] {
        let who = Identity::fresh(&format!("owner-{variant}"));
        let mut raw = Raw::tcp_handshaken(&t.listen, &who, &t.secret).await?;
        raw.write(&blob(1, ticket(&who.node_id, None, len, digest))).await?;
        let op = tokio::time::timeout(Duration::from_secs(10), next_ticket_op(&mut raw))
            .await
            .context("the victim did not pull the ticket")??;
        let TicketOp::Pull { req, len: n, .. } = op else {
            bail!("expected a pull, got {op:?}")
        };
        match variant {
            "digest" => {
                raw.write(&framed(&Header::Ticket(TicketOp::Pulled { req, len: n })))
                    .await?;
                raw.write(&vec![2u8; n as usize]).await?;
            }
            "refuse" => {
                let refusal = TicketOp::Refused {
                    req,
                    code: "bad-token".into(),
                    message: "no".into(),
                };
                raw.write(&framed(&Header::Ticket(refusal))).await?;
            }
            "silence" => tokio::time::sleep(Duration::from_millis(t.bounds.timeout_ms + 500)).await,
            _ => {
                raw.write(&framed(&Header::Ticket(TicketOp::Pulled { req, len: n })))
                    .await?;
                raw.write(&vec![1u8; (n / 2) as usize]).await?;
                drop(raw);
                continue;
            }
        }
        f.check(
            served(&mut raw, 2).await,
            format!("a failed redemption ({what}) leaves the connection served"),
        );
    }
    Ok(())
}

// ------------------------------------------------------------------ 2, 4: segments

fn shm_frame(n: u64, off: u64, size: u64, lease: u64, sealed: bool) -> Descriptor {
    Descriptor::Shm {
        len: n,
        offset: off,
        size,
        lease,
        sealed,
    }
}

async fn sigbus(t: &Target, f: &mut Findings) -> Result<()> {
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

async fn sparse_segments(t: &Target, f: &mut Findings) -> Result<()> {
    let unix = t.unix.as_deref().context("the victim has no Unix socket")?;
    let mut raw = Raw::unix_handshaken(unix, &Identity::fresh("sparse"), &t.secret).await?;
    let before = super::victim::memory(t.pid).unwrap_or_default();
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
    let after = super::victim::memory(t.pid).unwrap_or_default();
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

fn rmp_decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    Ok(handoff::wire::decode::<T>("", body, &[], None)?)
}

// ------------------------------------------------------------------ 3. sizes

async fn huge_sizes(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("huge-sizes"), &t.secret).await?;
    for bytes in [1u64 << 50, u64::MAX, t.bounds.max_request + 1] {
        raw.write(&msg(&SendRequest { id: 1, bytes }, vec![])).await?;
        if t.kind == super::victim::Kind::Python {
            // The Python worker serves neither RawSend nor chaos.Issue (unknown-type would
            // close the connection).
            continue;
        }
        raw.write(&msg(
            &RawSend {
                addr: "127.0.0.1:9".into(),
                bytes,
            },
            vec![],
        ))
        .await?;
        raw.write(&msg(
            &Issue {
                id: 2,
                bytes,
                to: "nobody".into(),
                forward_to: None,
                leak: false,
            },
            vec![],
        ))
        .await?;
    }
    raw.write(&msg(&SendRequest { id: 3, bytes: 1024 }, vec![])).await?;
    let answer = tokio::time::timeout(Duration::from_secs(10), answer_of(&mut raw, Payload::TYPE_NAME)).await;
    let id = match answer {
        Ok(Ok((body, _))) => rmp_decode::<PayloadId>(&body).map(|p| p.id).ok(),
        _ => None,
    };
    f.check(
        id == Some(3),
        format!("after requests for 2^50, 2^64-1 and limit+1 bytes, a 1 KiB request is answered (got payload {id:?})"),
    );
    Ok(())
}

#[derive(serde::Deserialize)]
struct PayloadId {
    id: u64,
}

// ------------------------------------------------------------------ 5, 14: before authentication

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
async fn hello_bomb(t: &Target, f: &mut Findings) -> Result<()> {
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
        raw.write(&framed(&super::raw::challenge())).await?;
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
    raw.write(&framed(&super::raw::challenge())).await?;
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

// ------------------------------------------------------------------ 6, 7: memory while stalled

/// Sends 1 MiB `Blob`s on `raw` for at most `limit`; returns how many went out.
async fn flood_blobs(raw: &mut Raw, count: u64, limit: Duration) -> u64 {
    let data = vec![5u8; 1 << 20];
    let deadline = tokio::time::Instant::now() + limit;
    for seq in 0..count {
        let mut m = blob(seq, Descriptor::Inline { len: data.len() as u64 });
        m.extend_from_slice(&data);
        match tokio::time::timeout_at(deadline, raw.write(&m)).await {
            Ok(Ok(())) => {}
            _ => return seq,
        }
    }
    count
}

async fn redemption_stall(t: &Target, f: &mut Findings) -> Result<()> {
    let who = Identity::fresh("stalling-owner");
    let mut raw = Raw::tcp_handshaken(&t.listen, &who, &t.secret).await?;
    raw.write(&blob(1, ticket(&who.node_id, None, 1 << 20, [0; 32])))
        .await?;
    let op = tokio::time::timeout(Duration::from_secs(10), next_ticket_op(&mut raw)).await??;
    f.check(matches!(op, TicketOp::Pull { .. }), "the victim pulls the ticket");
    // Never answer; flood the same connection meanwhile.
    let sent = flood_blobs(&mut raw, 3000, Duration::from_millis(t.bounds.timeout_ms)).await;
    f.check(
        sent < 3000,
        format!("while its redemption stalls, the victim stops reading the owner: {sent} of 3000 MiB went out"),
    );
    Ok(())
}

async fn inbox_bytes(t: &Target, f: &mut Findings) -> Result<()> {
    // The victim handles a message every 50 ms (`victim_args`): what it reads waits.
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("payload-flood"), &t.secret).await?;
    let data = vec![3u8; 8 << 20];
    let digest = blake3::hash(&data);
    let count = 256u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut sent = 0;
    for id in 0..count {
        let payload = Payload {
            id,
            digest: Buffer::new(),
            data: Buffer::new(),
            prepare_seconds: 0.0,
        };
        let mut m = msg(
            &payload,
            vec![
                Descriptor::Inline { len: 32 },
                Descriptor::Inline { len: data.len() as u64 },
            ],
        );
        m.extend_from_slice(digest.as_bytes());
        m.extend_from_slice(&data);
        match tokio::time::timeout_at(deadline, raw.write(&m)).await {
            Ok(Ok(())) => sent += 1,
            _ => break,
        }
    }
    f.check(
        sent < count,
        format!("{sent} of {count} payloads of 8 MiB went out in 5 s: the victim read only what its bounds hold"),
    );
    Ok(())
}

// ------------------------------------------------------------------ 8. refusals

async fn refusal_flood(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("refusal-flood"), &t.secret).await?;
    let count = 100_000u64;
    let reading = {
        // Read the refusals as they come (a peer that reads nothing is another attack).
        let Raw { stream, peer, seen } = raw;
        let (mut reader, writer) = split(stream);
        let counter = tokio::spawn(async move {
            let mut refused = 0u64;
            while refused < count {
                match tokio::time::timeout(Duration::from_secs(10), read_refusal(&mut reader)).await {
                    Ok(Ok(true)) => refused += 1,
                    Ok(Ok(false)) => {}
                    _ => break,
                }
            }
            refused
        });
        raw = Raw {
            stream: writer,
            peer,
            seen,
        };
        counter
    };
    let mut batch = Vec::with_capacity(1 << 20);
    for req in 0..count {
        let pull = TicketOp::Pull {
            req,
            lease: 1_000_000 + req,
            token: vec![1; 32],
            offset: 0,
            len: 1,
        };
        batch.extend_from_slice(&framed(&Header::Ticket(pull)));
        if batch.len() > 512 << 10 {
            raw.write(&batch).await?;
            batch.clear();
        }
    }
    raw.write(&batch).await?;
    let refused = reading.await.unwrap_or(0);
    f.check(
        refused == count,
        format!("{refused} of {count} bad pulls were refused with ticket-error, the connection kept"),
    );
    Ok(())
}

/// Splits a raw stream into a read half (TCP only here) and the writing `Stream`.
fn split(stream: super::raw::Stream) -> (tokio::net::tcp::OwnedReadHalf, super::raw::Stream) {
    match stream {
        super::raw::Stream::Tcp(s) => {
            let (r, w) = s.into_split();
            (r, super::raw::Stream::TcpWrite(w))
        }
        super::raw::Stream::Unix(_) | super::raw::Stream::TcpWrite(_) => unreachable!("TCP only"),
    }
}

/// Reads one header; whether it is a `ticket-error`.
async fn read_refusal(r: &mut tokio::net::tcp::OwnedReadHalf) -> Result<bool> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let mut h = vec![0u8; u32::from_be_bytes(len) as usize];
    r.read_exact(&mut h).await?;
    Ok(matches!(
        Header::decode(&h, &Limits::default())?,
        Header::Ticket(TicketOp::Refused { .. })
    ))
}

// ------------------------------------------------------------------ 9. leases and holders

async fn shm_leases(t: &Target, f: &mut Findings) -> Result<()> {
    let unix = t.unix.as_deref().context("the victim has no Unix socket")?;
    let mut raw = Raw::unix_handshaken(unix, &Identity::fresh("never-releases"), &t.secret).await?;
    let asked = 20u64;
    for id in 0..asked {
        raw.write(&msg(&SendRequest { id, bytes: 1 << 20 }, vec![])).await?;
    }
    let mut got = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(t.bounds.timeout_ms * (asked + 2));
    while got < asked {
        match tokio::time::timeout_at(deadline, answer_of(&mut raw, Payload::TYPE_NAME)).await {
            Ok(Ok(_)) => got += 1,
            _ => break,
        }
    }
    let cap = t.bounds.shm_per_peer >> 20;
    f.check(
        got <= cap,
        format!("a peer that never releases got {got} payloads of 1 MiB in shared memory (at most {cap} leased)"),
    );
    Ok(())
}

async fn forward_holders(t: &Target, f: &mut Findings) -> Result<()> {
    let who = Identity::fresh("forwarder");
    let mut raw = Raw::tcp_handshaken(&t.listen, &who, &t.secret).await?;
    raw.write(&msg(&SendRequest { id: 1, bytes: 64 << 10 }, vec![])).await?;
    let (_, frames) = answer_of(&mut raw, Payload::TYPE_NAME).await?;
    let claim = frames
        .iter()
        .find_map(|d| match d {
            Descriptor::Ticket(c) => Some(c.clone()),
            _ => None,
        })
        .context("the victim sent no ticket (is --ticket-threshold set?)")?;
    let forward = |req: u64, to: String| {
        framed(&Header::Ticket(TicketOp::Forward {
            req,
            lease: claim.lease,
            token: claim.token.clone(),
            to,
        }))
    };
    let bad = [
        "short".to_string(),
        "A".repeat(32),
        "g".repeat(32),
        raw.victim_id().to_string(),
        String::new(),
    ];
    for (req, to) in bad.iter().enumerate() {
        raw.write(&forward(req as u64, to.clone())).await?;
    }
    let mut bad_holder = 0;
    for _ in 0..bad.len() {
        if let TicketOp::Refused { code, .. } = next_ticket_op(&mut raw).await? {
            bad_holder += (code == "bad-holder") as usize;
        }
    }
    f.check(
        bad_holder == bad.len(),
        format!(
            "{bad_holder} of {} forwards to ids that are not node ids were refused with bad-holder",
            bad.len()
        ),
    );
    let tries = 100u64;
    for req in 0..tries {
        raw.write(&forward(100 + req, handoff::identity::random_id())).await?;
    }
    let (mut forwarded, mut capped) = (0, 0);
    for _ in 0..tries {
        match next_ticket_op(&mut raw).await? {
            TicketOp::Forwarded { .. } => forwarded += 1,
            TicketOp::Refused { code, .. } if code == "too-many-holders" => capped += 1,
            _ => {}
        }
    }
    f.check(
        forwarded == 63 && capped == tries - 63,
        format!("{forwarded} forwards to new holders were taken and {capped} refused with too-many-holders (64 holds per lease)"),
    );
    Ok(())
}

// ------------------------------------------------------------------ 10, 11: slow, silent, stalled

async fn slow_reader(t: &Target, f: &mut Findings) -> Result<()> {
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

async fn slowloris(t: &Target, f: &mut Findings) -> Result<()> {
    raise_fd_limit();
    let before = super::victim::memory(t.pid).unwrap_or_default();
    let mut idle = Vec::with_capacity(2000);
    for _ in 0..2000 {
        let mut raw = Raw::tcp(&t.listen).await?;
        raw.write(b"H").await?;
        idle.push(raw);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peak = super::victim::memory(t.pid).unwrap_or_default();
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

async fn fds_before_handshake(t: &Target, f: &mut Findings) -> Result<()> {
    let unix = t.unix.as_deref().context("the victim has no Unix socket")?;
    let before = open_fds(t.pid);
    let mut refused = 0;
    let rounds = 20;
    for _ in 0..rounds {
        let fds: Vec<_> = (0..64).map(|_| memfd(4096, SealFlags::SHRINK)).collect::<Result<_>>()?;
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let mut raw = Raw::unix(unix).await?;
        raw.write_with_fds(&handoff::wire::Preamble::OURS.encode(), &borrowed)
            .await?;
        raw.write_with_fds(&framed(&super::raw::challenge()), &borrowed).await?;
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
        format!("{refused} of {rounds} connections passing descriptors before the handshake were refused with bad-shm"),
    );
    f.check(
        after <= before + 8,
        format!("the victim's open descriptors went from {before} to {after}"),
    );
    Ok(())
}

async fn stalled_frame(t: &Target, f: &mut Findings) -> Result<()> {
    let before = super::victim::memory(t.pid).unwrap_or_default();
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("staller"), &t.secret).await?;
        let mut m = blob(1, Descriptor::Inline { len: 1 << 30 });
        m.extend(std::iter::repeat_n(9u8, 64 << 20));
        // The victim reads one such message at a time: the others wait, unread.
        let _ = tokio::time::timeout(Duration::from_secs(3), raw.write(&m)).await;
        stalled.push(raw);
    }
    let mid = super::victim::memory(t.pid).unwrap_or_default();
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

// ------------------------------------------------------------------ 12, 13: identity

async fn reused_node_id(t: &Target, f: &mut Findings) -> Result<()> {
    let first = Identity::fresh("original");
    let mut a = Raw::tcp_handshaken(&t.listen, &first, &t.secret).await?;
    f.check(served(&mut a, 1).await, "the first connection is served");
    let impostor = Identity {
        process_id: handoff::identity::random_id(),
        name: "impostor".into(),
        ..first.clone()
    };
    let second = Raw::tcp_handshaken(&t.listen, &impostor, &t.secret).await;
    let refused = second.as_ref().err().map(|e| e.to_string());
    f.check(
        refused.as_deref().is_some_and(|e| e.contains("[handshake]")),
        format!("a second process with the same node id is refused ({refused:?})"),
    );
    f.check(served(&mut a, 2).await, "the first connection is still served");
    let same = Raw::tcp_handshaken(&t.listen, &first, &t.secret).await;
    f.check(same.is_ok(), "the same process may connect again");
    // The same over version 1, which this victim accepts (`victim_args`): the check runs on
    // the identity of the hello as it does on an ident.
    let mut v1 = Raw::tcp(&t.listen).await?;
    let impostor = Identity {
        process_id: handoff::identity::random_id(),
        name: "impostor-v1".into(),
        ..first.clone()
    };
    let refused = v1.handshake_v1(&impostor, &t.secret).await.err().map(|e| e.to_string());
    f.check(
        refused.as_deref().is_some_and(|e| e.contains("[handshake]")),
        format!("over version 1 too, a second process with the same node id is refused ({refused:?})"),
    );
    let mut v1 = Raw::tcp(&t.listen).await?;
    let same = v1.handshake_v1(&first, &t.secret).await;
    f.check(
        same.is_ok(),
        format!("the same process may connect again over version 1 ({same:?})"),
    );
    Ok(())
}

async fn ticket_addr(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("misdirector"), &t.secret).await?;
    let victim = raw.victim_id().to_string();
    let digest = [0u8; 32];
    let cases = [
        (victim.clone(), Some(t.listen.clone()), "names the victim as its owner"),
        (
            handoff::identity::random_id(),
            Some(t.listen.clone()),
            "points at the victim's own address",
        ),
        (
            handoff::identity::random_id(),
            Some("unix:///tmp/not-a-node.sock".into()),
            "points at a unix:// address",
        ),
    ];
    let started = Instant::now();
    for (seq, (owner, addr, _)) in cases.iter().enumerate() {
        raw.write(&blob(seq as u64, ticket(owner, addr.clone(), 4096, digest)))
            .await?;
    }
    // The victim fails these at once; it answers a ping behind them without waiting for any
    // pull timeout.
    let ok = served(&mut raw, 99).await;
    let took = started.elapsed();
    f.check(
        ok && took < Duration::from_millis(t.bounds.timeout_ms),
        format!("tickets that name the victim itself or its address fail at once (served again after {took:?})"),
    );
    raw.write(&msg(&StatsRequest {}, vec![])).await?;
    let (body, _) = answer_of(&mut raw, crate::protocol::Stats::TYPE_NAME).await?;
    let stats: crate::protocol::Stats = rmp_decode(&body)?;
    let to_itself = stats.peers.iter().any(|(name, _)| name == "victim");
    f.check(
        !to_itself,
        format!("the victim did not connect to itself (its peers: {:?})", stats.peers),
    );
    Ok(())
}
