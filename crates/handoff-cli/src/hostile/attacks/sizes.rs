//! Class 3: sizes in headers and descriptors far beyond what was sent or allowed.

use std::time::Duration;

use anyhow::Result;
use handoff::Message;

use super::common::{answer_of, msg, rmp_decode, Findings, Target};
use crate::hostile::raw::{Identity, Raw};
use crate::protocol::{Issue, Payload, RawSend, SendRequest};

pub(super) async fn huge_sizes(t: &Target, f: &mut Findings) -> Result<()> {
    let mut raw = Raw::tcp_handshaken(&t.listen, &Identity::fresh("huge-sizes"), &t.secret).await?;
    for bytes in [1u64 << 50, u64::MAX, t.bounds.max_request + 1] {
        raw.write(&msg(&SendRequest { id: 1, bytes }, vec![])).await?;
        if t.kind == crate::hostile::victim::Kind::Python {
            // The Python worker serves neither RawSend nor chaos.Issue (unknown-type would
            // close the connection).
            continue;
        }
        raw.write(&msg(
            &RawSend {
                addr: "127.0.0.1:9".into(),
                bytes,
            },
            vec![],
        ))
        .await?;
        raw.write(&msg(
            &Issue {
                id: 2,
                bytes,
                to: "nobody".into(),
                forward_to: None,
                leak: false,
            },
            vec![],
        ))
        .await?;
    }
    raw.write(&msg(&SendRequest { id: 3, bytes: 1024 }, vec![])).await?;
    let answer = tokio::time::timeout(Duration::from_secs(10), answer_of(&mut raw, Payload::TYPE_NAME)).await;
    let id = match answer {
        Ok(Ok((body, _))) => rmp_decode::<PayloadId>(&body).map(|p| p.id).ok(),
        _ => None,
    };
    f.check(
        id == Some(3),
        format!("after requests for 2^50, 2^64-1 and limit+1 bytes, a 1 KiB request is answered (got payload {id:?})"),
    );
    Ok(())
}

#[derive(serde::Deserialize)]
struct PayloadId {
    id: u64,
}
