//! What every attack builds on: the findings it reports, the target it attacks, and the raw messages it sends
//! and reads (a `msg` with a given body and frames, a ticket claim, a round trip that proves the victim still
//! serves).

use std::time::Duration;

use anyhow::{bail, Result};
use handoff::wire::{Buffer, Descriptor, Header, Limits, TicketClaim, TicketOp};
use handoff::Message;
use serde::Serialize;

use crate::hostile::raw::{framed, Raw};
use crate::hostile::victim::Bounds;
use crate::protocol::{Blob, Ping};

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
    pub kind: crate::hostile::victim::Kind,
    pub listen: String,
    pub unix: Option<String>,
    pub secret: Vec<u8>,
    pub pid: u32,
    pub bounds: Bounds,
    /// A second node of the same cluster, for the attacks that need two.
    pub second: Option<String>,
}

/// A `msg` whose body is `value` encoded as the reference does, with `frames` as given.
pub(super) fn msg<T: Message>(value: &T, frames: Vec<Descriptor>) -> Vec<u8> {
    let encoded = handoff::wire::encode(value, None).expect("encoding a test message");
    framed(&Header::Msg {
        type_name: T::TYPE_NAME,
        body: &encoded.body,
        frames,
    })
}

/// A `msg` of type `t` with a raw body and no frames.
pub(super) fn raw_body(t: &str, body: &[u8]) -> Vec<u8> {
    framed(&Header::Msg {
        type_name: t,
        body,
        frames: vec![],
    })
}

/// A `Blob` whose data is the one frame `frame` (its bytes, if inline, follow).
pub(super) fn blob(seq: u64, frame: Descriptor) -> Vec<u8> {
    msg(
        &Blob {
            seq,
            data: Buffer::new(),
        },
        vec![frame],
    )
}

pub(super) fn ping(seq: u64) -> Vec<u8> {
    msg(
        &Ping {
            seq,
            data: vec![7; 100],
        },
        vec![],
    )
}

pub(super) fn ticket(owner: &str, addr: Option<String>, len: u64, digest: [u8; 32]) -> Descriptor {
    Descriptor::Ticket(TicketClaim {
        len,
        owner: owner.to_string(),
        addr,
        lease: 1,
        token: rand::random::<[u8; 32]>().to_vec(),
        digest: handoff::wire::TicketDigest::Blake3(digest),
        ttl_ms: 30_000,
        lazy: false,
    })
}

/// Reads headers until a `msg` of type `t` arrives; returns its body and descriptors.
pub(super) async fn answer_of(raw: &mut Raw, t: &str) -> Result<(Vec<u8>, Vec<Descriptor>)> {
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
pub(super) async fn served(raw: &mut Raw, seq: u64) -> bool {
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
pub(super) async fn next_ticket_op(raw: &mut Raw) -> Result<TicketOp> {
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

pub(super) fn rmp_decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    Ok(handoff::wire::decode::<T>("", body, &[], None)?)
}
