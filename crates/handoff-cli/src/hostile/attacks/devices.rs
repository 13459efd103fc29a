//! Class 1: GPU memory (spec §7.10) named where it must not be, or by a handle that opens
//! nothing. A victim that did not announce `cuda` refuses the frame, on either channel; one
//! that did (a Python node with a CUDA driver) cannot open a made-up handle, pulls the bytes
//! from us, and lives on when we refuse them.

use std::time::Duration;

use anyhow::{Context, Result};
use handoff::wire::{Descriptor, DeviceClaim, Header, TicketOp};

use super::common::{blob, next_ticket_op, served, Findings, Target};
use crate::hostile::raw::{framed, Identity, Raw};

/// A claim on 1 MiB of GPU memory that no driver will open: a handle of no allocation, on a
/// device no machine has.
fn made_up() -> Descriptor {
    Descriptor::Cuda(DeviceClaim {
        len: 1 << 20,
        offset: 0,
        lease: 1,
        token: vec![7; 32],
        ipc: [0x5a; 64],
        device: [0xee; 16],
    })
}

pub(super) async fn gpu_handles(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("gpu-tcp"), &t.secret).await?;
    raw.write(&blob(1, made_up())).await?;
    let answer = raw.error_before_close(Duration::from_secs(10)).await;
    f.check(
        answer
            .as_ref()
            .is_some_and(|(code, _)| code == "unsupported-descriptor"),
        format!("a cuda frame over TCP: refused with unsupported-descriptor (got {answer:?})"),
    );
    let Some(unix) = t.unix.as_deref() else {
        return Ok(());
    };
    let mut raw = Raw::unix_handshaken(unix, &Identity::fresh("gpu-unix"), &t.secret).await?;
    let announced = raw
        .peer
        .as_ref()
        .is_some_and(|i| i.capabilities.iter().any(|c| c == handoff::wire::CAP_CUDA));
    raw.write(&blob(2, made_up())).await?;
    if !announced {
        let answer = raw.error_before_close(Duration::from_secs(10)).await;
        f.check(
            answer
                .as_ref()
                .is_some_and(|(code, _)| code == "unsupported-descriptor"),
            format!("a cuda frame to a node without `cuda`: refused with unsupported-descriptor (got {answer:?})"),
        );
        return Ok(());
    }
    let op = tokio::time::timeout(Duration::from_secs(10), next_ticket_op(&mut raw))
        .await
        .context("the victim neither mapped nor pulled the frame")??;
    let pulled = matches!(op, TicketOp::Pull { lease: 1, .. });
    f.check(
        pulled,
        format!("a handle that opens nothing: the victim pulls the bytes (got {op:?})"),
    );
    if let TicketOp::Pull { req, .. } = op {
        let refusal = TicketOp::Refused {
            req,
            code: "device-error".into(),
            message: "no such memory".into(),
        };
        raw.write(&framed(&Header::Ticket(refusal))).await?;
    }
    f.check(
        served(&mut raw, 3).await,
        "after its pull was refused, the victim still serves this connection",
    );
    Ok(())
}
