//! Classes 6 and 7: memory a victim holds while a redemption stalls or its inbox fills.

use std::time::Duration;

use anyhow::Result;
use handoff::wire::{Buffer, Descriptor, TicketOp};

use super::common::{blob, msg, next_ticket_op, ticket, Findings, Target};
use crate::hostile::raw::{Identity, Raw};
use crate::protocol::Payload;

/// Sends 1 MiB `Blob`s on `raw` for at most `limit`; returns how many went out.
async fn flood_blobs(raw: &mut Raw, count: u64, limit: Duration) -> u64 {
    let data = vec![5u8; 1 << 20];
    let deadline = tokio::time::Instant::now() + limit;
    for seq in 0..count {
        let mut m = blob(seq, Descriptor::Inline { len: data.len() as u64 });
        m.extend_from_slice(&data);
        match tokio::time::timeout_at(deadline, raw.write(&m)).await {
            Ok(Ok(())) => {}
            _ => return seq,
        }
    }
    count
}

pub(super) async fn redemption_stall(t: &Target, f: &mut Findings) -> Result<()> {
    let who = Identity::fresh("stalling-owner");
    let mut raw = Raw::tcp_handshaken(&t.listen, &who, &t.secret).await?;
    raw.write(&blob(1, ticket(&who.node_id, None, 1 << 20, [0; 32])))
        .await?;
    let op = tokio::time::timeout(Duration::from_secs(10), next_ticket_op(&mut raw)).await??;
    f.check(matches!(op, TicketOp::Pull { .. }), "the victim pulls the ticket");
    // Never answer; flood the same connection meanwhile.
    let sent = flood_blobs(&mut raw, 3000, Duration::from_millis(t.bounds.timeout_ms)).await;
    f.check(
        sent < 3000,
        format!("while its redemption stalls, the victim stops reading the owner: {sent} of 3000 MiB went out"),
    );
    Ok(())
}

pub(super) async fn inbox_bytes(t: &Target, f: &mut Findings) -> Result<()> {
    // The victim handles a message every 50 ms (`victim_args`): what it reads waits.
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("payload-flood"), &t.secret).await?;
    let data = vec![3u8; 8 << 20];
    let digest = blake3::hash(&data);
    let count = 256u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut sent = 0;
    for id in 0..count {
        let payload = Payload {
            id,
            digest: Buffer::new(),
            data: Buffer::new(),
            prepare_seconds: 0.0,
        };
        let mut m = msg(
            &payload,
            vec![
                Descriptor::Inline { len: 32 },
                Descriptor::Inline { len: data.len() as u64 },
            ],
        );
        m.extend_from_slice(digest.as_bytes());
        m.extend_from_slice(&data);
        match tokio::time::timeout_at(deadline, raw.write(&m)).await {
            Ok(Ok(())) => sent += 1,
            _ => break,
        }
    }
    f.check(
        sent < count,
        format!("{sent} of {count} payloads of 8 MiB went out in 5 s: the victim read only what its bounds hold"),
    );
    Ok(())
}
