//! A send whose future is dropped (a `timeout` around it, a cancelled task) leaves nothing
//! behind: before its message is queued, what it leased for the message ends at once;
//! once queued, the message is written in full, so that the peer never reads half of one.

use std::time::Duration;

use handoff::proto::ticket_leases::{LeaseConfig, WhenFull};
use handoff::{Bounds, Buffer, Channel, Node};
mod common;
use common::Frames;

const T: Duration = Duration::from_secs(10);
const F: usize = 1 << 20;

fn frames(seeds: &[u8], len: usize) -> Frames {
    Frames {
        parts: seeds.iter().map(|&s| Buffer::from(vec![s; len])).collect(),
    }
}

async fn node(name: &str, host: &str, bounds: Bounds, leases: LeaseConfig) -> Node {
    Node::builder(name)
        .secret("dropped")
        .listen("127.0.0.1:0")
        .host_id(host)
        .register::<Frames>()
        .bounds(bounds)
        .leases(leases)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shm_send_dropped_while_it_waits_for_lease_room_ends_the_leases_it_took() {
    // The peer may hold one frame of ours: the second frame's lease waits for room.
    let capped = Bounds {
        max_shm_lease_bytes_per_peer: F as u64,
        ..Bounds::DEFAULT
    };
    let a = node("dropped-shm-a", "same", capped, LeaseConfig::default()).await;
    let b = node("dropped-shm-b", "same", Bounds::DEFAULT, LeaseConfig::default()).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);

    let waited = tokio::time::timeout(Duration::from_millis(300), peer.send(frames(&[1, 2], F))).await;
    assert!(waited.is_err(), "the send waited for room, and was dropped");
    assert_eq!(
        a.leases().count,
        0,
        "the first frame's lease ended with the dropped send"
    );

    // So the room is there for the next message.
    a_later_send_finds_room(&b, peer.send(frames(&[3], F))).await;
}

/// `send` (one frame of 3s) goes through in time, and `b` gets it intact.
async fn a_later_send_finds_room(b: &Node, send: impl std::future::Future<Output = handoff::Result<()>>) {
    tokio::time::timeout(T, send)
        .await
        .expect("a later send finds room")
        .unwrap();
    let got = b.recv_timeout(T).await.unwrap().decode::<Frames>().unwrap();
    assert!(got.parts[0].iter().all(|&x| x == 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_send_dropped_after_its_message_was_queued_still_writes_all_of_it() {
    let (_a, b, peer) = a_receiver_that_stops_reading("dropped-tcp").await;

    // Polled once: encoded and queued, then dropped while the socket takes the rest.
    let big = 64 << 20;
    let first_poll = tokio::time::timeout(Duration::ZERO, peer.send(frames(&[7], big))).await;
    assert!(first_poll.is_err(), "64 MiB are not written in one poll");

    // Nothing else is sent: the node writes the rest on its own.
    take_the_first(&b).await;
    let got = b.recv_timeout(T).await.expect("the whole message arrives");
    let got = got.decode::<Frames>().unwrap();
    assert_eq!(got.parts[0].len(), big);
    assert!(got.parts[0].iter().all(|&x| x == 7), "intact");
    assert!(!peer.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_send_dropped_while_it_waits_for_lease_room_ends_the_leases_it_issued() {
    // Tickets for one frame's bytes may be out for the peer: the second frame waits.
    let one_frame = LeaseConfig {
        max_bytes_per_peer: F as u64,
        when_full: WhenFull::Wait(Duration::from_secs(30)),
        ..LeaseConfig::default()
    };
    let a = node("dropped-ticket-a", "host-a", Bounds::DEFAULT, one_frame).await;
    let b = node("dropped-ticket-b", "host-b", Bounds::DEFAULT, LeaseConfig::default()).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();

    let waited = tokio::time::timeout(Duration::from_millis(300), peer.send_by_ticket(frames(&[1, 2], F))).await;
    assert!(waited.is_err(), "the send waited for lease room, and was dropped");
    assert_eq!(
        a.ticket_leases().count,
        0,
        "the first frame's lease ended with the dropped send, not by its deadline"
    );

    a_later_send_finds_room(&b, peer.send_by_ticket(frames(&[3], F))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_waiting_for_lease_room_fails_as_soon_as_its_connection_closes() {
    // The node's ticket leases may pin one frame in all: a ticket that another peer keeps
    // pins it, so a send to B waits for room.
    let one_frame = LeaseConfig {
        max_bytes: F as u64,
        when_full: WhenFull::Wait(Duration::from_secs(30)),
        ..LeaseConfig::default()
    };
    let a = node("closing-a", "host-a", Bounds::DEFAULT, one_frame).await;
    let keeps = Node::builder("closing-keeps")
        .secret("dropped")
        .listen("127.0.0.1:0")
        .host_id("host-keeps")
        .register::<Frames>()
        .redeem(handoff::Redeem::Lazy)
        .build()
        .await
        .unwrap();
    let b = node("closing-b", "host-b", Bounds::DEFAULT, LeaseConfig::default()).await;
    let to_keeps = a.connect(keeps.listen_addr().unwrap()).await.unwrap();
    to_keeps.send_by_ticket(frames(&[1], F)).await.unwrap();
    let _kept = keeps.recv_timeout(T).await.unwrap();
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let sending = {
        let peer = peer.clone();
        tokio::spawn(async move { peer.send_by_ticket(frames(&[2], F)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!sending.is_finished(), "the send waits for lease room");
    assert!(a.disconnect("closing-b").await);
    let t0 = std::time::Instant::now();
    let sent = tokio::time::timeout(T, sending).await.expect("the send ends").unwrap();
    assert!(sent.is_err(), "the connection closed: nothing was sent");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "told at once, not after the lease wait"
    );
    assert_eq!(a.ticket_leases().count, 1, "only the kept ticket's lease lives");
}

/// Two nodes of other hosts (so TCP), the receiver holding an untaken message of the
/// sender that fills its room for that peer: it reads no more of that connection until the
/// test takes it ([`take_the_first`]), so a large message sent now cannot be written in one
/// poll.
async fn a_receiver_that_stops_reading(name: &str) -> (Node, Node, handoff::Peer) {
    let room = Bounds {
        max_buffered_bytes_per_peer: 2 * F as u64,
        ..Bounds::DEFAULT
    };
    let a = node(&format!("{name}-a"), "host-a", Bounds::DEFAULT, LeaseConfig::default()).await;
    let b = node(&format!("{name}-b"), "host-b", room, LeaseConfig::default()).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Tcp);
    peer.send(frames(&[1], 3 * F / 2)).await.unwrap();
    let to_a = b.wait_for_peer(&format!("{name}-a"), T).await.unwrap();
    common::wait_until("the first message is buffered", || to_a.buffered_bytes() > 0).await;
    (a, b, peer)
}

/// Takes the message that stopped `b` reading (it then reads on).
async fn take_the_first(b: &Node) {
    let first = b.recv_timeout(T).await.unwrap().decode::<Frames>().unwrap();
    assert!(first.parts[0].iter().all(|&x| x == 1));
}

/// Polls `send` once (it encodes and queues its message), then hands it back.
async fn polled_once<F: std::future::Future + Unpin>(mut send: F) -> F {
    tokio::select! {
        biased;
        _ = &mut send => panic!("64 MiB are not written in one poll"),
        _ = std::future::ready(()) => {}
    }
    send
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_send_dropped_on_a_thread_outside_the_runtime_is_still_written() {
    let (_a, b, peer) = a_receiver_that_stops_reading("offthread").await;
    let big = 64 << 20;
    let send = polled_once(Box::pin(async move { peer.send(frames(&[9], big)).await })).await;
    std::thread::spawn(move || drop(send))
        .join()
        .expect("no panic where no runtime runs");
    take_the_first(&b).await;
    let got = b.recv_timeout(T).await.unwrap().decode::<Frames>().unwrap();
    assert!(got.parts[0].len() == big && got.parts[0].iter().all(|&x| x == 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_queued_when_a_graceful_close_begins_succeeds_and_arrives() {
    let (a, b, peer) = a_receiver_that_stops_reading("graceful").await;
    let big = 64 << 20;
    let send = polled_once(Box::pin(peer.send(frames(&[4], big)))).await;
    // The close writes what is queued first (within a second), and the receiver reads on.
    let (closed, ()) = tokio::join!(a.disconnect("graceful-b"), take_the_first(&b));
    assert!(closed);
    tokio::time::timeout(T, send)
        .await
        .expect("the send ends")
        .expect("what was queued before the close is written: the send succeeded");
    let got = b.recv_timeout(T).await.unwrap().decode::<Frames>().unwrap();
    assert!(got.parts[0].len() == big && got.parts[0].iter().all(|&x| x == 4));
}
