//! Bad input from a peer: a clear error, that connection closed, the node keeps serving others.
//!
//! A raw TCP client speaks the wire format by hand (through `handoff-wire`), then sends
//! something broken; the node must answer with an `error` header naming the problem,
//! close that connection, and still serve a well-behaved peer.

use std::time::Duration;

mod raw;

use handoff::wire::framing::encode_header_into;
use handoff::wire::{decode_message, Header, Limits, Preamble};
use handoff::{Buffer, Message, Node};
use raw::RawSide;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "bad-input-secret";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ping {
    seq: u64,
    data: Buffer,
}
impl Message for Ping {
    const TYPE_NAME: &'static str = "test.Ping";
}

async fn server(name: &str) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Ping>()
        .build()
        .await
        .unwrap()
}

fn addr(node: &Node) -> String {
    node.listen_addr().unwrap().trim_start_matches("tcp://").to_string()
}

fn header_bytes(h: &Header<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(h, &mut out);
    out
}

/// Reads until the server closes; returns everything it sent.
async fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the server must close the connection")
        .ok();
    out
}

/// Splits the server's bytes after the handshake into headers and returns the error code it sent.
fn error_code_in(bytes: &[u8]) -> Option<String> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let m = decode_message(rest, &Limits::default()).ok()?;
        if let Header::Error { code, .. } = m.header {
            return Some(code);
        }
        rest = &rest[m.consumed..];
    }
    None
}

/// Performs a valid (version 2) handshake by hand; returns the stream, ready for messages.
async fn handshaken(target: &str) -> TcpStream {
    handshaken_on(TcpStream::connect(target).await.unwrap()).await
}

/// The handshake of [`handshaken`] on a connected stream.
async fn handshaken_on(mut s: TcpStream) -> TcpStream {
    let ident = raw::ident(
        "00000000000000000000000000000abc",
        "raw-client",
        "00000000000000000000000000000def",
        &["inline"],
    );
    let mut me = RawSide::v3(SECRET, ident);
    s.write_all(&me.preamble()).await.unwrap();
    let mut pre = [0u8; 16];
    s.read_exact(&mut pre).await.unwrap();
    s.write_all(&me.first()).await.unwrap();
    let peer_challenge = read_one_header(&mut s).await;
    s.write_all(&me.auth(&pre, &peer_challenge)).await.unwrap();
    let _auth = read_one_header(&mut s).await;
    s.write_all(&me.ident()).await.unwrap();
    let _ident = read_one_header(&mut s).await;
    s.write_all(&me.ready()).await.unwrap();
    let ready = read_one_header(&mut s).await;
    assert_eq!(Header::decode(&ready, &Limits::default()).unwrap(), Header::Ready);
    s
}

async fn read_one_header(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut h = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut h).await.unwrap();
    h
}

/// A well-behaved peer can still exchange a message with the node.
async fn still_serves(server: &Node, name: &str) {
    let client = Node::builder(name).secret(SECRET).build().await.unwrap();
    let peer = client.connect(server.listen_addr().unwrap()).await.unwrap();
    let ping = Ping {
        seq: 1,
        data: Buffer::from(vec![1u8; 100_000]),
    };
    peer.send(ping.clone()).await.unwrap();
    loop {
        let env = server.recv_timeout(Duration::from_secs(10)).await.unwrap();
        if env.from().name() == name {
            assert_eq!(env.decode::<Ping>().unwrap(), ping);
            return;
        }
    }
}

async fn send_and_expect(server: &Node, bytes: Vec<u8>, code: &str) {
    let mut s = handshaken(&addr(server)).await;
    s.write_all(&bytes).await.unwrap();
    let _ = s.shutdown().await;
    let reply = read_to_close(&mut s).await;
    assert_eq!(
        error_code_in(&reply).as_deref(),
        Some(code),
        "server's reply: {reply:02x?}"
    );
}

#[tokio::test]
async fn garbage_instead_of_a_preamble() {
    let node = server("bad-preamble").await;
    let mut s = TcpStream::connect(addr(&node)).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let reply = read_to_close(&mut s).await;
    assert_eq!(&reply[..8], b"HANDOFF\0", "the node sends its preamble first");
    assert_eq!(error_code_in(&reply[16..]).as_deref(), Some("bad-magic"));
    still_serves(&node, "after-bad-preamble").await;
}

#[tokio::test]
async fn unknown_protocol_version() {
    let node = server("bad-version").await;
    let mut s = TcpStream::connect(addr(&node)).await.unwrap();
    let future = Preamble {
        min_version: 7,
        max_version: 9,
        flags: 0,
    };
    s.write_all(&future.encode()).await.unwrap();
    let reply = read_to_close(&mut s).await;
    assert_eq!(error_code_in(&reply[16..]).as_deref(), Some("unsupported-version"));
    still_serves(&node, "after-bad-version").await;
}

#[tokio::test]
async fn garbage_after_the_preamble() {
    let node = server("bad-hello").await;
    let mut s = TcpStream::connect(addr(&node)).await.unwrap();
    s.write_all(&Preamble::OURS.encode()).await.unwrap();
    s.write_all(&[0, 0, 0, 3, 0xc1, 0xc1, 0xc1]).await.unwrap();
    let reply = read_to_close(&mut s).await;
    assert_eq!(error_code_in(&reply[16..]).as_deref(), Some("malformed-header"));
    still_serves(&node, "after-bad-hello").await;
}

#[tokio::test]
async fn oversized_header() {
    let node = server("big-header").await;
    send_and_expect(&node, vec![0x7f, 0xff, 0xff, 0xff], "header-too-large").await;
    still_serves(&node, "after-big-header").await;
}

fn msg_with_frames(type_name: &str, frames: Vec<handoff::wire::Descriptor>, tail: &[u8]) -> Vec<u8> {
    let body = [0x80u8];
    let mut out = header_bytes(&Header::Msg {
        type_name,
        body: &body,
        frames,
    });
    out.extend_from_slice(tail);
    out
}

#[tokio::test]
async fn too_many_frames() {
    let node = server("many-frames").await;
    let frames = vec![handoff::wire::Descriptor::Inline { len: 0 }; 5000];
    send_and_expect(&node, msg_with_frames("test.Ping", frames, &[]), "too-many-frames").await;
    still_serves(&node, "after-many-frames").await;
}

#[tokio::test]
async fn truncated_frame() {
    let node = server("truncated").await;
    let frames = vec![handoff::wire::Descriptor::Inline { len: 1000 }];
    send_and_expect(
        &node,
        msg_with_frames("test.Ping", frames, b"only a few bytes"),
        "truncated",
    )
    .await;
    still_serves(&node, "after-truncated").await;
}

#[tokio::test]
async fn unknown_type_name() {
    let node = server("unknown-type").await;
    send_and_expect(&node, msg_with_frames("no.such.Type", vec![], &[]), "unknown-type").await;
    still_serves(&node, "after-unknown-type").await;
}

#[tokio::test]
async fn body_that_does_not_match_the_type_is_an_error_for_the_receiver_only() {
    let node = server("bad-body").await;
    let mut s = handshaken(&addr(&node)).await;
    // A body of the right name but the wrong shape is delivered; decoding it fails clearly.
    s.write_all(&msg_with_frames("test.Ping", vec![], &[])).await.unwrap();
    let env = node.recv_timeout(Duration::from_secs(10)).await.unwrap();
    let err = env.decode::<Ping>().unwrap_err();
    assert!(
        err.to_string().contains("cannot decode body of type \"test.Ping\""),
        "{err}"
    );
    still_serves(&node, "after-bad-body").await;
}

/// A ticket whose owner is no node id (any string decodes) with a character that spans the
/// twelfth byte: the node names the owner in its label without cutting the character, and
/// the message arrives (the read loop used to panic there, dropping the connection unsaid).
#[tokio::test]
async fn a_ticket_owner_that_is_not_a_node_id() {
    let node = server("odd-owner").await;
    let mut s = handshaken(&addr(&node)).await;
    let claim = handoff::wire::TicketClaim {
        len: 10,
        owner: "0123456789aé-not-an-id".into(),
        addr: Some("127.0.0.1:1".into()),
        lease: 1,
        token: vec![0; 32],
        digest: handoff::wire::TicketDigest::Blake3([0; 32]),
        ttl_ms: 1000,
        lazy: true,
    };
    let bytes = msg_with_frames("test.Ping", vec![handoff::wire::Descriptor::Ticket(claim)], &[]);
    s.write_all(&bytes).await.unwrap();
    let env = node.recv_timeout(Duration::from_secs(10)).await.unwrap();
    assert_eq!(env.type_name(), "test.Ping");
    still_serves(&node, "after-odd-owner").await;
}

/// Large headers that are no message (here `refused` answers to requests never made, each
/// past the small-header size, so each takes room before it is read) give their room back
/// at once: the peer holds none afterwards, and its messages are still taken.
#[tokio::test]
async fn large_headers_that_are_no_message_give_their_room_back() {
    let node = server("large-non-messages").await;
    let mut s = handshaken(&addr(&node)).await;
    let long = "x".repeat(200_000);
    for req in 0..20 {
        let refused = header_bytes(&Header::Ticket(handoff::wire::TicketOp::Refused {
            req: 1_000 + req,
            code: "bad-token".into(),
            message: long.clone(),
        }));
        s.write_all(&refused).await.unwrap();
    }
    let ping = msg_with_frames("test.Ping", vec![], &[]);
    s.write_all(&ping).await.unwrap();
    // The message waits in the inbox, untaken, holding its room: once the headers before it
    // were read, the peer holds that room and nothing more (4 MB more if each header's
    // room had stayed).
    let peer = node.peer("raw-client").expect("the raw client is a peer");
    let t0 = std::time::Instant::now();
    while peer.buffered_bytes() == 0 && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = peer.buffered_bytes();
    assert!(held > 0, "the message is queued");
    assert!(
        held < 1_000_000,
        "the peer holds {held} bytes of room for one small message"
    );
    let env = node.recv_timeout(Duration::from_secs(10)).await.unwrap();
    assert_eq!(env.type_name(), "test.Ping");
}

/// A holder that keeps at most `max_owner_connections` connections to the ticket owners it
/// dials (spec §9.1).
async fn holder(name: &str, max_owner_connections: usize) -> Node {
    let bounds = handoff::Bounds {
        max_owner_connections,
        ..handoff::Bounds::default()
    };
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Ping>()
        .bounds(bounds)
        .build()
        .await
        .unwrap()
}

/// A ticket owner on a host of its own (so that it is reached over TCP).
async fn owner(name: &str) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .host_id(format!("{name}-host"))
        .build()
        .await
        .unwrap()
}

/// A ticket of lease 1 (one the owner never issued: a pull of it is refused) of `owner` at
/// `addr`.
fn claim_of(owner: &str, addr: &str, lazy: bool) -> handoff::wire::TicketClaim {
    handoff::wire::TicketClaim {
        len: 10,
        owner: owner.to_string(),
        addr: Some(addr.to_string()),
        lease: 1,
        token: vec![0; 32],
        digest: handoff::wire::TicketDigest::Blake3([0; 32]),
        ttl_ms: 30_000,
        lazy,
    }
}

/// Sends `test.Ping {seq: 1, data: <the ticket>}` on `s` and returns what `node` received.
async fn ping_with_ticket(s: &mut TcpStream, node: &Node, claim: handoff::wire::TicketClaim) -> handoff::Envelope {
    // A frame reference is ext 1 of 4 bytes (spec §8.2).
    let body = b"\x82\xa3seq\x01\xa4data\xd6\x01\x00\x00\x00\x00";
    let bytes = header_bytes(&Header::Msg {
        type_name: "test.Ping",
        body,
        frames: vec![handoff::wire::Descriptor::Ticket(claim)],
    });
    s.write_all(&bytes).await.unwrap();
    node.recv_timeout(Duration::from_secs(10)).await.unwrap()
}

/// (A connection used in the last 100 ms does not make room: the owners come apart.)
async fn after_recent_use() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

/// Tickets that name many owners, each a real node (the sender runs them), make the holder
/// dial each one to redeem: it keeps at most `max_owner_connections` of those connections
/// (spec §9.1), closing the one unused longest to dial another, so that a peer cannot fill
/// the node's places for connections (before the bound, 1030 such tickets left a node at
/// its 1024 connections, refusing every new peer).
#[tokio::test]
async fn a_holder_keeps_so_many_connections_to_ticket_owners() {
    let node = holder("many-owners", 2).await;
    let mut owners = Vec::new();
    for i in 0..5 {
        owners.push(owner(&format!("owner-{i}")).await);
    }
    let mut s = handshaken(&addr(&node)).await;
    for o in &owners {
        after_recent_use().await;
        let claim = claim_of(&o.endpoint().node_id, o.listen_addr().unwrap(), false);
        let env = ping_with_ticket(&mut s, &node, claim).await;
        let err = env.decode::<Ping>().unwrap_err().to_string();
        assert!(err.contains("unknown-lease"), "{err}");
        let t0 = std::time::Instant::now();
        let owners_connected = || node.peers().iter().filter(|p| p.name().starts_with("owner-")).count();
        while owners_connected() > 2 && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(owners_connected() <= 2, "{} owner connections kept", owners_connected());
    }
    // The last two owners dialed are the ones kept.
    let kept: Vec<String> = node.peers().iter().map(|p| p.name().to_string()).collect();
    assert!(
        kept.contains(&"owner-3".to_string()) && kept.contains(&"owner-4".to_string()),
        "{kept:?}"
    );
    still_serves(&node, "after-many-owners").await;
}

/// A connection to an owner where the holder keeps a ticket is never the one closed to make
/// room: closing it would end that hold (spec §7.7), so another peer's tickets could make
/// this one fail. With no room left, the new redemption fails instead, saying why; once the
/// ticket is dropped, its owner's connection makes room again.
#[tokio::test]
async fn a_connection_to_an_owner_whose_ticket_we_hold_is_not_closed_to_make_room() {
    let node = holder("holder", 1).await;
    let (a, b) = (owner("owner-a").await, owner("owner-b").await);
    let claim = |o: &Node, lazy: bool| claim_of(&o.endpoint().node_id, o.listen_addr().unwrap(), lazy);
    let mut s = handshaken(&addr(&node)).await;
    // A lazy ticket of owner A, kept; reading it dials A (the pull is refused: no such lease).
    let env = ping_with_ticket(&mut s, &node, claim(&a, true)).await;
    let ping = env.decode::<Ping>().unwrap();
    let ticket = handoff::Ticket::of(&ping.data).expect("a ticket");
    let err = ticket.read(0..1).await.unwrap_err().to_string();
    assert!(err.contains("unknown-lease"), "{err}");
    // Owner B's ticket finds no room: A's connection stays, for the ticket we hold.
    after_recent_use().await;
    let env = ping_with_ticket(&mut s, &node, claim(&b, false)).await;
    let err = env.decode::<Ping>().unwrap_err().to_string();
    assert!(err.contains("tickets of its owner held"), "{err}");
    assert!(node.peer("owner-a").is_some(), "the connection to A stays");
    // The ticket dropped, A's connection makes room for B's.
    drop((ticket, ping));
    after_recent_use().await;
    let env = ping_with_ticket(&mut s, &node, claim(&b, false)).await;
    let err = env.decode::<Ping>().unwrap_err().to_string();
    assert!(err.contains("unknown-lease"), "B was reached: {err}");
    let t0 = std::time::Instant::now();
    while node.peer("owner-a").is_some() && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(node.peer("owner-a").is_none(), "A's connection was closed");
    assert!(node.peer("owner-b").is_some());
}

/// A redemption dropped while it dials an owner (a caller's timeout) gives its reserved place
/// among the kept owner connections back: before, each such drop kept a place for good, and
/// after `max_owner_connections` of them no new owner could be reached.
#[tokio::test]
async fn a_redemption_dropped_while_it_dials_gives_its_place_back() {
    let node = holder("dropper", 1).await;
    // An "owner" that accepts and never speaks: a dial to it waits for its handshake.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = format!("tcp://{}", silent.local_addr().unwrap());
    let _held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            kept.push(s);
        }
    });
    let real = owner("real-owner").await;
    let mut s = handshaken(&addr(&node)).await;
    let env = ping_with_ticket(
        &mut s,
        &node,
        claim_of(&handoff::identity::random_id(), &silent_addr, true),
    )
    .await;
    let stuck = handoff::Ticket::of(&env.decode::<Ping>().unwrap().data).expect("a ticket");
    let dropped = tokio::time::timeout(Duration::from_millis(300), stuck.read(0..1)).await;
    assert!(dropped.is_err(), "the read waits on the silent owner, and is dropped");
    drop(stuck);
    let claim = claim_of(&real.endpoint().node_id, real.listen_addr().unwrap(), true);
    let env = ping_with_ticket(&mut s, &node, claim).await;
    let reachable = handoff::Ticket::of(&env.decode::<Ping>().unwrap().data).expect("a ticket");
    let err = reachable.read(0..1).await.unwrap_err().to_string();
    assert!(err.contains("unknown-lease"), "the real owner was reached: {err}");
}

/// An owner that reads nothing slows only its own releases: the holds on its tickets that
/// end here queue their `unlease`s on its connection, and a hold on another owner's ticket
/// that ends after them is released at once (a loop that waited for each write, a second
/// at most, held the other owner's release behind thousands of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_reads_nothing_does_not_hold_up_releases_to_others() {
    let node = server("unleases-holder").await;
    // The raw client (node id ...abc) reads nothing, through a small receive buffer.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut silent = handshaken_on(sock.connect(addr(&node).parse().unwrap()).await.unwrap()).await;
    let silent_id = "00000000000000000000000000000abc";
    // Lazy tickets of its own (not redeemed on receipt), dropped here as they come: each
    // owes it an `unlease` (past a MiB of them unwritten, further ones are dropped).
    let tickets_per_message = 1000;
    let messages = 120;
    let writer = tokio::spawn(async move {
        for m in 0..messages {
            let frames = (0..tickets_per_message)
                .map(|i| {
                    let mut claim = claim_of(silent_id, "127.0.0.1:1", true);
                    claim.lease = (m * tickets_per_message + i + 1) as u64;
                    handoff::wire::Descriptor::Ticket(claim)
                })
                .collect();
            if silent
                .write_all(&msg_with_frames("test.Ping", frames, &[]))
                .await
                .is_err()
            {
                break;
            }
        }
        silent
    });
    let mut dropped = 0;
    while let Ok(env) = node.recv_timeout(Duration::from_secs(2)).await {
        drop(env);
        dropped += tickets_per_message;
    }
    assert_eq!(
        dropped,
        messages * tickets_per_message,
        "every ticket came: our unleases never stop the node reading the owner"
    );
    // Another owner's ticket, redeemed and let go after them: its hold ends at the owner.
    let other = owner("unleases-other").await;
    let peer = other.connect(node.listen_addr().unwrap()).await.unwrap();
    peer.send_by_ticket(Ping {
        seq: 1,
        data: Buffer::from(vec![5u8; 4096]),
    })
    .await
    .unwrap();
    let got = node.recv_timeout(Duration::from_secs(10)).await.unwrap();
    assert!(got.decode::<Ping>().unwrap().data.iter().all(|&x| x == 5));
    let t0 = std::time::Instant::now();
    while other.ticket_leases().count > 0 && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        other.ticket_leases().count,
        0,
        "the other owner's lease ended within {:?}",
        t0.elapsed()
    );
    writer.abort();
}

/// A redemption dropped while its owner does not answer (a caller's timeout) leaves no
/// request behind: the owner's connection stops counting as waiting for an answer, so it
/// makes room for the next owner's (before, every later dial failed: "none can close").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_its_owner_is_silent_is_forgotten() {
    let node = holder("forgets", 1).await;
    let answers = owner("answers").await;
    let (silent_addr, silent_id) = raw::silent_acceptor(SECRET, "0000000000000000000000000000051e");
    let mut s = handshaken(&addr(&node)).await;
    let env = ping_with_ticket(&mut s, &node, claim_of(&silent_id, &silent_addr, true)).await;
    let ping = env.decode::<Ping>().unwrap();
    let ticket = handoff::Ticket::of(&ping.data).expect("a ticket");
    let waited = tokio::time::timeout(Duration::from_millis(300), ticket.read(0..1)).await;
    assert!(waited.is_err(), "the silent owner does not answer");
    drop((ticket, ping));
    after_recent_use().await;
    let claim = claim_of(&answers.endpoint().node_id, answers.listen_addr().unwrap(), false);
    let env = ping_with_ticket(&mut s, &node, claim).await;
    let err = env.decode::<Ping>().unwrap_err().to_string();
    assert!(err.contains("unknown-lease"), "the next owner was reached: {err}");
}
