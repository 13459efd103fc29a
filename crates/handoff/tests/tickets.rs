//! Tickets and leases between nodes over TCP: eager and lazy redemption, range reads,
//! three-party forwarding, and the owner's lease lifetime (release, deadline, lost holder).

mod common;
use common::wait_until;

use std::time::Duration;

use handoff::tickets::{LeaseConfig, WhenFull};
use handoff::wire::TicketDigest;
use handoff::{Buffer, Channel, Error, Message, Node, Redeem, Ticket};
use serde::{Deserialize, Serialize};

const SECRET: &str = "ticket-secret";
const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Blob {
    name: String,
    data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "test.Blob";
}

fn data(len: usize) -> Buffer {
    Buffer::from((0..len).map(|i| (i % 253) as u8).collect::<Vec<u8>>())
}

async fn node(name: &str, redeem: Redeem) -> Node {
    node_with(name, redeem, LeaseConfig::default()).await
}

async fn node_with(name: &str, redeem: Redeem, leases: LeaseConfig) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .host_id(format!("host-{name}"))
        .listen("127.0.0.1:0")
        .register::<Blob>()
        .redeem(redeem)
        .leases(leases)
        .pull_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn eager_redemption_delivers_the_bytes_and_ends_the_lease() {
    let a = node("eager-a", Redeem::Eager).await;
    let b = node("eager-b", Redeem::Eager).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Tcp);
    let sent = Blob {
        name: "x".into(),
        data: data(3 << 20),
    };
    peer.send_by_ticket(sent.clone()).await.unwrap();
    let env = b.recv_timeout(T).await.unwrap();
    assert!(env.wire_bytes() >= 3 << 20, "the bytes were pulled before delivery");
    assert_eq!(env.decode::<Blob>().unwrap(), sent);
    wait_until("the holder's release ends the lease", || a.ticket_leases().count == 0).await;
}

/// Frames of 8 MiB and more are hashed on a helper thread while they arrive: the bytes and
/// the digest check must come out the same, over several pulls in a row.
#[tokio::test]
async fn large_pulls_hashed_behind_the_reads_deliver_exact_bytes() {
    let a = node("large-a", Redeem::Eager).await;
    let b = node("large-b", Redeem::Eager).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    for (i, len) in [(8 << 20) + 1, 12 << 20, (8 << 20) - 1].into_iter().enumerate() {
        let sent = Blob {
            name: format!("large-{i}"),
            data: data(len),
        };
        peer.send_by_ticket(sent.clone()).await.unwrap();
        let got: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
        assert_eq!(got, sent, "pull {i} of {len} bytes");
    }
    wait_until("every lease ends", || a.ticket_leases().count == 0).await;
}

/// A buffer that carries the digest its producer computed is ticketed under that digest, not
/// hashed again: the right one redeems, and a wrong one (the producer's mistake) fails every
/// redemption with `Corrupt`, which shows the owner used it.
#[tokio::test]
async fn a_known_digest_goes_into_the_ticket_as_given() {
    let a = node("digest-a", Redeem::Eager).await;
    let b = node("digest-b", Redeem::Lazy).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let bytes = data(1 << 20);
    let right = *blake3::hash(&bytes).as_bytes();
    for (digest, ok) in [(right, true), ([7u8; 32], false)] {
        peer.send_by_ticket(Blob {
            name: "d".into(),
            data: bytes.clone().with_digest(digest),
        })
        .await
        .unwrap();
        let blob: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
        let ticket = Ticket::of(&blob.data).expect("a placeholder for a ticket");
        match ticket.redeem().await {
            Ok(got) => assert!(ok && got == bytes, "only the right digest redeems"),
            Err(e) => assert!(!ok && matches!(e, Error::Corrupt { .. }), "{e}"),
        }
    }
    assert_eq!(
        bytes.clone().with_digest(right).slice(1..).known_digest(),
        None,
        "a slice carries none"
    );
}

/// Between nodes that both announce `xxh3`, a ticket for a buffer without a known digest carries
/// XXH3-128 (§7.5), the holder checks it (a pull whose bytes differ would fail), and a buffer whose
/// producer gave its BLAKE3 keeps that BLAKE3.
#[tokio::test]
async fn a_ticket_to_an_xxh3_peer_carries_xxh3_and_redeems() {
    let a = node("xxh3-a", Redeem::Eager).await;
    let b = node("xxh3-b", Redeem::Lazy).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert!(
        peer.endpoint().has_capability("xxh3"),
        "every node of this version announces it"
    );
    let bytes = data(3 << 20);
    for known in [false, true] {
        let data = if known {
            bytes.clone().with_digest(*blake3::hash(&bytes).as_bytes())
        } else {
            bytes.clone()
        };
        peer.send_by_ticket(Blob { name: "x".into(), data }).await.unwrap();
        let blob: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
        let ticket = Ticket::of(&blob.data).expect("a placeholder for a ticket");
        let want = if known {
            TicketDigest::blake3_of(&bytes)
        } else {
            TicketDigest::xxh3_of(&bytes)
        };
        assert_eq!(ticket.digest(), want, "known digest: {known}");
        assert_eq!(ticket.redeem().await.unwrap(), bytes);
    }
}

#[tokio::test]
async fn lazy_redemption_pulls_on_first_use_and_ranges_pull_only_the_range() {
    let a = node("lazy-a", Redeem::Eager).await;
    let b = node("lazy-b", Redeem::Lazy).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let sent = data(1 << 20);
    peer.send_by_ticket(Blob {
        name: "y".into(),
        data: sent.clone(),
    })
    .await
    .unwrap();
    let env = b.recv_timeout(T).await.unwrap();
    assert!(
        env.wire_bytes() < 1000,
        "nothing pulled yet: {} bytes",
        env.wire_bytes()
    );
    let blob: Blob = env.decode().unwrap();
    let ticket = Ticket::of(&blob.data).expect("a placeholder for a ticket");
    assert_eq!(ticket.len(), 1 << 20);
    assert_eq!(a.ticket_leases().count, 1);
    let range = ticket.read(1000..1010).await.unwrap();
    assert_eq!(&range[..], &sent[1000..1010]);
    assert_eq!(ticket.redeem().await.unwrap(), sent);
    let out = ticket.read(0..(2 << 20)).await.unwrap_err();
    assert!(
        matches!(out, Error::TicketRefused { ref code, .. } if code == "out-of-range"),
        "{out}"
    );
    assert_eq!(a.ticket_leases().count, 1, "held while the placeholder lives");
    drop(ticket);
    drop(blob);
    wait_until("the last handle's release ends the lease", || {
        a.ticket_leases().count == 0
    })
    .await;
}

#[tokio::test]
async fn a_forwarded_ticket_is_pulled_from_the_owner_and_outlives_the_forwarder() {
    let a = node("three-a", Redeem::Eager).await;
    let b = node("three-b", Redeem::Lazy).await;
    let c = node("three-c", Redeem::Lazy).await;
    let ab = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let bc = b.connect(c.listen_addr().unwrap()).await.unwrap();
    let sent = data(4 << 20);
    ab.send_by_ticket(Blob {
        name: "z".into(),
        data: sent.clone(),
    })
    .await
    .unwrap();
    let at_b: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    bc.send(at_b.clone()).await.unwrap();
    let env = c.recv_timeout(T).await.unwrap();
    assert!(env.wire_bytes() < 1000, "b relayed no bytes to c");
    let at_c: Blob = env.decode().unwrap();
    assert_eq!(a.ticket_leases().holders, 2, "c was registered before b could release");
    drop(at_b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.ticket_leases().count, 1, "c still holds the lease");
    let ticket = Ticket::of(&at_c.data).unwrap();
    assert_eq!(ticket.redeem().await.unwrap(), sent, "c pulls from a directly");
    assert!(
        c.peers().iter().any(|p| p.name() == "three-a"),
        "c connected to the owner"
    );
    drop(ticket);
    drop(at_c);
    wait_until("every holder released", || a.ticket_leases().count == 0).await;
}

#[tokio::test]
async fn a_lost_holder_or_a_lost_release_ends_the_hold() {
    let short = LeaseConfig {
        ttl: Duration::from_millis(300),
        ..LeaseConfig::default()
    };
    let a = node_with("lost-a", Redeem::Eager, short).await;
    let b = node("lost-b", Redeem::Lazy).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send_by_ticket(Blob {
        name: "w".into(),
        data: data(1000),
    })
    .await
    .unwrap();
    let blob: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    // The release is lost (the handle is leaked): the deadline ends the hold.
    std::mem::forget(blob);
    assert_eq!(a.ticket_leases().count, 1);
    wait_until("the deadline frees the lease", || a.ticket_leases().count == 0).await;
    assert!(a.ticket_leases().expired >= 1);

    // The holder goes away: its holds end with its connection.
    let long = node("lost-a2", Redeem::Eager).await;
    let peer = long.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send_by_ticket(Blob {
        name: "v".into(),
        data: data(1000),
    })
    .await
    .unwrap();
    let _held: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(long.ticket_leases().count, 1);
    b.shutdown();
    wait_until("the lost connection frees the lease", || {
        long.ticket_leases().count == 0
    })
    .await;
}

#[tokio::test]
async fn an_owner_that_is_gone_gives_a_clear_error_in_bounded_time() {
    let a = node("gone-owner", Redeem::Eager).await;
    let b = node("gone-holder", Redeem::Lazy).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send_by_ticket(Blob {
        name: "u".into(),
        data: data(1 << 20),
    })
    .await
    .unwrap();
    let blob: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    a.shutdown();
    let started = std::time::Instant::now();
    let err = Ticket::of(&blob.data).unwrap().redeem().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(matches!(err, Error::OwnerLost { .. }), "{text}");
    assert!(text.contains("lease 1") && text.contains("1048576 bytes"), "{text}");
}

#[tokio::test]
async fn an_eager_receiver_gets_a_failed_redemption_from_decode() {
    // Holds that expire at once: the receiver's pull is refused.
    let a = node_with(
        "eager-expired-a",
        Redeem::Eager,
        LeaseConfig {
            ttl: Duration::from_millis(0),
            ..LeaseConfig::default()
        },
    )
    .await;
    let b = node("eager-expired-b", Redeem::Eager).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send_by_ticket(Blob {
        name: "late".into(),
        data: data(5000),
    })
    .await
    .unwrap();
    let err = b.recv_timeout(T).await.unwrap().decode::<Blob>().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::TicketRefused { .. }), "{text}");
    assert!(text.contains("eager-expired-a") && text.contains("lease 1"), "{text}");
    wait_until("the expired lease is freed", || a.ticket_leases().count == 0).await;
}

#[tokio::test]
async fn lease_caps_fail_or_wait_as_configured() {
    let b = node("cap-b", Redeem::Lazy).await;
    let failing = node_with(
        "cap-fail",
        Redeem::Eager,
        LeaseConfig {
            max_bytes_per_peer: 10,
            when_full: WhenFull::Fail,
            ..LeaseConfig::default()
        },
    )
    .await;
    let to_b = failing.connect(b.listen_addr().unwrap()).await.unwrap();
    let err = to_b
        .send_by_ticket(Blob {
            name: "too big".into(),
            data: data(100),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::LeaseCap { .. }), "{err}");
    assert!(err.to_string().contains("0 of 10 bytes"), "{err}");

    let waiting = node_with(
        "cap-wait",
        Redeem::Eager,
        LeaseConfig {
            max_bytes: 150,
            when_full: WhenFull::Wait(Duration::from_secs(5)),
            ..LeaseConfig::default()
        },
    )
    .await;
    let to_b = waiting.connect(b.listen_addr().unwrap()).await.unwrap();
    let blob = Blob {
        name: "first".into(),
        data: data(100),
    };
    to_b.send_by_ticket(blob.clone()).await.unwrap();
    let first: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    let sender = to_b.clone();
    let second = tokio::spawn(async move { sender.send_by_ticket(blob).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!second.is_finished(), "the second ticket waits for room");
    drop(first);
    second.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_holder_that_renews_keeps_its_hold_past_the_ttl() {
    let a = node_with(
        "renew-a",
        Redeem::Eager,
        LeaseConfig {
            ttl: Duration::from_millis(300),
            ..LeaseConfig::default()
        },
    )
    .await;
    let b = node("renew-b", Redeem::Lazy).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let sent = data(10_000);
    peer.send_by_ticket(Blob {
        name: "r".into(),
        data: sent.clone(),
    })
    .await
    .unwrap();
    let blob: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    let ticket = Ticket::of(&blob.data).unwrap();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        ticket.renew().await.unwrap();
    }
    // 750 ms after issue, over twice the ttl: still held.
    assert_eq!(a.ticket_leases().count, 1);
    assert_eq!(ticket.redeem().await.unwrap(), sent);
    // No more renewals: the deadline ends it even though the handle lives.
    wait_until("the hold expires without renewals", || a.ticket_leases().count == 0).await;
    drop(ticket);
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Pair {
    first: Buffer,
    second: Buffer,
}
impl Message for Pair {
    const TYPE_NAME: &'static str = "test.Pair";
}

/// A send that fails part-way through its ticket policy (here: its second frame is a held
/// ticket whose owner is gone, so it cannot be forwarded) ends the lease it issued for its
/// first frame at once, not by its deadline.
#[tokio::test]
async fn a_send_that_fails_part_way_ends_the_leases_it_issued() {
    let a = node("part-owner", Redeem::Eager).await;
    let b = Node::builder("part-b")
        .secret(SECRET)
        .host_id("host-part-b")
        .listen("127.0.0.1:0")
        .register::<Blob>()
        .register::<Pair>()
        .redeem(Redeem::Lazy)
        .pull_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let c = Node::builder("part-c")
        .secret(SECRET)
        .host_id("host-part-c")
        .listen("127.0.0.1:0")
        .register::<Pair>()
        .build()
        .await
        .unwrap();
    let ab = a.connect(b.listen_addr().unwrap()).await.unwrap();
    ab.send_by_ticket(Blob {
        name: "held".into(),
        data: data(1 << 20),
    })
    .await
    .unwrap();
    let held: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    a.shutdown();
    let bc = b.connect(c.listen_addr().unwrap()).await.unwrap();
    let err = bc
        .send_by_ticket(Pair {
            first: data(64 << 10),
            second: held.data.clone(),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::OwnerLost { .. }), "{err}");
    assert_eq!(
        b.ticket_leases().count,
        0,
        "the first frame's lease ended with the send"
    );
    // The connection to c is not what failed: it carries the next message.
    bc.send_by_ticket(Pair {
        first: data(10),
        second: data(20),
    })
    .await
    .unwrap();
    let got: Pair = c.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.second, data(20));
}
