//! The bounds of a node (spec §9.1) seen from a peer: one that floods waits for room
//! instead of growing the receiver, and another peer's messages are not stuck behind it.

use std::time::Duration;

use handoff::{Bounds, Buffer, Channel, Message, Node};
use serde::{Deserialize, Serialize};

const SECRET: &str = "bounds-secret";
const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Chunk {
    from: String,
    seq: u64,
    data: Buffer,
}
impl Message for Chunk {
    const TYPE_NAME: &'static str = "test.Chunk";
}

async fn node(name: &str, bounds: Bounds) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Chunk>()
        .bounds(bounds)
        .build()
        .await
        .unwrap()
}

/// A node that sends buffers of 64 KiB and more to TCP peers as tickets.
async fn ticket_sender(name: &str) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Chunk>()
        .ticket_threshold(Some(64 << 10))
        .build()
        .await
        .unwrap()
}

fn chunk(from: &str, seq: u64, len: usize) -> Chunk {
    Chunk {
        from: from.into(),
        seq,
        data: Buffer::from(vec![seq as u8; len]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_peer_waits_for_room_and_does_not_delay_another_peer() {
    let per_peer = 4 << 20;
    let receiver = node(
        "bounded-receiver",
        Bounds {
            max_buffered_bytes_per_peer: per_peer,
            max_buffered_bytes: 16 << 20,
            ..Bounds::DEFAULT
        },
    )
    .await;
    let flooder = node("flooder", Bounds::DEFAULT).await;
    let quiet = node("quiet", Bounds::DEFAULT).await;
    let addr = receiver.listen_addr().unwrap().to_string();
    let to_receiver = flooder.connect_with(&addr, Some(Channel::Tcp)).await.unwrap();
    let from_quiet = quiet.connect_with(&addr, Some(Channel::Tcp)).await.unwrap();

    // 64 MiB in 1 MiB messages, while the application takes nothing.
    let sending = tokio::spawn(async move {
        for seq in 0..64 {
            to_receiver.send(chunk("flooder", seq, 1 << 20)).await.unwrap();
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !sending.is_finished(),
        "the flooder waits: the receiver stopped reading it"
    );
    let held = receiver.buffered_bytes();
    assert!(
        held <= per_peer + (1 << 20),
        "the receiver holds {held} bytes of the flooder's, over its bound of {per_peer}"
    );

    // The quiet peer's message is served in its turn, not after the flood.
    from_quiet.send(chunk("quiet", 0, 100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut position = None;
    for i in 0..4 {
        let got: Chunk = receiver.recv_timeout(T).await.unwrap().decode().unwrap();
        if got.from == "quiet" {
            position = Some(i);
            break;
        }
    }
    assert!(
        position.is_some(),
        "the quiet peer's message came within its first turns"
    );

    // The flood completes once the application takes its messages, in order.
    let mut next = 0;
    while next < 64 {
        let got: Chunk = receiver.recv_timeout(T).await.unwrap().decode().unwrap();
        if got.from == "flooder" {
            assert!(got.seq >= next, "a peer's messages stay in order");
            next = got.seq + 1;
        }
    }
    tokio::time::timeout(T, sending).await.unwrap().unwrap();
    assert_eq!(receiver.buffered_bytes(), 0, "everything taken, nothing held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_larger_than_the_bound_still_gets_through_alone() {
    let receiver = node(
        "small-budget",
        Bounds {
            max_buffered_bytes_per_peer: 1 << 20,
            max_buffered_bytes: 1 << 20,
            ..Bounds::DEFAULT
        },
    )
    .await;
    let sender = node("big-sender", Bounds::DEFAULT).await;
    let peer = sender
        .connect_with(receiver.listen_addr().unwrap(), Some(Channel::Tcp))
        .await
        .unwrap();
    peer.send(chunk("big-sender", 1, 8 << 20)).await.unwrap();
    let got: Chunk = receiver.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.data.len(), 8 << 20);
}

/// A value whose bytes travel inside the message body, not as a frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Inline {
    text: String,
}
impl Message for Inline {
    const TYPE_NAME: &'static str = "test.Inline";
}

/// spec §9: a node never sends what the receiver must refuse. A body over the 16 MiB
/// header limit, or more frames than the receiver takes, fails that send at the sender,
/// naming the limit; the connection carries on, on TCP and on a Unix socket alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_a_receiver_must_refuse_is_never_sent() {
    let receiver = node("refuses-nothing", Bounds::DEFAULT).await;
    let sender = node("sends-too-much", Bounds::DEFAULT).await;
    let addr = receiver.listen_addr().unwrap().to_string();
    for channel in [Channel::Tcp, Channel::Shm] {
        let peer = sender.connect_with(&addr, Some(channel)).await.unwrap();
        let err = peer
            .send(Inline {
                text: "x".repeat(17 << 20),
            })
            .await
            .expect_err("a 17 MiB body");
        assert!(matches!(err, handoff::Error::Unsendable { .. }), "{err}");
        assert!(err.to_string().contains("header"), "{err}");
        let many = Many {
            parts: (0..1025).map(|i| Buffer::from(vec![i as u8; 8])).collect(),
        };
        let err = peer.send(many).await.expect_err("1025 frames");
        assert!(err.to_string().contains("1025 frames"), "{err}");
        // The connection is unharmed.
        peer.send(chunk("sends-too-much", 1, 1024)).await.unwrap();
        let env = receiver.recv_timeout(T).await.unwrap();
        assert_eq!(env.decode::<Chunk>().unwrap().seq, 1, "{channel:?}");
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Many {
    parts: Vec<Buffer>,
}
impl Message for Many {
    const TYPE_NAME: &'static str = "test.Many";
}

/// This process's TCP sockets whose `TCP_USER_TIMEOUT` is `ms` and whose keepalive is on.
fn sockets_with_tcp_timeout(ms: u32) -> usize {
    use std::os::fd::BorrowedFd;
    let mut n = 0;
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // SAFETY: the descriptor is open while this loop looks at it (only this test's nodes
        // open or close descriptors meanwhile, and a closed one just fails the calls).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let timeout = rustix::net::sockopt::tcp_user_timeout(fd);
        let keepalive = rustix::net::sockopt::socket_keepalive(fd);
        if matches!((timeout, keepalive), (Ok(t), Ok(true)) if t == ms) {
            n += 1;
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_timeout_sets_keepalive_on_dialed_and_accepted_connections_and_is_refused_below_11_s() {
    let too_short = Node::builder("short")
        .tcp_timeout(Some(Duration::from_secs(5)))
        .build()
        .await;
    let e = too_short.expect_err("5 s is less than one second per keepalive probe");
    assert!(e.to_string().contains("at least 11 s"), "{e}");

    let build = |name: &'static str, timeout: Option<Duration>| {
        Node::builder(name)
            .secret(SECRET)
            .listen("127.0.0.1:0")
            .tcp_timeout(timeout)
            .build()
    };
    let accepting = build("accepting", Some(Duration::from_secs(21))).await.unwrap();
    let plain = build("plain", None).await.unwrap();
    let dialing = build("dialing", Some(Duration::from_secs(13))).await.unwrap();
    let addr = accepting.listen_addr().unwrap().to_string();
    plain.connect_with(&addr, Some(Channel::Tcp)).await.unwrap();
    accepting.wait_for_peer("plain", T).await.unwrap();
    assert_eq!(
        sockets_with_tcp_timeout(21_000),
        1,
        "the accepted side of plain's connection"
    );
    assert_eq!(sockets_with_tcp_timeout(13_000), 0);
    dialing.connect_with(&addr, Some(Channel::Tcp)).await.unwrap();
    accepting.wait_for_peer("dialing", T).await.unwrap();
    assert_eq!(sockets_with_tcp_timeout(21_000), 2, "both accepted connections");
    assert_eq!(sockets_with_tcp_timeout(13_000), 1, "the dialed side");
}

/// spec §9.1: a redeemed ticket counts in its sender's buffered bytes, and is admitted
/// before it is pulled. A peer that floods a node that redeems eagerly with small messages
/// carrying large tickets waits for room as one that sends the bytes inline does, instead of
/// making the node pull them all while its application takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_eager_tickets_waits_for_room_before_it_is_pulled() {
    let per_peer = 4 << 20;
    let receiver = node(
        "eager-receiver",
        Bounds {
            max_buffered_bytes_per_peer: per_peer,
            max_buffered_bytes: 16 << 20,
            ..Bounds::DEFAULT
        },
    )
    .await;
    let flooder = ticket_sender("ticket-flooder").await;
    let to_receiver = flooder
        .connect_with(receiver.listen_addr().unwrap(), Some(Channel::Tcp))
        .await
        .unwrap();
    let count = 32;
    for seq in 0..count {
        to_receiver.send(chunk("ticket-flooder", seq, 1 << 20)).await.unwrap();
    }
    // Until it settles: the pulls take their time (a debug build hashes slowly).
    let mut held = receiver.buffered_bytes();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = receiver.buffered_bytes();
        if now == held {
            break;
        }
        held = now;
    }
    // Each ticket's room is taken before its pull (the messages themselves hold a little).
    let most = per_peer + (64 << 10);
    assert!(
        held <= most,
        "the receiver holds {held} bytes of redeemed tickets, over {most}: it pulled before it had room"
    );
    assert!(held > 0, "the receiver took the first messages");
    for seq in 0..count {
        let got: Chunk = receiver.recv_timeout(T).await.unwrap().decode().unwrap();
        assert_eq!(
            (got.seq, got.data.len()),
            (seq, 1 << 20),
            "every ticket redeemed, in order"
        );
        assert!(got.data.iter().all(|&b| b == seq as u8));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(receiver.buffered_bytes(), 0, "everything taken, nothing held");
}

/// A ticket larger than the sender's whole share is redeemed once that peer has nothing
/// else buffered but the messages waiting behind it (spec §9.1), so it never waits for
/// room that only its own followers hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_larger_than_the_bound_is_redeemed_ahead_of_the_messages_behind_it() {
    let receiver = node(
        "small-eager-receiver",
        Bounds {
            max_buffered_bytes_per_peer: 1 << 20,
            max_buffered_bytes: 1 << 20,
            ..Bounds::DEFAULT
        },
    )
    .await;
    let sender = ticket_sender("big-ticket-sender").await;
    let peer = sender
        .connect_with(receiver.listen_addr().unwrap(), Some(Channel::Tcp))
        .await
        .unwrap();
    peer.send(chunk("big-ticket-sender", 0, 4 << 20)).await.unwrap();
    for seq in 1..4 {
        peer.send(chunk("big-ticket-sender", seq, 100)).await.unwrap();
    }
    for seq in 0..4 {
        let got: Chunk = receiver.recv_timeout(T).await.unwrap().decode().unwrap();
        assert_eq!(got.seq, seq);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connections_messages_come_after_the_open_ones_and_none_is_lost() {
    let receiver = node("receiver-of-the-gone", Bounds::DEFAULT).await;
    let gone = node("gone", Bounds::DEFAULT).await;
    let open = node("open", Bounds::DEFAULT).await;
    let addr = receiver.listen_addr().unwrap().to_string();
    let from_gone = gone.connect_with(&addr, Some(Channel::Tcp)).await.unwrap();
    let from_open = open.connect_with(&addr, Some(Channel::Tcp)).await.unwrap();
    for seq in 0..10 {
        from_gone.send(chunk("gone", seq, 100)).await.unwrap();
        from_open.send(chunk("open", seq, 100)).await.unwrap();
    }
    // Both backlogs are in the inbox (the application has taken nothing), then one peer
    // leaves: its messages stay, behind the open connection's.
    let deadline = tokio::time::Instant::now() + T;
    // (Each message holds its bytes and the fixed overhead, 1 KiB, in the receive budget:
    // the count is reached and stays put once all twenty are in.)
    let mut last = 0;
    loop {
        let now = receiver.buffered_bytes();
        if now >= 20 * (100 + 1024) && now == last {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the messages never arrived");
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    gone.shutdown();
    while receiver.peer("gone").is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the receiver never saw the peer leave"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut order = Vec::new();
    for _ in 0..20 {
        let got: Chunk = receiver.recv_timeout(T).await.unwrap().decode().unwrap();
        order.push((got.from, got.seq));
    }
    let expected: Vec<(String, u64)> = ["open", "gone"]
        .iter()
        .flat_map(|from| (0..10).map(move |seq| (from.to_string(), seq)))
        .collect();
    assert_eq!(
        order, expected,
        "the open connection's first, then the closed one's, in order"
    );
}
