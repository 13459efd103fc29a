//! The attack of spec §5.6, run against real nodes: a peer without the cluster secret opens
//! two connections, crosses the nodes' challenges and forwards each proof a node writes to
//! the other connection, where it is the attacker's.
//!
//! - Against nodes of version 2 (a node sending `2..=2`, as the release before version 3
//!   did), it works: the attacker gets the node's `ident` and `ready`. This is why version 3
//!   exists, and the test shows that the attack in these tests is the real one.
//! - Against a default node (version 3) it fails on one node and across two.
//! - A version-3 node that accepts version 2 announces `2..=3`, which its version-2 proofs
//!   cover, so it is no oracle on its own; but while a node of the old version is in the
//!   cluster, the attacker uses that one as the oracle for it (§5.8).
//!
//! The same attacks against real `handoff node` and Python worker processes are in
//! `handoff chaos --hostile` (`reflection`, `interleaving-two-nodes`, `relay-to-self`, …).

use std::time::Duration;

use handoff::wire::framing::encode_header_into;
use handoff::wire::{decode_message, Header, Limits, Preamble};
use handoff::Node;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "reflection-secret";
const WAIT: Duration = Duration::from_millis(500);

async fn node(name: &str, configure: impl FnOnce(handoff::NodeBuilder) -> handoff::NodeBuilder) -> Node {
    configure(Node::builder(name).secret(SECRET).listen("127.0.0.1:0").shm(false))
        .build()
        .await
        .unwrap()
}

fn addr(node: &Node) -> String {
    node.listen_addr().unwrap().trim_start_matches("tcp://").to_string()
}

fn framed(header: &Header<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(header, &mut out);
    out
}

fn framed_raw(header: &[u8]) -> Vec<u8> {
    [&(header.len() as u32).to_be_bytes()[..], header].concat()
}

/// One of the attacker's connections: what the node sent so far.
struct Conn {
    s: TcpStream,
    challenge: Vec<u8>,
}

/// Connects to `to`, sends `preamble` and reads the node's preamble and challenge.
async fn open(to: &str, preamble: Preamble) -> Conn {
    let mut s = TcpStream::connect(to).await.unwrap();
    s.write_all(&preamble.encode()).await.unwrap();
    let mut theirs = [0u8; 16];
    s.read_exact(&mut theirs).await.unwrap();
    let challenge = read_header(&mut s, Duration::from_secs(5)).await.expect("a challenge");
    Conn { s, challenge }
}

async fn read_header(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    tokio::time::timeout(limit, async {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.ok()?;
        let mut h = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut h).await.ok()?;
        Some(h)
    })
    .await
    .ok()
    .flatten()
}

/// The kinds of the headers the node sends until it closes or goes quiet.
async fn rest(s: &mut TcpStream) -> Vec<String> {
    let mut kinds = Vec::new();
    while let Some(h) = read_header(s, WAIT).await {
        let bytes = framed_raw(&h);
        let Ok(m) = decode_message(&bytes, &Limits::default()) else {
            break;
        };
        kinds.push(match m.header {
            Header::Error { code, .. } => format!("error {code}"),
            other => other.kind().to_string(),
        });
    }
    kinds
}

/// The attack on connections to `a` (announcing `pa`) and `b` (announcing `pb`): crossed
/// challenges, proofs forwarded, then an ident of the attacker's and `ready` where the node
/// asks for them. Returns what each node sent after its challenge.
async fn attack(a: &str, pa: Preamble, b: &str, pb: Preamble) -> (Vec<String>, Vec<String>) {
    let mut ca = open(a, pa).await;
    let mut cb = open(b, pb).await;
    ca.s.write_all(&framed_raw(&cb.challenge)).await.unwrap();
    cb.s.write_all(&framed_raw(&ca.challenge)).await.unwrap();
    let (proof_a, proof_b) = tokio::join!(read_header(&mut ca.s, WAIT), read_header(&mut cb.s, WAIT));
    let mut sent_a = Vec::new();
    let mut sent_b = Vec::new();
    for (proof, sent) in [(&proof_a, &mut sent_a), (&proof_b, &mut sent_b)] {
        if let Some(p) = proof {
            sent.push(Header::decode(p, &Limits::default()).unwrap().kind().to_string());
        }
    }
    let forged = |p: &Option<Vec<u8>>| match p {
        Some(p) => framed_raw(p),
        None => framed(&Header::Auth { mac: vec![0x5a; 32] }),
    };
    let _ = ca.s.write_all(&forged(&proof_b)).await;
    let _ = cb.s.write_all(&forged(&proof_a)).await;
    // If a node took the proof, it sends its ident: answer with one and `ready`.
    let me = handoff::wire::Ident {
        node_id: "ab".repeat(16),
        name: "intruder".into(),
        host_id: "nowhere".into(),
        pid: 1,
        process_id: "cd".repeat(16),
        language: "none".into(),
        implementation: "intruder/0".into(),
        capabilities: vec!["inline".into()],
        listen: None,
        unix: None,
    };
    for c in [&mut ca, &mut cb] {
        let _ = c.s.write_all(&framed(&Header::Ident(me.clone()))).await;
        let _ = c.s.write_all(&framed(&Header::Ready)).await;
    }
    let (rest_a, rest_b) = tokio::join!(rest(&mut ca.s), rest(&mut cb.s));
    sent_a.extend(rest_a);
    sent_b.extend(rest_b);
    (sent_a, sent_b)
}

fn let_in(sent: &[String]) -> bool {
    sent.iter().any(|k| k == "ident") && sent.iter().any(|k| k == "ready")
}

#[tokio::test]
async fn the_attack_lets_a_peer_without_the_secret_into_a_version_2_node() {
    let old = node("old-v2", |b| b.preamble(Preamble::V2_ONLY)).await;
    let (a, b) = attack(&addr(&old), Preamble::V2_ONLY, &addr(&old), Preamble::V2_ONLY).await;
    assert!(let_in(&a) && let_in(&b), "the attack works on v2: {a:?} {b:?}");
    assert!(old.wait_for_peer("intruder", Duration::from_secs(5)).await.is_ok());
}

#[tokio::test]
async fn it_fails_against_a_version_3_node_which_proves_nothing_to_the_attacker() {
    let victim = node("v3", |b| b).await;
    let (a, b) = attack(&addr(&victim), Preamble::OURS, &addr(&victim), Preamble::OURS).await;
    for sent in [&a, &b] {
        assert_eq!(sent, &["error auth-failed".to_string()], "no proof, no ident, no ready");
    }
    assert!(victim.peers().is_empty());
}

#[tokio::test]
async fn it_fails_across_two_version_3_nodes_of_one_cluster() {
    let one = node("v3-one", |b| b).await;
    let two = node("v3-two", |b| b).await;
    let (a, b) = attack(&addr(&one), Preamble::OURS, &addr(&two), Preamble::OURS).await;
    for sent in [&a, &b] {
        assert_eq!(sent, &["error auth-failed".to_string()]);
    }
    assert!(one.peers().is_empty() && two.peers().is_empty());
}

#[tokio::test]
async fn a_node_that_accepts_v2_is_let_in_to_while_an_old_node_serves_as_the_oracle() {
    let upgraded = node("accepts-v2", |b| b.accept_v2(true)).await;
    // On its own it is no oracle: it announces 2..=3, which its v2 proofs cover.
    let (a, b) = attack(&addr(&upgraded), Preamble::V2_ONLY, &addr(&upgraded), Preamble::V2_ONLY).await;
    assert!(!let_in(&a) && !let_in(&b), "{a:?} {b:?}");
    // Beside a node of the old version, each is the other's oracle.
    let old = node("still-v2", |b| b.preamble(Preamble::V2_ONLY)).await;
    let (a, b) = attack(&addr(&upgraded), Preamble::V2_ONLY, &addr(&old), Preamble::ACCEPTING_V2).await;
    assert!(
        let_in(&a) && let_in(&b),
        "accepting v2 is only for the time of an upgrade: {a:?} {b:?}"
    );
}
