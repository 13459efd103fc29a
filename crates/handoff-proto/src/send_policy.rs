//! The sender's decisions about a message, with no I/O: which of its frames travel as
//! tickets (spec §7.5, §7.8), and the claim a receiver gets for a lease issued to it.
//!
//! A driver asks [`TicketPolicy::plan`] about each frame, then carries the answer out:
//! it sends the bytes, redeems a held ticket, asks the owner to forward one, or issues a
//! lease in its [`LeaseTable`](crate::ticket_leases::LeaseTable) and sends
//! [`issued_claim`].

use std::time::Duration;

use handoff_wire::{Channel, DeviceClaim, Endpoint, TicketClaim, CAP_CUDA, CAP_XXH3};

use crate::ticket_leases::Issued;

/// What the policy needs to know about one frame.
#[derive(Debug, Clone, Copy)]
pub enum Frame<'a> {
    /// Bytes of this node's.
    Bytes {
        /// Their length.
        len: usize,
        /// Marked to travel only as an on-demand ticket (pulled on first use).
        on_demand: bool,
    },
    /// A ticket this node holds on another node's buffer.
    Held(&'a TicketClaim),
    /// This node's device memory (spec §7.10).
    Device,
}

/// How one frame travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramePlan {
    /// The bytes travel with the message.
    Bytes,
    /// The held ticket is redeemed and its bytes travel: it goes back to its owner, to a
    /// peer that takes no tickets, or to one that would refuse its digest's kind (§7.8).
    RedeemHeld,
    /// The owner registers the receiver as a holder first, and the receiver's claim travels.
    ForwardHeld,
    /// Device memory is named by its IPC handle and leased to the receiver: a `cuda` frame
    /// travels (a same-host receiver on a Unix socket that announced `cuda` and `ticket`).
    ShareDevice,
    /// Device memory is copied to the host, and the copy travels as bytes would.
    CopyDevice,
    /// The bytes are leased to the receiver and a ticket travels.
    Issue {
        /// The receiver pulls only when the bytes are used (an on-demand frame).
        lazy: bool,
        /// The receiver takes an XXH3 digest (spec §7.8).
        xxh3: bool,
    },
}

/// The ticket policy of one send.
#[derive(Debug, Clone, Copy)]
pub struct TicketPolicy<'a> {
    /// The receiving node, as its handshake described it.
    pub receiver: &'a Endpoint,
    /// The channel the message takes.
    pub channel: Channel,
    /// Over TCP, frames at least this large go as tickets (`None`: only when asked).
    pub threshold: Option<usize>,
    /// Every non-empty frame goes as a ticket (a send by ticket).
    pub by_ticket: bool,
}

impl TicketPolicy<'_> {
    /// Whether the receiver announced `ticket`: one that did not gets bytes, never tickets.
    pub fn receiver_takes_tickets(&self) -> bool {
        self.receiver.has_capability("ticket")
    }

    /// How `frame` travels.
    pub fn plan(&self, frame: Frame<'_>) -> FramePlan {
        let takes_tickets = self.receiver_takes_tickets();
        match frame {
            Frame::Device => {
                let shares = self.channel == Channel::Shm && takes_tickets && self.receiver.has_capability(CAP_CUDA);
                if shares {
                    FramePlan::ShareDevice
                } else {
                    FramePlan::CopyDevice
                }
            }
            Frame::Held(claim) => {
                let digest_ok = claim.digest.sendable_to(&self.receiver.capabilities);
                if claim.owner == self.receiver.node_id || !takes_tickets || !digest_ok {
                    FramePlan::RedeemHeld
                } else {
                    FramePlan::ForwardHeld
                }
            }
            Frame::Bytes { len, on_demand } => {
                let large = self.channel == Channel::Tcp && self.threshold.is_some_and(|t| len >= t);
                if (self.by_ticket || on_demand || large) && takes_tickets && len > 0 {
                    FramePlan::Issue {
                        lazy: on_demand,
                        xxh3: self.receiver.has_capability(CAP_XXH3),
                    }
                } else {
                    FramePlan::Bytes
                }
            }
        }
    }
}

/// The claim a receiver gets for `issued`, a lease on `len` bytes of node `owner`'s, which
/// listens at `addr` (if anywhere) and keeps a hold for `ttl` unless renewed.
pub fn issued_claim(
    issued: &Issued,
    len: u64,
    owner: &str,
    addr: Option<String>,
    ttl: Duration,
    lazy: bool,
) -> TicketClaim {
    TicketClaim {
        len,
        owner: owner.to_string(),
        addr,
        lease: issued.lease,
        token: issued.token.to_vec(),
        digest: issued.digest,
        ttl_ms: ttl.as_millis() as u64,
        lazy,
    }
}

/// The `cuda` claim a receiver gets for lease `lease` (token `token`) on `len` bytes of
/// device memory at `offset` of the allocation that `ipc` names on `device` (spec §7.10).
pub fn device_claim(
    lease: u64,
    token: [u8; 32],
    len: u64,
    ipc: [u8; 64],
    device: [u8; 16],
    offset: u64,
) -> DeviceClaim {
    DeviceClaim {
        len,
        offset,
        lease,
        token: token.to_vec(),
        ipc,
        device,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_wire::TicketDigest;

    fn endpoint(id: &str, caps: &[&str]) -> Endpoint {
        Endpoint {
            node_id: id.into(),
            name: id.into(),
            host_id: "h".into(),
            process_id: "p".into(),
            language: "rust".into(),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn claim(owner: &str, digest: TicketDigest) -> TicketClaim {
        TicketClaim {
            len: 10,
            owner: owner.into(),
            addr: None,
            lease: 1,
            token: vec![0; 32],
            digest,
            ttl_ms: 1000,
            lazy: false,
        }
    }

    #[test]
    fn large_frames_go_as_tickets_over_tcp_only_to_a_peer_that_takes_them() {
        let taker = endpoint("b", &["ticket", CAP_XXH3]);
        let policy = TicketPolicy {
            receiver: &taker,
            channel: Channel::Tcp,
            threshold: Some(100),
            by_ticket: false,
        };
        let bytes = |len| Frame::Bytes { len, on_demand: false };
        assert_eq!(policy.plan(bytes(99)), FramePlan::Bytes);
        assert_eq!(
            policy.plan(bytes(100)),
            FramePlan::Issue {
                lazy: false,
                xxh3: true
            }
        );
        let shm = TicketPolicy {
            channel: Channel::Shm,
            ..policy
        };
        assert_eq!(shm.plan(bytes(1000)), FramePlan::Bytes, "shm has its own route");
        let plain = endpoint("b", &["inline"]);
        let refuser = TicketPolicy {
            receiver: &plain,
            by_ticket: true,
            ..policy
        };
        assert_eq!(refuser.plan(bytes(1000)), FramePlan::Bytes);
        assert_eq!(
            refuser.plan(Frame::Bytes {
                len: 5,
                on_demand: true
            }),
            FramePlan::Bytes,
            "no tickets at all to a peer without them"
        );
    }

    #[test]
    fn by_ticket_and_on_demand_frames_are_leased_but_never_empty_ones() {
        let taker = endpoint("b", &["ticket"]);
        let policy = TicketPolicy {
            receiver: &taker,
            channel: Channel::Shm,
            threshold: None,
            by_ticket: true,
        };
        assert_eq!(
            policy.plan(Frame::Bytes {
                len: 1,
                on_demand: false
            }),
            FramePlan::Issue {
                lazy: false,
                xxh3: false
            }
        );
        assert_eq!(
            policy.plan(Frame::Bytes {
                len: 0,
                on_demand: false
            }),
            FramePlan::Bytes
        );
        let lazy = TicketPolicy {
            by_ticket: false,
            ..policy
        };
        assert_eq!(
            lazy.plan(Frame::Bytes {
                len: 1,
                on_demand: true
            }),
            FramePlan::Issue {
                lazy: true,
                xxh3: false
            }
        );
    }

    #[test]
    fn a_held_ticket_is_forwarded_unless_it_goes_home_or_would_be_refused() {
        let taker = endpoint("b", &["ticket"]);
        let policy = TicketPolicy {
            receiver: &taker,
            channel: Channel::Tcp,
            threshold: None,
            by_ticket: false,
        };
        let blake3 = TicketDigest::Blake3([0; 32]);
        assert_eq!(policy.plan(Frame::Held(&claim("a", blake3))), FramePlan::ForwardHeld);
        assert_eq!(policy.plan(Frame::Held(&claim("b", blake3))), FramePlan::RedeemHeld);
        let xxh3 = TicketDigest::Xxh3([0; 16]);
        assert_eq!(
            policy.plan(Frame::Held(&claim("a", xxh3))),
            FramePlan::RedeemHeld,
            "a peer without xxh3 would refuse the claim (§7.8)"
        );
        let plain = endpoint("b", &["inline"]);
        let refuser = TicketPolicy {
            receiver: &plain,
            ..policy
        };
        assert_eq!(
            refuser.plan(Frame::Held(&claim("a", TicketDigest::Blake3([0; 32])))),
            FramePlan::RedeemHeld
        );
    }

    #[test]
    fn device_memory_is_shared_only_on_a_unix_socket_with_a_peer_that_opens_handles() {
        let plan = |caps: &[&str], channel| {
            let receiver = endpoint("b", caps);
            TicketPolicy {
                receiver: &receiver,
                channel,
                threshold: None,
                by_ticket: false,
            }
            .plan(Frame::Device)
        };
        assert_eq!(plan(&["ticket", "cuda"], Channel::Shm), FramePlan::ShareDevice);
        // Another host (TCP), a peer without a driver, or one that takes no tickets: a copy.
        assert_eq!(plan(&["ticket", "cuda"], Channel::Tcp), FramePlan::CopyDevice);
        assert_eq!(plan(&["ticket"], Channel::Shm), FramePlan::CopyDevice);
        assert_eq!(plan(&["cuda"], Channel::Shm), FramePlan::CopyDevice);
    }
}
