//! The attacks: one per class of issue 11, each against a real victim process. Each one
//! does what a hostile or buggy peer would, then checks what the victim answered; the
//! runner checks around it that the victim lives, stays within its memory bound and keeps
//! serving a legitimate peer.
//!
//! This file names the attacks and runs one; each family lives in its own file, and `common` holds what they
//! share (findings, the target, raw messages).

mod bodies;
mod common;
mod devices;
mod handshake;
mod identity;
mod leases;
mod reflection;
mod refusals;
mod segments;
mod sizes;
mod slow;
mod stalls;

use anyhow::{bail, Result};

pub use common::{Findings, Target};

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
    "pipelined-pulls",
    "slow-reader",
    "slowloris",
    "fds-before-handshake",
    "stalled-frame",
    "reused-node-id",
    "ticket-addr",
    "many-owners",
    "reflection",
    "interleaving-two-nodes",
    "replay",
    "relay-to-self",
    "downgrade",
    "gpu-handles",
];

/// The issue-11 classes (numbered as in the issue) each attack exercises; class 15 is
/// issue 24's: authenticating without the cluster secret.
pub fn classes(attack: &str) -> &'static [u8] {
    match attack {
        "bad-bodies" | "failed-redemptions" | "gpu-handles" => &[1],
        "sigbus" => &[2],
        "huge-sizes" => &[3],
        "sparse-segments" => &[4],
        "hello-bomb" => &[5, 14],
        "redemption-stall" => &[6],
        "inbox-bytes" => &[7],
        "refusal-flood" => &[8],
        "shm-leases" | "forward-holders" => &[9],
        "pipelined-pulls" => &[10],
        "slow-reader" => &[10],
        "slowloris" | "fds-before-handshake" | "stalled-frame" => &[11],
        "reused-node-id" => &[12],
        "ticket-addr" | "many-owners" => &[13],
        "reflection" | "interleaving-two-nodes" | "replay" | "relay-to-self" | "downgrade" => &[15],
        _ => &[],
    }
}

/// Extra `handoff node` / worker arguments an attack needs from its victim.
pub fn victim_args(attack: &str) -> &'static [&'static str] {
    match attack {
        "forward-holders" | "pipelined-pulls" => &["--ticket-threshold", "1024"],
        // An application that takes 20 messages a second: the inbox fills.
        "inbox-bytes" => &["--delay-ms", "50"],
        // Node-id uniqueness holds over both handshakes, for a victim that runs both.
        "reused-node-id" => &["--accept-v1"],
        // The downgrade needs a victim that would run version 2 at all.
        "downgrade" => &["--accept-v2"],
        // A small bound on kept owner connections, so that a dozen owners pass it.
        "many-owners" => &["--max-owner-connections", "4"],
        _ => &[],
    }
}

/// Whether the attack needs a second victim, a node of the same cluster (same secret).
pub fn needs_second_victim(attack: &str) -> bool {
    attack == "interleaving-two-nodes"
}

/// Whether the attack makes the victim's application slow on purpose (`victim_args`).
pub fn slows_the_application(attack: &str) -> bool {
    victim_args(attack).contains(&"--delay-ms")
}

/// Runs the attack `name` against `target`.
pub async fn run(name: &str, target: &Target) -> Result<Findings> {
    let mut f = Findings::default();
    match name {
        "bad-bodies" => bodies::bad_bodies(target, &mut f).await?,
        "failed-redemptions" => bodies::failed_redemptions(target, &mut f).await?,
        "sigbus" => segments::sigbus(target, &mut f).await?,
        "huge-sizes" => sizes::huge_sizes(target, &mut f).await?,
        "sparse-segments" => segments::sparse_segments(target, &mut f).await?,
        "hello-bomb" => handshake::hello_bomb(target, &mut f).await?,
        "redemption-stall" => stalls::redemption_stall(target, &mut f).await?,
        "inbox-bytes" => stalls::inbox_bytes(target, &mut f).await?,
        "refusal-flood" => refusals::refusal_flood(target, &mut f).await?,
        "shm-leases" => leases::shm_leases(target, &mut f).await?,
        "forward-holders" => leases::forward_holders(target, &mut f).await?,
        "pipelined-pulls" => leases::pipelined_pulls(target, &mut f).await?,
        "slow-reader" => slow::slow_reader(target, &mut f).await?,
        "slowloris" => slow::slowloris(target, &mut f).await?,
        "fds-before-handshake" => slow::fds_before_handshake(target, &mut f).await?,
        "stalled-frame" => slow::stalled_frame(target, &mut f).await?,
        "many-owners" => identity::many_owners(target, &mut f).await?,
        "reused-node-id" => identity::reused_node_id(target, &mut f).await?,
        "ticket-addr" => identity::ticket_addr(target, &mut f).await?,
        "reflection" => reflection::reflection(target, &mut f).await?,
        "interleaving-two-nodes" => reflection::interleaving_two_nodes(target, &mut f).await?,
        "replay" => reflection::replay(target, &mut f).await?,
        "relay-to-self" => reflection::relay_to_self(target, &mut f).await?,
        "downgrade" => reflection::downgrade(target, &mut f).await?,
        "gpu-handles" => devices::gpu_handles(target, &mut f).await?,
        other => bail!("no attack named {other:?}; attacks: {}", ALL.join(", ")),
    }
    Ok(f)
}
