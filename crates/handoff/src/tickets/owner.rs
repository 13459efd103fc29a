//! The owner's side of tickets: the engine's lease table (`handoff_proto::ticket_leases`),
//! and the wait for room in it when a node is configured to wait ([`WhenFull::Wait`]).

use std::ops::Deref;
use std::sync::Arc;

use handoff_proto::ticket_leases;
pub(crate) use handoff_proto::ticket_leases::Issued;
pub use handoff_proto::ticket_leases::{LeaseConfig, LeaseTableStats, WhenFull};
use handoff_wire::Buffer;
use tokio::sync::Notify;

use crate::Result;

/// The node's ticket leases and what wakes an issue waiting for room.
pub(crate) struct LeaseTable {
    /// Shared with each connection's engine, which answers holders' requests from it.
    pub(crate) table: Arc<ticket_leases::LeaseTable>,
    changed: Arc<Notify>,
}

impl LeaseTable {
    /// Waits, the tokio way, for room in `table` (a node's, `NodeCore::leases`).
    pub(crate) fn over(table: Arc<ticket_leases::LeaseTable>) -> LeaseTable {
        let changed = Arc::new(Notify::new());
        let wake = changed.clone();
        table.set_waker(Box::new(move || wake.notify_waiters()));
        LeaseTable { table, changed }
    }

    /// Issues a lease on `buffer` to `holder`; when the caps leave no room, waits for it as
    /// configured, then fails with [`Error::LeaseCap`].
    pub(crate) async fn issue(
        &self,
        buffer: &Buffer,
        known_digest: Option<[u8; 32]>,
        holder_takes_xxh3: bool,
        holder: &str,
        holder_name: &str,
    ) -> Result<Issued> {
        let digest = ticket_leases::LeaseTable::digest_for(buffer, known_digest, holder_takes_xxh3);
        let attempt = || self.table.try_issue(buffer, digest, holder);
        let when_full = self.table.config.when_full;
        crate::wait::for_lease(&self.changed, when_full, holder_name, buffer.len() as u64, attempt).await
    }
}

impl LeaseTable {
    /// Issues a lease on device memory to `holder` (spec §7.10), waiting for room as
    /// [`issue`](Self::issue) does: its id and the holder's token.
    pub(crate) async fn issue_device(
        &self,
        memory: Arc<dyn ticket_leases::DeviceBytes>,
        holder: &str,
        holder_name: &str,
    ) -> Result<(u64, [u8; 32])> {
        let len = memory.len();
        let attempt = || self.table.try_issue_device(memory.clone(), holder);
        let when_full = self.table.config.when_full;
        crate::wait::for_lease(&self.changed, when_full, holder_name, len, attempt).await
    }
}

impl Deref for LeaseTable {
    type Target = ticket_leases::LeaseTable;

    fn deref(&self) -> &ticket_leases::LeaseTable {
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const B: &str = "0000000000000000000000000000000b";

    fn table(config: LeaseConfig) -> LeaseTable {
        LeaseTable::over(Arc::new(ticket_leases::LeaseTable::new(config, 3)))
    }

    #[tokio::test]
    async fn an_issue_waits_for_room_or_fails() {
        let config = |when_full| LeaseConfig {
            ttl: Duration::from_secs(60),
            max_bytes: 100,
            max_bytes_per_peer: 100,
            when_full,
        };
        let t = Arc::new(table(config(WhenFull::Wait(Duration::from_secs(5)))));
        let buf = Buffer::from(vec![1u8; 80]);
        let first = t.issue(&buf, None, false, B, B).await.unwrap();
        let t2 = t.clone();
        let b2 = buf.clone();
        let waiting = tokio::spawn(async move { t2.issue(&b2, None, false, B, B).await.map(|i| i.lease) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the second lease waits for room");
        t.unlease(first.lease, B, &first.token).unwrap();
        waiting.await.unwrap().unwrap();

        let failing = table(config(WhenFull::Fail));
        failing.issue(&buf, None, false, B, B).await.unwrap();
        let err = failing.issue(&buf, None, false, B, B).await.unwrap_err();
        assert!(err.to_string().contains("80 of 100 bytes"), "{err}");
    }
}
