//! Class 9: shared-memory leases and ticket holders a peer keeps without releasing.

use std::time::Duration;

use anyhow::{Context, Result};
use handoff::wire::{Descriptor, Header, TicketOp};
use handoff::Message;

use super::common::{answer_of, msg, next_ticket_op, Findings, Target};
use crate::hostile::raw::{framed, Identity, Raw};
use crate::protocol::{Payload, SendRequest};

pub(super) async fn shm_leases(t: &Target, f: &mut Findings) -> Result<()> {
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

pub(super) async fn forward_holders(t: &Target, f: &mut Findings) -> Result<()> {
    let who = Identity::fresh("forwarder");
    let mut raw = Raw::tcp_handshaken(&t.listen, &who, &t.secret).await?;
    let claim = ticket_of(&mut raw, 64 << 10).await?;
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

/// Pulls sent in one piece, more of them than the answers a victim queues before it stops
/// reading a peer (spec §9.1, 64): it stops with the rest read but unanswered, and must
/// answer them once the answers drain, although the socket says nothing new (the peer
/// sent everything already and only reads). A victim that waits for the socket instead
/// leaves them unanswered and, worse, later fails the peer for silence.
pub(super) async fn pipelined_pulls(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("pipelines-pulls"), &t.secret).await?;
    let claim = ticket_of(&mut raw, 4096).await?;
    let count = 200u64;
    let mut pulls = Vec::new();
    for req in 0..count {
        pulls.extend_from_slice(&framed(&Header::Ticket(TicketOp::Pull {
            req,
            lease: claim.lease,
            token: claim.token.clone(),
            offset: req,
            len: 1,
        })));
    }
    raw.write(&pulls).await?;
    let mut answered = 0u64;
    while answered < count {
        match tokio::time::timeout(Duration::from_secs(5), next_ticket_op(&mut raw)).await {
            Ok(Ok(TicketOp::Pulled { req, len })) if req == answered => {
                raw.skip(len).await?;
                answered += 1;
            }
            _ => break,
        }
    }
    f.check(
        answered == count,
        format!("{answered} of {count} pulls sent in one piece were answered, in order"),
    );
    Ok(())
}

/// Asks the victim for a payload of `bytes` and returns the ticket it sent for it (the
/// attack must have given the victim `--ticket-threshold` below `bytes`).
async fn ticket_of(raw: &mut Raw, bytes: u64) -> Result<handoff::wire::TicketClaim> {
    raw.write(&msg(&SendRequest { id: 1, bytes }, vec![])).await?;
    let (_, frames) = answer_of(raw, Payload::TYPE_NAME).await?;
    frames
        .into_iter()
        .find_map(|d| match d {
            Descriptor::Ticket(c) => Some(c),
            _ => None,
        })
        .context("the victim sent no ticket (is --ticket-threshold set?)")
}
