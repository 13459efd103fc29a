//! Protocol versions (spec §3, §5.4, §5.7): version 3 by default, on TCP and after the switch
//! to a Unix socket; versions 2 and 1 only between nodes that accept them; older peers
//! refused by a default node; and a peer that has proven nothing learns nothing but a nonce.

mod raw;

use std::time::Duration;

use handoff::wire::{decode_message, Header, Limits, Preamble};
use handoff::{Bounds, Channel, Error, Message, Node};
use raw::RawSide;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

const SECRET: &str = "versions-secret";
const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Note {
    text: String,
}
impl Message for Note {
    const TYPE_NAME: &'static str = "test.Note";
}

async fn node(name: &str, configure: impl FnOnce(handoff::NodeBuilder) -> handoff::NodeBuilder) -> Node {
    configure(
        Node::builder(name)
            .secret(SECRET)
            .listen("127.0.0.1:0")
            .register::<Note>(),
    )
    .build()
    .await
    .unwrap()
}

/// `from` sends `to` a note over `peer`, and `to` receives it.
async fn exchange(peer: &handoff::Peer, to: &Node, text: &str) {
    peer.send(Note { text: text.into() }).await.unwrap();
    let env = to.recv_timeout(T).await.unwrap();
    assert_eq!(env.decode::<Note>().unwrap().text, text);
}

/// Both directions of a connection from `a` to `b` carry messages.
async fn both_ways(a: &Node, b: &Node, peer: &handoff::Peer) {
    exchange(peer, b, "a to b").await;
    let back = b.peer(a.name()).expect("b knows a");
    assert_eq!(back.protocol_version(), peer.protocol_version());
    exchange(&back, a, "b to a").await;
}

#[tokio::test]
async fn version_3_by_default_on_tcp_and_after_the_switch_to_shm() {
    let a = node("v3-a", |b| b).await;
    let b = node("v3-b", |b| b).await;
    let tcp = a
        .connect_with(b.listen_addr().unwrap(), Some(Channel::Tcp))
        .await
        .unwrap();
    assert_eq!((tcp.channel(), tcp.protocol_version()), (Channel::Tcp, Some(3)));
    both_ways(&a, &b, &tcp).await;

    let c = node("v3-c", |b| b).await;
    let shm = c.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!((shm.channel(), shm.protocol_version()), (Channel::Shm, Some(3)));
    both_ways(&c, &b, &shm).await;
}

#[tokio::test]
async fn nodes_that_accept_older_versions_still_use_v3_with_each_other() {
    let a = node("both-a", |b| b.accept_v1(true)).await;
    let b = node("both-b", |b| b.accept_v2(true)).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.protocol_version(), Some(3));
    both_ways(&a, &b, &peer).await;
    // And with a default node.
    let c = node("both-c", |b| b).await;
    let peer = c.connect(a.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.protocol_version(), Some(3));
    both_ways(&c, &a, &peer).await;
}

#[tokio::test]
async fn version_2_runs_only_when_the_node_accepts_it_on_tcp_and_shm() {
    // An older peer: speaks version 2 only, as a default v2 implementation does.
    let old = node("v2-old", |b| b.preamble(Preamble::V2_ONLY)).await;
    let new = node("v2-new", |b| b.accept_v2(true)).await;
    let tcp = old
        .connect_with(new.listen_addr().unwrap(), Some(Channel::Tcp))
        .await
        .unwrap();
    assert_eq!((tcp.channel(), tcp.protocol_version()), (Channel::Tcp, Some(2)));
    both_ways(&old, &new, &tcp).await;
    let shm = new.connect(old.listen_addr().unwrap()).await.unwrap();
    assert_eq!((shm.channel(), shm.protocol_version()), (Channel::Shm, Some(2)));
    both_ways(&new, &old, &shm).await;
    // A default node refuses it, both ways.
    let default = node("v2-refuses", |b| b).await;
    for (from, to) in [(&old, &default), (&default, &old)] {
        let err = from.connect(to.listen_addr().unwrap()).await.expect_err("refused");
        assert_eq!(code_of(&err), "unsupported-version", "{err}");
    }
}

/// The code of a connection's refusal, whichever side saw it first.
fn code_of(err: &Error) -> String {
    match err {
        Error::Wire(e) => e.code().to_string(),
        Error::Refused { code, .. } => code.clone(),
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn version_1_runs_when_both_sides_accept_it_on_tcp_and_shm() {
    // An older peer: speaks version 1 only.
    let old = node("v1-old", |b| b.preamble(Preamble::V1_ONLY)).await;
    let new = node("v1-new", |b| b.accept_v1(true)).await;
    let tcp = old
        .connect_with(new.listen_addr().unwrap(), Some(Channel::Tcp))
        .await
        .unwrap();
    assert_eq!((tcp.channel(), tcp.protocol_version()), (Channel::Tcp, Some(1)));
    both_ways(&old, &new, &tcp).await;
    // The other way round, switching to the Unix socket, over version 1 there too.
    let shm = new.connect(old.listen_addr().unwrap()).await.unwrap();
    assert_eq!((shm.channel(), shm.protocol_version()), (Channel::Shm, Some(1)));
    both_ways(&new, &old, &shm).await;
}

#[tokio::test]
async fn a_default_node_refuses_a_v1_only_peer_with_unsupported_version() {
    let old = node("refused-old", |b| b.preamble(Preamble::V1_ONLY)).await;
    let new = node("refused-new", |b| b).await;
    for (from, to) in [(&old, &new), (&new, &old)] {
        let Err(err) = from.connect(to.listen_addr().unwrap()).await else {
            panic!("a v1-only peer was accepted");
        };
        assert_eq!(code_of(&err), "unsupported-version", "{err}");
    }
    assert!(new.peers().is_empty() && old.peers().is_empty());
}

// ------------------------------------------------------------------ what a node reveals

/// What identifies `node`: none of it may reach a peer that has proven nothing.
fn identity_of(node: &Node) -> Vec<Vec<u8>> {
    let me = node.endpoint();
    let mut out = vec![
        me.node_id.clone(),
        me.name.clone(),
        me.host_id.clone(),
        me.process_id.clone(),
        node.listen_addr().unwrap().to_string(),
        node.listen_addr().unwrap().trim_start_matches("tcp://").to_string(),
        std::process::id().to_string(),
    ];
    out.extend(node.unix_addr());
    let mut out: Vec<Vec<u8>> = out.into_iter().map(String::into_bytes).collect();
    // The keys of a hello or ident as msgpack strs: no identity went out at all.
    for key in ["node", "host", "pid", "proc", "listen", "unix"] {
        out.push([&[0xa0 | key.len() as u8][..], key.as_bytes()].concat());
    }
    out
}

fn revealed(bytes: &[u8], identity: &[Vec<u8>]) -> Vec<String> {
    identity
        .iter()
        .filter(|needle| bytes.windows(needle.len()).any(|w| w == needle.as_slice()))
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// The `error` code among what the node sent after its preamble.
fn error_code(bytes: &[u8]) -> Option<String> {
    let mut rest = bytes.get(16..)?;
    while !rest.is_empty() {
        let m = decode_message(rest, &Limits::default()).ok()?;
        if let Header::Error { code, .. } = m.header {
            return Some(code);
        }
        rest = &rest[m.consumed..];
    }
    None
}

/// Runs `steps` (writes, and reads of the node's preamble or next header) and returns
/// everything the node sent until it closed the connection.
async fn talk<S: AsyncReadExt + AsyncWriteExt + Unpin>(mut s: S, steps: Vec<Step>) -> Vec<u8> {
    let mut got = Vec::new();
    let mut me = RawSide::v3(
        SECRET,
        raw::ident(&"ab".repeat(16), "prober", &"cd".repeat(16), &["inline"]),
    );
    let mut peer_preamble = [0u8; 16];
    for step in steps {
        match step {
            Step::Write(bytes) => s.write_all(&bytes).await.unwrap(),
            Step::Preamble => s.write_all(&me.preamble()).await.unwrap(),
            Step::Challenge => s.write_all(&me.first()).await.unwrap(),
            // A proof over another challenge than the node's: it cannot verify.
            Step::WrongAuth => s.write_all(&me.auth(&peer_preamble, &[0x80])).await.unwrap(),
            Step::ReadPreamble => {
                s.read_exact(&mut peer_preamble).await.unwrap();
                got.extend_from_slice(&peer_preamble);
            }
            Step::ReadHeader => {
                let mut len = [0u8; 4];
                s.read_exact(&mut len).await.unwrap();
                let mut header = vec![0u8; u32::from_be_bytes(len) as usize];
                s.read_exact(&mut header).await.unwrap();
                got.extend_from_slice(&len);
                got.extend_from_slice(&header);
            }
        }
    }
    let mut rest = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut rest))
        .await
        .expect("the node closes the connection")
        .ok();
    got.extend_from_slice(&rest);
    got
}

enum Step {
    Write(Vec<u8>),
    Preamble,
    Challenge,
    WrongAuth,
    ReadPreamble,
    ReadHeader,
}

/// The ways a peer without the secret can end a handshake, and the error each gets.
fn unproven_scripts() -> Vec<(&'static str, Vec<Step>, &'static str)> {
    use Step::*;
    let hello = RawSide::v1(
        SECRET,
        raw::ident(&"ab".repeat(16), "prober", &"cd".repeat(16), &["inline"]),
    )
    .first();
    vec![
        (
            "a wrong proof",
            vec![Preamble, ReadPreamble, Challenge, ReadHeader, WrongAuth],
            "auth-failed",
        ),
        (
            "a v1-only peer",
            vec![Write(handoff::wire::Preamble::V1_ONLY.encode().to_vec()), ReadPreamble],
            "unsupported-version",
        ),
        (
            "a v2-only peer",
            vec![Write(handoff::wire::Preamble::V2_ONLY.encode().to_vec()), ReadPreamble],
            "unsupported-version",
        ),
        (
            "a hello on a v3 connection",
            vec![Preamble, ReadPreamble, Write(hello)],
            "handshake",
        ),
        (
            "garbage after the preamble",
            vec![Preamble, ReadPreamble, Write(vec![0, 0, 0, 3, 0xc1, 0xc1, 0xc1])],
            "malformed-header",
        ),
        (
            "silence after the challenge",
            vec![Preamble, ReadPreamble, Challenge, ReadHeader],
            "timeout",
        ),
    ]
}

#[tokio::test]
async fn a_peer_that_proved_nothing_learns_nothing_but_a_nonce() {
    let bounds = Bounds {
        handshake_timeout: Duration::from_millis(500),
        ..Bounds::DEFAULT
    };
    let victim = node("reveals-nothing", |b| b.bounds(bounds)).await;
    let identity = identity_of(&victim);
    let tcp = victim.listen_addr().unwrap().trim_start_matches("tcp://").to_string();
    let unix = victim.unix_addr().expect("a Unix socket");
    let unix = unix.trim_start_matches("unix://").to_string();
    for (what, steps, code) in unproven_scripts() {
        let got = talk(TcpStream::connect(&tcp).await.unwrap(), steps).await;
        assert_eq!(error_code(&got).as_deref(), Some(code), "tcp, {what}: {got:02x?}");
        assert_eq!(revealed(&got, &identity), Vec::<String>::new(), "tcp, {what}");
    }
    for (what, steps, code) in unproven_scripts() {
        let got = talk(UnixStream::connect(&unix).await.unwrap(), steps).await;
        assert_eq!(error_code(&got).as_deref(), Some(code), "unix, {what}: {got:02x?}");
        assert_eq!(revealed(&got, &identity), Vec::<String>::new(), "unix, {what}");
    }
    // A node at its connection bound refuses before any handshake, naming nobody either.
    let full = node("full", |b| {
        b.bounds(Bounds {
            max_connections: 0,
            ..Bounds::DEFAULT
        })
    })
    .await;
    let s = TcpStream::connect(full.listen_addr().unwrap().trim_start_matches("tcp://"))
        .await
        .unwrap();
    let got = talk(s, vec![Step::Preamble]).await;
    assert_eq!(error_code(&got).as_deref(), Some("overloaded"));
    assert_eq!(revealed(&got, &identity_of(&full)), Vec::<String>::new());
}

#[tokio::test]
async fn the_check_would_see_a_v1_hello() {
    // The detector is sound: a node that accepts v1 peers does say who it is to one.
    let open = node("accepts-v1", |b| b.accept_v1(true)).await;
    let s = TcpStream::connect(open.listen_addr().unwrap().trim_start_matches("tcp://"))
        .await
        .unwrap();
    let mut v1 = RawSide::v1(
        SECRET,
        raw::ident(&"ab".repeat(16), "prober", &"cd".repeat(16), &["inline"]),
    );
    let steps = vec![
        Step::Write(v1.preamble().to_vec()),
        Step::ReadPreamble,
        Step::Write(v1.first()),
        Step::ReadHeader,
        Step::Write(vec![0, 0, 0, 3, 0xc1, 0xc1, 0xc1]),
    ];
    let got = talk(s, steps).await;
    let seen = revealed(&got, &identity_of(&open));
    assert!(seen.contains(&open.endpoint().node_id), "{seen:?}");
}

// ------------------------------------------------------------------ refusals before a preamble

/// Everything the node sends on a connection that says `sent` and then nothing, until it
/// closes it.
async fn answer_to(addr: &str, sent: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr.trim_start_matches("tcp://")).await.unwrap();
    s.write_all(sent).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut got))
        .await
        .expect("the node closes the connection")
        .ok();
    got
}

#[tokio::test]
async fn no_error_goes_to_a_peer_whose_preamble_never_came_whole() {
    // spec §3, §11.3: an error only after the preambles were exchanged.
    let bounds = Bounds {
        handshake_timeout: Duration::from_millis(300),
        ..Bounds::DEFAULT
    };
    let victim = node("silent-peers", |b| b.bounds(bounds)).await;
    let ours = Preamble::OURS.encode().to_vec();
    for sent in [&b""[..], &Preamble::OURS.encode()[..8]] {
        let got = answer_to(victim.listen_addr().unwrap(), sent).await;
        assert_eq!(
            got,
            ours,
            "after {} bytes of a preamble: its preamble, then the close",
            sent.len()
        );
    }
    // With the whole preamble, the timeout is said.
    let got = answer_to(victim.listen_addr().unwrap(), &Preamble::OURS.encode()).await;
    assert_eq!(error_code(&got).as_deref(), Some("timeout"));
    // A node at its connection bound: `overloaded` only to a peer that sent its preamble.
    let full = node("full-and-silent", |b| {
        b.bounds(Bounds {
            max_connections: 0,
            ..Bounds::DEFAULT
        })
    })
    .await;
    let got = answer_to(full.listen_addr().unwrap(), b"").await;
    assert_eq!(got, Preamble::OURS.encode().to_vec());
    let got = answer_to(full.listen_addr().unwrap(), &Preamble::OURS.encode()).await;
    assert_eq!(error_code(&got).as_deref(), Some("overloaded"));
}

#[tokio::test]
async fn an_identity_longer_than_its_bounds_is_refused_and_never_kept() {
    // spec §5.2: what a node learns about its peers, and repeats in answers, stays small.
    let victim = node("bounded-idents", |b| b).await;
    let mut s = TcpStream::connect(victim.listen_addr().unwrap().trim_start_matches("tcp://"))
        .await
        .unwrap();
    let name = "n".repeat(300);
    let mut me = RawSide::v3(
        SECRET,
        raw::ident(&"ab".repeat(16), &name, &"cd".repeat(16), &["inline"]),
    );
    s.write_all(&me.preamble()).await.unwrap();
    let mut pre = [0u8; 16];
    s.read_exact(&mut pre).await.unwrap();
    s.write_all(&me.first()).await.unwrap();
    let challenge = read_header(&mut s).await;
    s.write_all(&me.auth(&pre, &challenge)).await.unwrap();
    s.write_all(&me.ident()).await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(T, s.read_to_end(&mut rest)).await.unwrap().ok();
    let mut all = pre.to_vec();
    all.extend_from_slice(&rest);
    assert_eq!(error_code(&all).as_deref(), Some("malformed-header"));
    assert!(victim.peers().is_empty());
    // And a node refuses to start with such a name of its own.
    let err = Node::builder(&name).build().await.expect_err("a name of 300 bytes");
    assert!(err.to_string().contains("at most 256"), "{err}");
}

async fn read_header(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let mut h = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut h).await.unwrap();
    h
}
