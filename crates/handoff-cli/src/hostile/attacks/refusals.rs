//! Class 8: a flood of requests the victim must refuse, and how it refuses them.

use std::time::Duration;

use anyhow::Result;
use handoff::wire::{Header, Limits, TicketOp};

use super::common::{Findings, Target};
use crate::hostile::raw::{framed, Identity, Raw};

pub(super) async fn refusal_flood(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("refusal-flood"), &t.secret).await?;
    let count = 100_000u64;
    let reading = {
        // Read the refusals as they come (a peer that reads nothing is another attack).
        let Raw { stream, peer, seen } = raw;
        let (mut reader, writer) = split(stream);
        let counter = tokio::spawn(async move {
            let mut refused = 0u64;
            while refused < count {
                match tokio::time::timeout(Duration::from_secs(10), read_refusal(&mut reader)).await {
                    Ok(Ok(true)) => refused += 1,
                    Ok(Ok(false)) => {}
                    _ => break,
                }
            }
            refused
        });
        raw = Raw {
            stream: writer,
            peer,
            seen,
        };
        counter
    };
    let mut batch = Vec::with_capacity(1 << 20);
    for req in 0..count {
        let pull = TicketOp::Pull {
            req,
            lease: 1_000_000 + req,
            token: vec![1; 32],
            offset: 0,
            len: 1,
        };
        batch.extend_from_slice(&framed(&Header::Ticket(pull)));
        if batch.len() > 512 << 10 {
            raw.write(&batch).await?;
            batch.clear();
        }
    }
    raw.write(&batch).await?;
    let refused = reading.await.unwrap_or(0);
    f.check(
        refused == count,
        format!("{refused} of {count} bad pulls were refused with ticket-error, the connection kept"),
    );
    Ok(())
}

/// Splits a raw stream into a read half (TCP only here) and the writing `Stream`.
fn split(stream: crate::hostile::raw::Stream) -> (tokio::net::tcp::OwnedReadHalf, crate::hostile::raw::Stream) {
    match stream {
        crate::hostile::raw::Stream::Tcp(s) => {
            let (r, w) = s.into_split();
            (r, crate::hostile::raw::Stream::TcpWrite(w))
        }
        crate::hostile::raw::Stream::Unix(_) | crate::hostile::raw::Stream::TcpWrite(_) => unreachable!("TCP only"),
    }
}

/// Reads one header; whether it is a `ticket-error`.
async fn read_refusal(r: &mut tokio::net::tcp::OwnedReadHalf) -> Result<bool> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    r.read_exact(&mut len).await?;
    let mut h = vec![0u8; u32::from_be_bytes(len) as usize];
    r.read_exact(&mut h).await?;
    Ok(matches!(
        Header::decode(&h, &Limits::default())?,
        Header::Ticket(TicketOp::Refused { .. })
    ))
}
