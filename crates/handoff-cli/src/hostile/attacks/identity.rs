//! Classes 12 and 13: a reused node id, and ticket addresses that point elsewhere (the
//! victim itself, or more owners than a node keeps connections to).

use std::time::{Duration, Instant};

use anyhow::Result;
use handoff::Message;

use super::common::{answer_of, blob, msg, rmp_decode, served, ticket, Findings, Target};
use crate::hostile::raw::{Identity, Raw};
use crate::protocol::StatsRequest;

pub(super) async fn reused_node_id(t: &Target, f: &mut Findings) -> Result<()> {
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

pub(super) async fn ticket_addr(t: &Target, f: &mut Findings) -> Result<()> {
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

/// Owners the `many-owners` attack runs, past the victim's `--max-owner-connections`.
const MANY_OWNERS: usize = 12;
/// The victim's bound on connections to owners it dialed, in that attack (`victim_args`).
pub(super) const OWNER_CONNECTIONS: usize = 4;

/// Tickets that each name another owner, a real node the attacker runs: the victim dials
/// each one to redeem its ticket (the pulls are refused: no such lease), and keeps at most
/// its bound of those connections (spec §9.1). Without the bound a node kept every one, up
/// to its 1024 connections, and then refused every new peer.
pub(super) async fn many_owners(t: &Target, f: &mut Findings) -> Result<()> {
    let mut owners = Vec::new();
    for i in 0..MANY_OWNERS {
        let owner = handoff::Node::builder(format!("owner-{i}"))
            .secret(t.secret.clone())
            .listen("127.0.0.1:0")
            .host_id(format!("owner-host-{i}"))
            .build()
            .await?;
        owners.push(owner);
    }
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("owner-namer"), &t.secret).await?;
    let mut most = 0;
    for (seq, owner) in owners.iter().enumerate() {
        // (A connection used in the last 100 ms does not make room: the owners come apart.)
        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        let addr = owner.listen_addr().map(str::to_string);
        raw.write(&blob(
            seq as u64,
            ticket(&owner.endpoint().node_id, addr, 4096, [0; 32]),
        ))
        .await?;
        // The ping behind it is answered once the ticket's redemption failed.
        f.check(
            served(&mut raw, 1000 + seq as u64).await,
            "the namer's ping is answered",
        );
        let connected = owners.iter().filter(|o| !o.peers().is_empty()).count();
        most = most.max(connected);
    }
    f.check(
        !owners[MANY_OWNERS - 1].peers().is_empty(),
        "the victim reached the last owner named",
    );
    f.check(
        most <= OWNER_CONNECTIONS,
        format!(
            "the victim kept at most {OWNER_CONNECTIONS} connections to the {MANY_OWNERS} owners it dialed \
             (most at once: {most})"
        ),
    );
    for owner in owners {
        owner.shutdown();
    }
    Ok(())
}
