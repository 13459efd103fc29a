//! The holder's side of tickets: our requests (pulls, forwards) waiting on one connection
//! for the owner's answer, each with what it asked for, so that an answer is checked against
//! its request before any of it is read (spec §6.7, §9.1).
//!
//! The table holds a driver's waiter for each request (a tokio driver's is a oneshot
//! sender) and neither locks nor waits. It grows only with this node's own requests.

use std::collections::HashMap;

use bytes::Bytes;
use handoff_wire::{TicketClaim, TicketDigest, TicketOp};

use crate::receive::Asked;

/// How errors and logs name the owner of a ticket this node holds: `name (addr)` when the
/// owner is connected (`owner_name`) and the ticket carries its address, `name` without
/// one; a node not connected is named by the first 12 characters of its id (`id (addr)`),
/// or by its whole id without an address. Both drivers name owners so.
pub fn owner_label(claim: &TicketClaim, owner_name: Option<&str>) -> String {
    // (An empty address is none: the wire lets a ticket carry one.)
    match (owner_name, claim.addr.as_deref().filter(|a| !a.is_empty())) {
        (Some(name), Some(addr)) => format!("{name} ({addr})"),
        (Some(name), None) => name.to_string(),
        (None, Some(addr)) => format!("{} ({addr})", claim.owner.chars().take(12).collect::<String>()),
        (None, None) => claim.owner.clone(),
    }
}

/// What a holder asks a ticket's owner for and waits to be answered (spec §7.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask<'a> {
    /// `len` bytes from `offset` of the buffer; `hash`: their BLAKE3 as they arrive.
    Pull {
        /// Where the bytes start.
        offset: u64,
        /// How many.
        len: u64,
        /// Hash them while they arrive.
        hash: bool,
    },
    /// A hold for node `to` (its token is the answer).
    Forward {
        /// The node id of the new holder.
        to: &'a str,
    },
}

impl Ask<'_> {
    /// The request's name, as errors and logs say it.
    pub fn what(&self) -> &'static str {
        match self {
            Ask::Pull { .. } => "pull",
            Ask::Forward { .. } => "forward",
        }
    }

    /// What its answer is checked against ([`Requests::insert`]).
    pub fn asked(&self) -> Asked {
        match *self {
            Ask::Pull { len, hash, .. } => Asked { len: Some(len), hash },
            Ask::Forward { .. } => Asked { len: None, hash: false },
        }
    }

    /// The `ticket` header's operation that asks it about `claim`, as request `req`.
    pub fn op(&self, req: u64, claim: &TicketClaim) -> TicketOp {
        let (lease, token) = (claim.lease, claim.token.clone());
        match *self {
            Ask::Pull { offset, len, .. } => TicketOp::Pull {
                req,
                lease,
                token,
                offset,
                len,
            },
            Ask::Forward { to } => TicketOp::Forward {
                req,
                lease,
                token,
                to: to.to_string(),
            },
        }
    }
}

/// The operation that extends the hold `claim` proves by the lease's ttl (no answer).
pub fn renew_op(claim: &TicketClaim) -> TicketOp {
    TicketOp::Renew {
        lease: claim.lease,
        token: claim.token.clone(),
    }
}

/// The operation that ends the hold `claim` proves (no answer; its last handle was dropped).
pub fn unlease_op(claim: &TicketClaim) -> TicketOp {
    TicketOp::Unlease {
        lease: claim.lease,
        token: claim.token.clone(),
    }
}

/// Whether a full redemption against `want` asks the owner's bytes to be hashed as they
/// arrive: BLAKE3 is (on a helper thread); XXH3 is checked after, at memory speed.
pub fn hash_while_pulling(want: TicketDigest) -> bool {
    matches!(want, TicketDigest::Blake3(_))
}

/// Whether the `bytes` of a full redemption match the ticket's digest `want` (§7.5),
/// `hashed` being their BLAKE3 if it was computed as they arrived.
pub fn redeemed_intact(want: TicketDigest, bytes: &[u8], hashed: Option<[u8; 32]>) -> bool {
    let got = match hashed {
        Some(d) if hash_while_pulling(want) => TicketDigest::Blake3(d),
        _ => want.same_kind_of(bytes),
    };
    got == want
}

/// An owner's answer to one of our requests, as the connection hands it to the request.
#[derive(Debug)]
pub enum Answer {
    /// Pulled bytes (and their BLAKE3, when asked for).
    Bytes(Bytes, Option<[u8; 32]>),
    /// A new holder's token (the answer to a forward).
    Token(Vec<u8>),
    /// An answer that does not fit the request (bytes of another length, bytes to a
    /// forward): read past and dropped; says what came.
    Mismatch(String),
}

impl Answer {
    /// The bytes a pull of `len` asked for (with their digest, if asked), or what came
    /// instead.
    pub fn into_pulled(self, len: u64) -> Result<(Bytes, Option<[u8; 32]>), String> {
        match self {
            Answer::Bytes(b, digest) if b.len() as u64 == len => Ok((b, digest)),
            Answer::Bytes(b, _) => Err(format!("asked for {len} bytes, got {}", b.len())),
            Answer::Token(_) => Err("answered a pull with a token".into()),
            Answer::Mismatch(why) => Err(why),
        }
    }

    /// The token a forward asked for, or what came instead.
    pub fn into_token(self) -> Result<Vec<u8>, String> {
        match self {
            Answer::Token(token) => Ok(token),
            Answer::Bytes(..) => Err("answered a forward with bytes".into()),
            Answer::Mismatch(why) => Err(why),
        }
    }
}

/// Requests of ours waiting for answers on one connection, by request id.
#[derive(Debug)]
pub struct Requests<T> {
    waiting: HashMap<u64, (Asked, T)>,
}

impl<T> Default for Requests<T> {
    fn default() -> Self {
        Requests {
            waiting: HashMap::new(),
        }
    }
}

impl<T> Requests<T> {
    /// Records request `req`, which asked for `asked`, with the waiter its answer goes to.
    pub fn insert(&mut self, req: u64, asked: Asked, waiter: T) {
        self.waiting.insert(req, (asked, waiter));
    }

    /// What request `req` asked for, while it waits.
    pub fn asked(&self, req: u64) -> Option<Asked> {
        self.waiting.get(&req).map(|(asked, _)| *asked)
    }

    /// Ends request `req` (answered, given up or not sent); its waiter, if it still waited.
    pub fn complete(&mut self, req: u64) -> Option<T> {
        self.waiting.remove(&req).map(|(_, waiter)| waiter)
    }

    /// Whether no request waits (then no answer is owed on the connection).
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Ends every request (the connection closed): dropping the waiters tells them.
    pub fn clear(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_fits_its_request_or_says_what_came() {
        let bytes = || Answer::Bytes(Bytes::from_static(b"abc"), None);
        assert_eq!(bytes().into_pulled(3).unwrap().0, Bytes::from_static(b"abc"));
        assert_eq!(bytes().into_pulled(4).unwrap_err(), "asked for 4 bytes, got 3");
        assert_eq!(bytes().into_token().unwrap_err(), "answered a forward with bytes");
        assert_eq!(Answer::Token(vec![1]).into_token().unwrap(), vec![1]);
        assert!(Answer::Token(vec![1]).into_pulled(1).is_err());
        assert_eq!(Answer::Mismatch("why".into()).into_pulled(1).unwrap_err(), "why");
    }

    #[test]
    fn each_request_asks_the_owner_about_its_claim_with_its_token() {
        let claim = TicketClaim {
            len: 9,
            owner: "o".into(),
            addr: None,
            lease: 5,
            token: vec![7; 32],
            digest: TicketDigest::blake3_of(b"x"),
            ttl_ms: 1,
            lazy: false,
        };
        let pull = Ask::Pull {
            offset: 2,
            len: 3,
            hash: true,
        };
        assert_eq!(
            (pull.what(), pull.asked()),
            (
                "pull",
                Asked {
                    len: Some(3),
                    hash: true
                }
            )
        );
        assert!(
            matches!(pull.op(4, &claim), TicketOp::Pull { req: 4, lease: 5, offset: 2, len: 3, ref token } if token == &claim.token)
        );
        let fwd = Ask::Forward { to: "n" };
        assert_eq!((fwd.what(), fwd.asked()), ("forward", Asked { len: None, hash: false }));
        assert!(matches!(fwd.op(6, &claim), TicketOp::Forward { req: 6, lease: 5, ref to, .. } if to == "n"));
        assert!(matches!(renew_op(&claim), TicketOp::Renew { lease: 5, .. }));
        assert!(matches!(unlease_op(&claim), TicketOp::Unlease { lease: 5, .. }));
    }

    #[test]
    fn a_redemption_is_checked_against_the_digest_of_its_kind() {
        let b3 = TicketDigest::blake3_of(b"abc");
        assert!(hash_while_pulling(b3));
        assert!(redeemed_intact(b3, b"abc", None));
        assert!(!redeemed_intact(b3, b"abd", None));
        let TicketDigest::Blake3(d) = b3 else { unreachable!() };
        assert!(redeemed_intact(b3, b"ignored: hashed as it came", Some(d)));
        let x = TicketDigest::xxh3_of(b"abc");
        assert!(!hash_while_pulling(x));
        assert!(redeemed_intact(x, b"abc", Some([0; 32])));
        assert!(!redeemed_intact(x, b"abd", None));
    }

    #[test]
    fn an_owner_is_named_by_its_name_or_id_and_its_address() {
        let claim = |addr: Option<&str>| TicketClaim {
            len: 1,
            owner: "0123456789abcdef0123456789abcdef".into(),
            addr: addr.map(str::to_string),
            lease: 1,
            token: vec![0; 32],
            digest: handoff_wire::TicketDigest::Blake3([0; 32]),
            ttl_ms: 1,
            lazy: false,
        };
        let at = Some("tcp://10.0.0.1:7000");
        assert_eq!(owner_label(&claim(at), Some("rs-a")), "rs-a (tcp://10.0.0.1:7000)");
        assert_eq!(owner_label(&claim(None), Some("rs-a")), "rs-a");
        assert_eq!(owner_label(&claim(at), None), "0123456789ab (tcp://10.0.0.1:7000)");
        assert_eq!(owner_label(&claim(None), None), "0123456789abcdef0123456789abcdef");
        assert_eq!(owner_label(&claim(Some("")), Some("rs-a")), "rs-a");
    }

    #[test]
    fn an_answer_finds_its_request_once() {
        let mut r = Requests::default();
        let pull = Asked {
            len: Some(10),
            hash: true,
        };
        r.insert(7, pull, "waiter");
        assert_eq!(r.asked(7), Some(pull));
        assert_eq!(r.asked(8), None);
        assert_eq!(r.complete(7), Some("waiter"));
        assert_eq!(r.complete(7), None, "a late second answer finds nobody");
        assert!(r.is_empty());
    }
}
