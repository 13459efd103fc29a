//! Forged, misdirected, replayed and expired tokens are refused with a clear code, and the
//! connection stays open for legitimate traffic. A raw client speaks the ticket protocol by
//! hand (through `handoff-wire`).

use std::time::Duration;

mod raw;

use handoff::tickets::LeaseConfig;
use handoff::wire::framing::encode_header_into;
use handoff::wire::{Descriptor, Header, Limits, TicketClaim, TicketOp};
use handoff::{Buffer, Message, Node};
use raw::RawSide;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &str = "token-secret";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Blob {
    data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "test.Blob";
}

fn header(h: &Header<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(h, &mut out);
    out
}

/// A hand-driven peer: handshakes, then reads and writes whole messages.
struct Raw {
    s: TcpStream,
}

impl Raw {
    async fn connect(node: &Node, id: &str) -> Raw {
        let addr = node.listen_addr().unwrap().trim_start_matches("tcp://").to_string();
        let mut s = TcpStream::connect(addr).await.unwrap();
        let ident = raw::ident(
            id,
            &format!("raw-{id}"),
            "00000000000000000000000000000fff",
            &["inline", "ticket"],
        );
        let mut me = RawSide::v3(SECRET, ident);
        s.write_all(&me.preamble()).await.unwrap();
        let mut pre = [0u8; 16];
        s.read_exact(&mut pre).await.unwrap();
        s.write_all(&me.first()).await.unwrap();
        let mut raw = Raw { s };
        let peer_challenge = raw.read_header().await;
        raw.s.write_all(&me.auth(&pre, &peer_challenge)).await.unwrap();
        raw.read_header().await;
        raw.s.write_all(&me.ident()).await.unwrap();
        raw.read_header().await;
        raw.s.write_all(&me.ready()).await.unwrap();
        raw.read_header().await;
        raw
    }

    async fn read_header(&mut self) -> Vec<u8> {
        let mut len = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), self.s.read_exact(&mut len))
            .await
            .expect("an answer in time")
            .unwrap();
        let mut h = vec![0u8; u32::from_be_bytes(len) as usize];
        self.s.read_exact(&mut h).await.unwrap();
        h
    }

    /// The next ticket claim the node sends us.
    async fn claim(&mut self) -> TicketClaim {
        let h = self.read_header().await;
        match Header::decode(&h, &Limits::default()).unwrap() {
            Header::Msg { frames, .. } => match &frames[0] {
                Descriptor::Ticket(c) => c.clone(),
                other => panic!("expected a ticket, got {other:?}"),
            },
            other => panic!("expected a msg, got {other:?}"),
        }
    }

    async fn send(&mut self, op: TicketOp) {
        self.s.write_all(&header(&Header::Ticket(op))).await.unwrap();
    }

    /// Sends a pull and returns the answer: Ok(bytes) or Err(code).
    async fn pull(&mut self, claim: &TicketClaim, token: &[u8], req: u64) -> Result<Vec<u8>, String> {
        self.send(TicketOp::Pull {
            req,
            lease: claim.lease,
            token: token.to_vec(),
            offset: 0,
            len: claim.len,
        })
        .await;
        let h = self.read_header().await;
        match Header::decode(&h, &Limits::default()).unwrap() {
            Header::Ticket(TicketOp::Pulled { req: r, len }) => {
                assert_eq!(r, req);
                let mut bytes = vec![0u8; len as usize];
                self.s.read_exact(&mut bytes).await.unwrap();
                Ok(bytes)
            }
            Header::Ticket(TicketOp::Refused { req: r, code, message }) => {
                assert_eq!(r, req);
                assert!(!message.is_empty());
                Err(code)
            }
            other => panic!("unexpected answer {other:?}"),
        }
    }
}

#[tokio::test]
async fn bad_tokens_are_refused_and_the_connection_stays_open() {
    let owner = Node::builder("token-owner")
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .leases(LeaseConfig {
            ttl: Duration::from_millis(400),
            ..LeaseConfig::default()
        })
        .build()
        .await
        .unwrap();
    let mut r1 = Raw::connect(&owner, "000000000000000000000000000000r1").await;
    let mut r2 = Raw::connect(&owner, "000000000000000000000000000000r2").await;
    let bytes: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    let blob = Blob {
        data: Buffer::from(bytes.clone()),
    };
    owner
        .peer("raw-000000000000000000000000000000r1")
        .unwrap()
        .send_by_ticket(blob.clone())
        .await
        .unwrap();
    let claim = r1.claim().await;

    assert_eq!(r1.pull(&claim, &[7u8; 32], 1).await, Err("bad-token".into()), "forged");
    assert_eq!(
        r2.pull(&claim, &claim.token, 2).await,
        Err("bad-token".into()),
        "misdirected"
    );
    assert_eq!(
        r1.pull(&claim, &claim.token, 3).await,
        Ok(bytes.clone()),
        "legitimate, same connection"
    );
    r1.send(TicketOp::Unlease {
        lease: claim.lease,
        token: claim.token.clone(),
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        r1.pull(&claim, &claim.token, 4).await,
        Err("unknown-lease".into()),
        "replayed"
    );

    // Expired: the 400 ms hold runs out before the pull.
    owner
        .peer("raw-000000000000000000000000000000r1")
        .unwrap()
        .send_by_ticket(blob)
        .await
        .unwrap();
    let late = r1.claim().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let code = r1.pull(&late, &late.token, 5).await.unwrap_err();
    assert!(code == "expired" || code == "unknown-lease", "{code}");
    assert_eq!(owner.ticket_leases().count, 0, "the deadline freed it");
    assert!(
        owner.peer("raw-000000000000000000000000000000r1").is_some(),
        "still connected"
    );
}
