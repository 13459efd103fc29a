//! TLS between nodes (WIRE.md §3.1) on loopback: a round trip and a ticket inside TLS, and
//! every refusal with an error that says why: another CA, an expired certificate, a wrong
//! name, a plain peer, a node without TLS. Certificates are made here with rcgen.

use std::net::IpAddr;
use std::time::Duration;

use handoff::{Buffer, Channel, Error, Message, Node, Redeem, TlsConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use serde::{Deserialize, Serialize};

const SECRET: &str = "tls-secret";
const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Blob {
    data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "test.Blob";
}

/// A certificate authority that signs node certificates.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// A node certificate for `names` (DNS names; `127.0.0.1` becomes an IP address SAN),
    /// valid from `from` to `until` (years).
    fn node_cert(&self, names: &[&str], years: (i32, i32)) -> (String, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().unwrap()),
            })
            .collect();
        params.not_before = rcgen::date_time_ymd(years.0, 1, 1);
        params.not_after = rcgen::date_time_ymd(years.1, 1, 1);
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn config(&self, names: &[&str]) -> TlsConfig {
        self.config_for(names, (2020, 2090), &self.pem)
    }

    fn config_for(&self, names: &[&str], years: (i32, i32), trusted_ca: &str) -> TlsConfig {
        let (cert, key) = self.node_cert(names, years);
        TlsConfig::from_pem(cert.as_bytes(), key.as_bytes(), trusted_ca.as_bytes()).unwrap()
    }
}

async fn node(name: &str, tls: Option<TlsConfig>) -> Node {
    let mut b = Node::builder(name)
        .secret(SECRET)
        .host_id(format!("host-{name}"))
        .listen("127.0.0.1:0")
        .register::<Blob>();
    if let Some(tls) = tls {
        b = b.tls(tls);
    }
    b.build().await.unwrap()
}

fn payload(len: usize) -> Buffer {
    Buffer::from((0..len).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>())
}

fn tls_reason(e: &Error) -> String {
    match e {
        Error::Tls { reason, .. } => reason.clone(),
        other => panic!("expected a TLS error, got {other:?}"),
    }
}

#[tokio::test]
async fn messages_and_frames_travel_inside_tls() {
    let ca = Ca::new("cluster CA");
    let a = node("tls-a", Some(ca.config(&["127.0.0.1"]))).await;
    let b = node("tls-b", Some(ca.config(&["127.0.0.1"]))).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Tcp);
    let data = payload(3 << 20);
    peer.send(Blob { data: data.clone() }).await.unwrap();
    let got: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.data, data);
    // And back, on the connection b accepted.
    let back = b.peer("tls-a").unwrap();
    back.send(Blob { data: payload(1000) }).await.unwrap();
    let got: Blob = a.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.data, payload(1000));
}

#[tokio::test]
async fn a_ticket_is_pulled_inside_tls() {
    let ca = Ca::new("cluster CA");
    let owner = Node::builder("tls-owner")
        .secret(SECRET)
        .host_id("host-owner")
        .listen("127.0.0.1:0")
        .register::<Blob>()
        .ticket_threshold(Some(1))
        .tls(ca.config(&["127.0.0.1"]))
        .build()
        .await
        .unwrap();
    let holder = Node::builder("tls-holder")
        .secret(SECRET)
        .host_id("host-holder")
        .listen("127.0.0.1:0")
        .register::<Blob>()
        .redeem(Redeem::Eager)
        .tls(ca.config(&["127.0.0.1"]))
        .build()
        .await
        .unwrap();
    let peer = owner.connect(holder.listen_addr().unwrap()).await.unwrap();
    let data = payload(2 << 20);
    peer.send(Blob { data: data.clone() }).await.unwrap();
    let got: Blob = holder.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.data, data);
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused() {
    let ours = Ca::new("our CA");
    let theirs = Ca::new("their CA");
    let a = node("ca-a", Some(ours.config(&["127.0.0.1"]))).await;
    // b trusts our CA but presents a certificate their CA signed.
    let b = node("ca-b", Some(theirs.config_for(&["127.0.0.1"], (2020, 2090), &ours.pem))).await;
    let e = a.connect(b.listen_addr().unwrap()).await.unwrap_err();
    assert!(tls_reason(&e).contains("not signed by a CA this node trusts"), "{e}");
    // b keeps serving peers with good certificates.
    let c = node("ca-c", Some(ours.config(&["127.0.0.1"]))).await;
    let d = node("ca-d", Some(ours.config(&["127.0.0.1"]))).await;
    c.connect(d.listen_addr().unwrap()).await.unwrap();
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let ours = Ca::new("our CA");
    let theirs = Ca::new("their CA");
    let server = node("cca-server", Some(ours.config(&["127.0.0.1"]))).await;
    // The client trusts our CA (so it accepts the server) but its own certificate is theirs.
    let client = node(
        "cca-client",
        Some(theirs.config_for(&["127.0.0.1"], (2020, 2090), &ours.pem)),
    )
    .await;
    let e = client.connect(server.listen_addr().unwrap()).await.unwrap_err();
    assert!(
        tls_reason(&e).contains("refused this node's certificate"),
        "the client learns that the server refused its certificate: {e}"
    );
    assert!(server.peer("cca-client").is_none());
}

#[tokio::test]
async fn an_expired_certificate_is_refused() {
    let ca = Ca::new("cluster CA");
    let a = node("exp-a", Some(ca.config(&["127.0.0.1"]))).await;
    let b = node("exp-b", Some(ca.config_for(&["127.0.0.1"], (2001, 2002), &ca.pem))).await;
    let e = a.connect(b.listen_addr().unwrap()).await.unwrap_err();
    assert!(tls_reason(&e).contains("expired"), "{e}");
    // An expired client certificate: the server refuses it, and the client hears why.
    let c = node("exp-c", Some(ca.config_for(&["127.0.0.1"], (2001, 2002), &ca.pem))).await;
    let e = c.connect(a.listen_addr().unwrap()).await.unwrap_err();
    assert!(tls_reason(&e).contains("refused this node's certificate"), "{e}");
    assert!(a.peer("exp-c").is_none());
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused_unless_that_name_is_expected() {
    let ca = Ca::new("cluster CA");
    let b = node("name-b", Some(ca.config(&["node-b.cluster"]))).await;
    let a = node("name-a", Some(ca.config(&["127.0.0.1"]))).await;
    let e = a.connect(b.listen_addr().unwrap()).await.unwrap_err();
    assert!(tls_reason(&e).contains("does not name"), "{e}");
    let a2 = node(
        "name-a2",
        Some(ca.config(&["127.0.0.1"]).expect_server_name("node-b.cluster")),
    )
    .await;
    a2.connect(b.listen_addr().unwrap()).await.unwrap();
}

#[tokio::test]
async fn a_plain_peer_is_told_that_tls_is_required() {
    let ca = Ca::new("cluster CA");
    let secure = node("req-secure", Some(ca.config(&["127.0.0.1"]))).await;
    let plain = node("req-plain", None).await;
    let e = plain.connect(secure.listen_addr().unwrap()).await.unwrap_err();
    match &e {
        Error::Refused { code, message, .. } => {
            assert_eq!(code, "tls-required");
            assert!(message.contains("requires TLS"), "{message}");
        }
        other => panic!("expected the tls-required refusal, got {other:?}"),
    }
    // The secure node keeps serving TLS peers.
    let other = node("req-other", Some(ca.config(&["127.0.0.1"]))).await;
    other.connect(secure.listen_addr().unwrap()).await.unwrap();
}

#[tokio::test]
async fn a_tls_node_learns_that_a_plain_node_has_no_tls() {
    let ca = Ca::new("cluster CA");
    let plain = node("noTLS-plain", None).await;
    let secure = node("noTLS-secure", Some(ca.config(&["127.0.0.1"]))).await;
    let e = secure.connect(plain.listen_addr().unwrap()).await.unwrap_err();
    assert!(tls_reason(&e).contains("no TLS configured"), "{e}");
}

#[tokio::test]
async fn shared_memory_on_one_host_is_not_affected() {
    let ca = Ca::new("cluster CA");
    let make = |name: &'static str| {
        Node::builder(name)
            .secret(SECRET)
            .host_id("one-host")
            .listen("127.0.0.1:0")
            .register::<Blob>()
            .tls(ca.config(&["127.0.0.1"]))
            .build()
    };
    let a = make("shm-a").await.unwrap();
    let b = make("shm-b").await.unwrap();
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);
}

#[test]
fn bad_pem_is_a_clear_configuration_error() {
    let e = TlsConfig::from_pem(b"not pem", b"not pem", b"not pem").unwrap_err();
    assert!(format!("{e}").contains("TLS certificate chain"), "{e}");
    let ca = Ca::new("cluster CA");
    let (cert, _) = ca.node_cert(&["127.0.0.1"], (2020, 2090));
    let e = TlsConfig::from_pem(cert.as_bytes(), b"", ca.pem.as_bytes()).unwrap_err();
    assert!(format!("{e}").contains("TLS private key"), "{e}");
    let other_key = KeyPair::generate().unwrap().serialize_pem();
    let e = TlsConfig::from_pem(cert.as_bytes(), other_key.as_bytes(), ca.pem.as_bytes()).unwrap_err();
    assert!(format!("{e}").contains("does not fit"), "{e}");
}

/// A TLS node with the given bounds, for the tests of what a stalled peer can hold.
async fn bounded_tls_node(name: &str, ca: &Ca, bounds: handoff::Bounds) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .host_id(format!("host-{name}"))
        .listen("127.0.0.1:0")
        .bounds(bounds)
        .tls(ca.config(&["127.0.0.1"]))
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_peer_that_stalls_in_the_tls_handshake_is_dropped_at_the_handshake_deadline() {
    use tokio::io::AsyncWriteExt;
    let ca = Ca::new("cluster CA");
    let node = bounded_tls_node(
        "stall-target",
        &ca,
        handoff::Bounds {
            handshake_timeout: Duration::from_millis(300),
            ..handoff::Bounds::DEFAULT
        },
    )
    .await;
    let addr = node.listen_addr().unwrap().trim_start_matches("tcp://").to_string();
    // The first bytes of a TLS record, then silence.
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    raw.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(node.handshakes_in_progress(), 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        node.handshakes_in_progress(),
        0,
        "the stalled TLS handshake ended at its deadline"
    );
    // The node still serves a TLS peer.
    let other = self::node("stall-other", Some(ca.config(&["127.0.0.1"]))).await;
    other.connect(node.listen_addr().unwrap()).await.unwrap();
}

#[tokio::test]
async fn stalled_tls_handshakes_count_against_the_handshake_cap() {
    use tokio::io::AsyncWriteExt;
    let ca = Ca::new("cluster CA");
    let node = bounded_tls_node(
        "cap-target",
        &ca,
        handoff::Bounds {
            max_handshakes: 2,
            ..handoff::Bounds::DEFAULT
        },
    )
    .await;
    let addr = node.listen_addr().unwrap().trim_start_matches("tcp://").to_string();
    let mut stalled = Vec::new();
    for _ in 0..5 {
        let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
        raw.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
        stalled.push(raw);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(node.handshakes_in_progress() <= 2, "{}", node.handshakes_in_progress());
    }
    // The three oldest made way for newer ones: the node closed them, long before the
    // handshake deadline (10 s by default).
    for raw in stalled.iter_mut().take(3) {
        use tokio::io::AsyncReadExt;
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), raw.read(&mut byte)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "an evicted TLS handshake is closed: {read:?}"
        );
    }
    // A real peer still gets in: it takes the place of the oldest stalled one.
    let other = self::node("cap-other", Some(ca.config(&["127.0.0.1"]))).await;
    other.connect(node.listen_addr().unwrap()).await.unwrap();
}

#[tokio::test]
async fn large_messages_back_to_back_all_arrive() {
    // TLS keeps records it could not write yet; every message must still reach the peer
    // without waiting for the next one (the writer flushes them).
    let ca = Ca::new("cluster CA");
    let a = node("burst-a", Some(ca.config(&["127.0.0.1"]))).await;
    let b = node("burst-b", Some(ca.config(&["127.0.0.1"]))).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let data = payload(2 << 20);
    for _ in 0..24 {
        peer.send(Blob { data: data.clone() }).await.unwrap();
    }
    for _ in 0..24 {
        let got: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
        assert_eq!(got.data.len(), data.len());
    }
}

#[tokio::test]
async fn a_plain_peer_that_keeps_sending_after_the_refusal_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = Ca::new("cluster CA");
    let node = self::node("drain-target", Some(ca.config(&["127.0.0.1"]))).await;
    let addr = node.listen_addr().unwrap().trim_start_matches("tcp://").to_string();
    let raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut rd, mut wr) = raw.into_split();
    // A plain preamble, then junk without end: the node reads at most 64 KiB or 1 s of it.
    let flood = tokio::spawn(async move {
        let junk = vec![b'H'; 16 << 10];
        let mut sent = 0usize;
        while wr.write_all(&junk).await.is_ok() {
            sent += junk.len();
            if sent > (64 << 20) {
                break;
            }
        }
        sent
    });
    // It hears the refusal, then the connection ends.
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the refused connection ends within the drain limit");
    assert!(got.windows(12).any(|w| w == b"tls-required"), "{} bytes", got.len());
    let sent = tokio::time::timeout(Duration::from_secs(5), flood)
        .await
        .unwrap()
        .unwrap();
    assert!(
        sent < (64 << 20),
        "the writer was stopped, not left to fill the node: {sent} bytes"
    );
    // The node keeps serving TLS peers.
    let other = self::node("drain-other", Some(ca.config(&["127.0.0.1"]))).await;
    other.connect(node.listen_addr().unwrap()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_directions_stream_at_once_over_one_tls_connection() {
    // The read loop and the link of each side take turns on one TLS session; a half that
    // finds it taken waits as a task and is woken when the other lets go: nothing stalls
    // when both sides send large messages at the same time.
    let ca = Ca::new("cluster CA");
    let a = node("duplex-a", Some(ca.config(&["127.0.0.1"]))).await;
    let b = node("duplex-b", Some(ca.config(&["127.0.0.1"]))).await;
    let to_b = a.connect(b.listen_addr().unwrap()).await.unwrap();
    to_b.send(Blob { data: payload(10) }).await.unwrap();
    let env = b.recv_timeout(T).await.unwrap();
    let to_a = env.from().clone();
    let _: Blob = env.decode().unwrap();
    let data = payload(2 << 20);
    let send = |peer: handoff::Peer, data: Buffer| async move {
        for _ in 0..16 {
            peer.send(Blob { data: data.clone() }).await.unwrap();
        }
    };
    let receive = |node: Node| async move {
        for _ in 0..16 {
            let got: Blob = node.recv_timeout(T).await.unwrap().decode().unwrap();
            assert_eq!(got.data.len(), 2 << 20);
        }
    };
    let all = async {
        tokio::join!(
            tokio::spawn(send(to_b, data.clone())),
            tokio::spawn(send(to_a, data.clone())),
            tokio::spawn(receive(a.clone())),
            tokio::spawn(receive(b.clone())),
        )
    };
    let (s1, s2, r1, r2) = tokio::time::timeout(T, all).await.expect("both directions finish");
    s1.unwrap();
    s2.unwrap();
    r1.unwrap();
    r2.unwrap();
}
