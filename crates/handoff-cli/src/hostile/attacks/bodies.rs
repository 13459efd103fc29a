//! Class 1: message bodies that do not decode, and ticket redemptions that fail.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use handoff::wire::{Header, TicketOp};
use handoff::Message;

use super::common::{blob, next_ticket_op, raw_body, served, ticket, Findings, Target};
use crate::hostile::raw::{framed, Identity, Raw};
use crate::protocol::{Blob, Ping};

pub(super) async fn bad_bodies(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("bad-bodies"), &t.secret).await?;
    // {"seq": "x", "data": bin}: a field of the wrong type.
    let wrong_type = [
        0x82, 0xa3, b's', b'e', b'q', 0xa1, b'x', 0xa4, b'd', b'a', b't', b'a', 0xc4, 0x00,
    ];
    // {"seq": 1, "data": frame 5} in a message without frames.
    let bad_ref = [
        0x82, 0xa3, b's', b'e', b'q', 0x01, 0xa4, b'd', b'a', b't', b'a', 0xd6, 0x01, 0, 0, 0, 5,
    ];
    // 200 nested arrays.
    let mut deep = vec![0x82, 0xa3, b's', b'e', b'q'];
    deep.extend(std::iter::repeat_n(0x91, 200));
    deep.push(0x01);
    deep.extend_from_slice(&[0xa4, b'd', b'a', b't', b'a', 0xc4, 0x00]);
    for i in 0..300u64 {
        raw.write(&raw_body(Ping::TYPE_NAME, &wrong_type)).await?;
        raw.write(&raw_body(Blob::TYPE_NAME, &bad_ref)).await?;
        raw.write(&raw_body(Ping::TYPE_NAME, &deep)).await?;
        if i % 100 == 0 {
            tokio::task::yield_now().await;
        }
    }
    f.check(
        served(&mut raw, 1).await,
        "after 900 bodies that do not decode, the same connection is served",
    );
    Ok(())
}

pub(super) async fn failed_redemptions(t: &Target, f: &mut Findings) -> Result<()> {
    let len = 1u64 << 20;
    let digest = *blake3::hash(&vec![1u8; len as usize]).as_bytes();
    for (variant, what) in [
        ("digest", "bytes that do not match the digest"),
        ("refuse", "a refusal"),
        ("silence", "no answer until the pull timeout"),
        ("drop", "the owner dropping out mid-pull"),
    ] {
        let who = Identity::fresh(&format!("owner-{variant}"));
        let mut raw = Raw::tcp_handshaken(&t.listen, &who, &t.secret).await?;
        raw.write(&blob(1, ticket(&who.node_id, None, len, digest))).await?;
        let op = tokio::time::timeout(Duration::from_secs(10), next_ticket_op(&mut raw))
            .await
            .context("the victim did not pull the ticket")??;
        let TicketOp::Pull { req, len: n, .. } = op else {
            bail!("expected a pull, got {op:?}")
        };
        match variant {
            "digest" => {
                raw.write(&framed(&Header::Ticket(TicketOp::Pulled { req, len: n })))
                    .await?;
                raw.write(&vec![2u8; n as usize]).await?;
            }
            "refuse" => {
                let refusal = TicketOp::Refused {
                    req,
                    code: "bad-token".into(),
                    message: "no".into(),
                };
                raw.write(&framed(&Header::Ticket(refusal))).await?;
            }
            "silence" => tokio::time::sleep(Duration::from_millis(t.bounds.timeout_ms + 500)).await,
            _ => {
                raw.write(&framed(&Header::Ticket(TicketOp::Pulled { req, len: n })))
                    .await?;
                raw.write(&vec![1u8; (n / 2) as usize]).await?;
                drop(raw);
                continue;
            }
        }
        f.check(
            served(&mut raw, 2).await,
            format!("a failed redemption ({what}) leaves the connection served"),
        );
    }
    Ok(())
}
