//! Issue 24: a peer without the cluster secret tries to authenticate by making the nodes
//! prove for it (spec WIRE.md §5.6, §5.8): reflecting and interleaving their challenges and
//! proofs across two connections, to one node or to two nodes of one cluster; replaying a
//! recorded proof on a new connection; relaying a connection the victim dialed back into
//! it; and changing the preambles in flight to make two nodes settle for version 2.
//!
//! Each attack checks what the victim sent on the attacker's connections: no `ident`, no
//! `ready`, no proof of its own to a peer that has not proven the secret, and an error
//! (or a close) instead.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use handoff::wire::{auth, decode_message, Header, Limits, Preamble};
use tokio::net::TcpListener;

use super::common::{blob, ticket, Findings, Target};
use crate::hostile::raw::{challenge_of, framed, framed_raw, Identity, Raw, Stream};

/// What the victim sent on one connection, after its preamble: the kinds of its headers,
/// and the code of its `error`, if one came.
#[derive(Debug, Default)]
struct Answered {
    kinds: Vec<String>,
    error: Option<String>,
}

impl Answered {
    /// Whether the victim proved anything or said who it is.
    fn gave_away(&self) -> Vec<&str> {
        self.kinds
            .iter()
            .map(String::as_str)
            .filter(|k| matches!(*k, "auth" | "ident" | "ready" | "hello"))
            .collect()
    }
}

/// Decodes what the victim sent on a connection (its preamble first).
fn answered(bytes: &[u8]) -> Answered {
    let mut out = Answered::default();
    let mut rest = bytes.get(16..).unwrap_or_default();
    while !rest.is_empty() {
        let Ok(m) = decode_message(rest, &Limits::default()) else {
            break;
        };
        out.kinds.push(m.header.kind().to_string());
        if let Header::Error { code, .. } = &m.header {
            out.error = Some(code.clone());
        }
        rest = &rest[m.consumed..];
    }
    out
}

/// Everything the victim sent on `raw`, read until it closes (within `limit`).
async fn everything(raw: &mut Raw, limit: Duration) -> (Answered, bool) {
    let (rest, closed) = raw.until_closed(limit).await;
    let mut all = raw.seen.clone();
    all.extend_from_slice(&rest);
    (answered(&all), closed)
}

/// The next header the victim sends within `limit`, if any.
async fn next_header(raw: &mut Raw, limit: Duration) -> Option<Vec<u8>> {
    tokio::time::timeout(limit, raw.read_header_bytes()).await.ok()?.ok()
}

/// Opens a connection to `addr`, sends the victim's own preamble back to it (so that both
/// preambles of the connection are the same bytes, as §5.6 needs) and reads the victim's
/// challenge (its header bytes).
async fn opened(addr: &str) -> Result<(Raw, Vec<u8>)> {
    let mut raw = Raw::tcp(addr).await?;
    raw.skip(16).await?;
    let theirs = raw.seen[..16].to_vec();
    raw.write(&theirs).await?;
    let challenge = raw.read_header_bytes().await?;
    match Header::decode(&challenge, &Limits::default())? {
        Header::Challenge { .. } => Ok((raw, challenge)),
        other => bail!("expected the victim's challenge, got {other:?}"),
    }
}

/// The attack of §5.6 on connections to `a` and `b` (one node twice, or two nodes): the
/// victims' challenges crossed, and any proof a victim writes forwarded to the other
/// connection, where it would be the attacker's.
async fn crossed(a: &str, b: &str, what: &str, f: &mut Findings) -> Result<()> {
    let (mut ra, ca) = opened(a).await?;
    let (mut rb, cb) = opened(b).await?;
    ra.write(&framed_raw(&cb)).await?;
    rb.write(&framed_raw(&ca)).await?;
    // A version-2 victim would now prove on both connections; forward what comes.
    let (pa, pb) = tokio::join!(
        next_header(&mut ra, Duration::from_millis(500)),
        next_header(&mut rb, Duration::from_millis(500))
    );
    for (proof, to) in [(pb, &mut ra), (pa, &mut rb)] {
        match proof {
            Some(p) => to.write(&framed_raw(&p)).await.ok(),
            // Nothing to forward: the attacker's only move is a proof it made up.
            None => to.write(&framed(&Header::Auth { mac: vec![0x5a; 32] })).await.ok(),
        };
    }
    let ((on_a, closed_a), (on_b, closed_b)) = tokio::join!(
        everything(&mut ra, Duration::from_secs(5)),
        everything(&mut rb, Duration::from_secs(5))
    );
    for (name, seen, closed) in [("A", on_a, closed_a), ("B", on_b, closed_b)] {
        f.check(
            seen.gave_away().is_empty(),
            format!(
                "{what}, connection {name}: the victim sent no proof, ident or ready (it sent {:?})",
                seen.kinds
            ),
        );
        f.check(
            closed && seen.error.as_deref() == Some("auth-failed"),
            format!(
                "{what}, connection {name}: refused with auth-failed (got {:?}, closed {closed})",
                seen.error
            ),
        );
    }
    Ok(())
}

/// Reflection and interleaving across two connections to the victim.
pub(super) async fn reflection(t: &Target, f: &mut Findings) -> Result<()> {
    crossed(&t.listen, &t.listen, "two connections to one node", f).await
}

/// The same across two nodes of one cluster (the victim and a second node with its secret).
pub(super) async fn interleaving_two_nodes(t: &Target, f: &mut Findings) -> Result<()> {
    let second = t.second.as_deref().context("this attack needs a second victim")?;
    crossed(&t.listen, second, "connections to two nodes of one cluster", f).await
}

/// A proof recorded on one connection (an observer saw a member's handshake) replayed, with
/// the member's preamble and challenge, on a new connection.
pub(super) async fn replay(t: &Target, f: &mut Findings) -> Result<()> {
    let preamble = Preamble::OURS.encode();
    let own = framed(&challenge_of(3, rand::random::<[u8; 32]>().to_vec()));
    // The member's handshake, as the observer saw it.
    let (mut first, theirs) = opened(&t.listen).await?;
    first.write(&own).await?;
    let transcript = auth::Transcript {
        dialer: auth::Sent {
            preamble: &preamble,
            challenge: &own[4..],
        },
        acceptor: auth::Sent {
            preamble: &preamble,
            challenge: &theirs,
        },
    };
    let recorded = framed(&Header::Auth {
        mac: auth::dialer_proof(&t.secret, &transcript).to_vec(),
    });
    first.write(&recorded).await?;
    let answer = next_header(&mut first, Duration::from_secs(5))
        .await
        .unwrap_or_default();
    f.check(
        matches!(Header::decode(&answer, &Limits::default()), Ok(Header::Auth { .. })),
        "the member's own handshake is answered with the victim's proof",
    );
    drop(first);
    // The replay: the same bytes on a new connection, whose challenge from the victim is new.
    let (mut again, _) = opened(&t.listen).await?;
    again.write(&own).await?;
    again.write(&recorded).await?;
    let (seen, closed) = everything(&mut again, Duration::from_secs(5)).await;
    f.check(
        seen.gave_away().is_empty() && closed && seen.error.as_deref() == Some("auth-failed"),
        format!(
            "a proof replayed on a new connection is refused with auth-failed, nothing given away (sent {:?}, error {:?})",
            seen.kinds, seen.error
        ),
    );
    Ok(())
}

/// The victim is made to dial the attacker (a ticket whose owner address is the attacker's,
/// sent by a member), while the attacker dials the victim; the challenges are crossed so
/// that the victim's own dialer proof is exactly the proof it expects on the connection it
/// accepted. The victim must refuse that connection at the challenge (§5.7 step 3), and say
/// nothing about itself on either.
pub(super) async fn relay_to_self(t: &Target, f: &mut Findings) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = format!("tcp://{}", listener.local_addr()?);
    let mut member = Raw::tcp_handshaken(&t.listen, &Identity::fresh("member"), &t.secret).await?;
    let lure = blob(1, ticket(&handoff::identity::random_id(), Some(addr), 4096, [0; 32]));
    member.write(&lure).await?;
    let (dialed, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .context("the victim did not dial the ticket's owner address")??;
    let mut on_c = Raw::over(Stream::Tcp(dialed));
    on_c.write(&Preamble::OURS.encode()).await?;
    on_c.skip(16).await?;
    let cc = on_c.read_header_bytes().await?;
    let (mut on_a, ca) = opened(&t.listen).await?;
    // On C the attacker's challenge is the victim's from A: the victim, as dialer, proves.
    on_c.write(&framed_raw(&ca)).await?;
    let proof = next_header(&mut on_c, Duration::from_secs(5)).await;
    let Some(Ok(Header::Auth { mac })) = proof.as_deref().map(|p| Header::decode(p, &Limits::default())) else {
        bail!("the victim, dialing, sent no proof ({proof:?})");
    };
    // That proof is exactly the dialer's proof the victim expects on A (the check below is
    // what stops it, not the transcript): shown with the secret the harness knows.
    let preamble = Preamble::OURS.encode();
    let on_a_transcript = auth::Transcript {
        dialer: auth::Sent {
            preamble: &preamble,
            challenge: &cc,
        },
        acceptor: auth::Sent {
            preamble: &preamble,
            challenge: &ca,
        },
    };
    f.check(
        auth::verify_dialer(&t.secret, &mac, &on_a_transcript).is_ok(),
        "the victim's proof from the connection it dialed would verify on the one it accepted",
    );
    on_a.write(&framed_raw(&cc)).await?;
    on_a.write(&framed(&Header::Auth { mac })).await.ok();
    let (seen_a, closed) = everything(&mut on_a, Duration::from_secs(5)).await;
    f.check(
        seen_a.gave_away().is_empty() && closed && seen_a.error.as_deref() == Some("handshake"),
        format!(
            "the relayed connection is refused at the challenge with handshake, nothing given away (sent {:?}, error {:?})",
            seen_a.kinds, seen_a.error
        ),
    );
    drop(on_c);
    Ok(())
}

/// Against a victim that accepts version 2 (`--accept-v2`): an attacker on the path changes
/// both preambles to `2..=2`, so that the victim and a member that also accepts version 2
/// would settle for version 2. The proofs cover the preambles: the member's proof fails on
/// the victim, and the victim's on the member.
pub(super) async fn downgrade(t: &Target, f: &mut Findings) -> Result<()> {
    let forged = Preamble::V2_ONLY.encode();
    let member_sent = Preamble::ACCEPTING_V2.encode();
    let mut raw = Raw::tcp(&t.listen).await?;
    // The victim receives the forged preamble in place of the member's.
    raw.write(&forged).await?;
    let mut victim_sent = [0u8; 16];
    victim_sent.copy_from_slice(&{
        raw.skip(16).await?;
        raw.seen[..16].to_vec()
    });
    let own = framed(&challenge_of(2, rand::random::<[u8; 32]>().to_vec()));
    raw.write(&own).await?;
    let theirs = raw.read_header_bytes().await?;
    // The member's proof: over what it sent (2..=3) and what it got (the forged 2..=2).
    let member = auth::Sent {
        preamble: &member_sent,
        challenge: &own[4..],
    };
    let victim_as_seen = auth::Sent {
        preamble: &forged,
        challenge: &theirs,
    };
    raw.write(&framed(&Header::Auth {
        mac: auth::proof_v2(&t.secret, member, victim_as_seen).to_vec(),
    }))
    .await?;
    let victim_proof = next_header(&mut raw, Duration::from_secs(5)).await;
    let (seen, closed) = everything(&mut raw, Duration::from_secs(5)).await;
    f.check(
        seen.error.as_deref() == Some("auth-failed") && closed && !seen.kinds.iter().any(|k| k == "ident" || k == "ready"),
        format!(
            "with both preambles changed to 2..=2 in flight, the victim refuses the member's proof with auth-failed (sent {:?}, error {:?})",
            seen.kinds, seen.error
        ),
    );
    // And the member would refuse the victim's.
    let refused = match victim_proof.as_deref().map(|p| Header::decode(p, &Limits::default())) {
        Some(Ok(Header::Auth { mac })) => auth::verify_v2(&t.secret, &mac, victim_as_seen, member).is_err(),
        _ => true,
    };
    f.check(
        refused,
        "the member refuses the victim's proof over the changed preambles",
    );
    // The victim did take the forged preamble for version 2 (it accepts v2): the proofs, not
    // the negotiation, are what stopped it.
    f.check(
        victim_sent == Preamble::ACCEPTING_V2.encode(),
        format!("the victim announces 2..=3 (it accepts version 2): {victim_sent:02x?}"),
    );
    Ok(())
}
