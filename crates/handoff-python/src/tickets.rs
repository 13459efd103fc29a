//! Tickets for connections driven from Python's event loop (spec §7.5–§7.9): the claims
//! this node holds on other nodes' buffers ([`Ticket`]), and the end of each hold when its
//! last handle is dropped. The owner's side (the lease table, its answers) is the engine's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use handoff_wire::{TicketClaim, TicketDigest};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::engine::Shared;
use crate::frames::Frame;

/// A ticket: a claim on bytes another node owns, valid for the node it was issued to.
///
/// A received ticket is this node's hold: when its last handle is dropped, the owner is told
/// (`unlease`). A claim made for another node (a forward's answer) is sent to that node as
/// it is, and its hold is that node's.
#[pyclass(frozen, module = "handoff._native")]
pub struct Ticket {
    pub(crate) claim: TicketClaim,
    /// The node the claim was issued to (its token is that node's).
    pub(crate) holder: String,
    /// This node's engine, when the hold is ours (ended on drop).
    ours: Option<Weak<Shared>>,
    /// The hold was ended ([`Ticket::release`]): the drop says nothing more.
    ended: AtomicBool,
}

impl Ticket {
    /// A claim this node received: its hold ends when the last handle is dropped.
    pub(crate) fn held(claim: TicketClaim, shared: &Arc<Shared>) -> Ticket {
        // Counted until it ends, so that the connection to its owner is kept meanwhile
        // (spec §9.1).
        shared.hold(&claim);
        Ticket {
            holder: shared.me.node_id.clone(),
            claim,
            ours: Some(Arc::downgrade(shared)),
            ended: AtomicBool::new(false),
        }
    }

    /// A claim for node `holder` (a forward's answer), to send to it.
    pub(crate) fn for_node(claim: TicketClaim, holder: &str) -> Ticket {
        Ticket {
            claim,
            holder: holder.to_string(),
            ours: None,
            ended: AtomicBool::new(false),
        }
    }

    /// Ends this node's hold once: the owner is told (`unlease`) by the driver.
    fn end_hold(&self) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(shared) = self.ours.as_ref().and_then(Weak::upgrade) else {
            return;
        };
        // Bounded: past so many unsent, a hold ends by its ttl at the owner instead.
        if shared.end_hold(&self.claim) {
            shared.wake.signal();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.end_hold();
    }
}

#[pymethods]
impl Ticket {
    /// A claim on `len` bytes of node `owner`'s lease `lease`, held by `engine`'s node with
    /// `token` (what a ticket received earlier said, kept by the application): `digest` is
    /// `("blake3", 32 bytes)` or `("xxh3", 16 bytes)`. The hold ends when the last handle
    /// is dropped, as a received ticket's.
    #[staticmethod]
    #[pyo3(signature = (engine, len, owner, lease, token, digest, ttl_ms, addr=None, lazy=false))]
    #[allow(clippy::too_many_arguments)]
    fn claim(
        engine: &Bound<'_, crate::engine::Engine>,
        len: u64,
        owner: String,
        lease: u64,
        token: Vec<u8>,
        digest: (String, Vec<u8>),
        ttl_ms: u64,
        addr: Option<String>,
        lazy: bool,
    ) -> PyResult<Ticket> {
        let bad = |why: String| pyo3::exceptions::PyValueError::new_err(why);
        let digest = match (digest.0.as_str(), digest.1.len()) {
            ("blake3", 32) => TicketDigest::Blake3(digest.1.try_into().expect("32 bytes")),
            ("xxh3", 16) => TicketDigest::Xxh3(digest.1.try_into().expect("16 bytes")),
            (kind, n) => {
                return Err(bad(format!(
                    "a ticket's digest is blake3 (32 bytes) or xxh3 (16), not {kind} of {n}"
                )))
            }
        };
        if token.len() != 32 {
            return Err(bad(format!("a ticket's token has 32 bytes, not {}", token.len())));
        }
        let claim = TicketClaim {
            len,
            owner,
            addr,
            lease,
            token,
            digest,
            ttl_ms,
            lazy,
        };
        Ok(Ticket::held(claim, &engine.get().shared))
    }

    /// Ends this node's hold now (`unlease`), whatever still refers to the ticket; the
    /// owner refuses later requests with it.
    fn release(&self) {
        self.end_hold();
    }

    /// Whether the hold was ended by [`release`](Ticket::release).
    #[getter]
    fn released(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The token that proves the hold to the owner (32 bytes, valid only for `holder`).
    #[getter]
    fn token<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.claim.token)
    }

    /// Milliseconds the hold lasts unless renewed.
    #[getter]
    fn ttl_ms(&self) -> u64 {
        self.claim.ttl_ms
    }

    /// Length of the owner's buffer.
    #[getter]
    fn len(&self) -> u64 {
        self.claim.len
    }

    fn __len__(&self) -> usize {
        self.claim.len as usize
    }

    /// The owner's node id.
    #[getter]
    fn owner(&self) -> &str {
        &self.claim.owner
    }

    /// How errors name the owner: `owner_name` is its name if it is connected
    /// (`handoff_proto::ticket_requests::owner_label`, as the Rust node names it).
    #[pyo3(signature = (owner_name=None))]
    fn owner_label(&self, owner_name: Option<&str>) -> String {
        handoff_proto::ticket_requests::owner_label(&self.claim, owner_name)
    }

    /// Where the owner listens, for a holder not connected to it.
    #[getter]
    fn addr(&self) -> Option<&str> {
        self.claim.addr.as_deref()
    }

    /// The owner's lease id.
    #[getter]
    fn lease(&self) -> u64 {
        self.claim.lease
    }

    /// The node the claim is for.
    #[getter]
    fn holder(&self) -> &str {
        &self.holder
    }

    /// Whether the sender asked for the bytes to be pulled only on use.
    #[getter]
    fn lazy(&self) -> bool {
        self.claim.lazy
    }

    /// `("blake3" | "xxh3", digest)`: what a full redemption is checked against (§7.5).
    #[getter]
    fn digest<'py>(&self, py: Python<'py>) -> (&'static str, Bound<'py, PyBytes>) {
        match self.claim.digest {
            TicketDigest::Blake3(d) => ("blake3", PyBytes::new(py, &d)),
            TicketDigest::Xxh3(d) => ("xxh3", PyBytes::new(py, &d)),
        }
    }

    /// Whether `frame` (a whole redemption) is the owner's buffer: its BLAKE3 `hashed` while
    /// it arrived, or the digest of its bytes computed now (XXH3, at memory speed).
    #[pyo3(signature = (frame, hashed=None))]
    fn verify(&self, py: Python<'_>, frame: &Bound<'_, Frame>, hashed: Option<Vec<u8>>) -> bool {
        let bytes: Bytes = frame.get().bytes().clone();
        if bytes.len() as u64 != self.claim.len {
            return false;
        }
        let want = self.claim.digest;
        match (want, hashed) {
            (TicketDigest::Blake3(d), Some(h)) => h.as_slice() == d.as_slice(),
            _ => py.detach(|| want.same_kind_of(&bytes) == want),
        }
    }

    /// Where `engine`'s node dials this ticket's owner, which it is not connected to:
    /// `(addr, None)`, or `(None, why)` when it may not (spec §9.1: the ticket's address,
    /// only a `tcp://` one and not the node's own; `handoff_proto::dialing::dial_target`).
    fn dial_target(&self, engine: &Bound<'_, crate::engine::Engine>) -> (Option<String>, Option<String>) {
        let listen = engine.get().shared.listen.clone();
        match handoff_proto::dialing::dial_target(&self.claim, listen.as_deref()) {
            Ok(addr) => (Some(addr.to_string()), None),
            Err(why) => (None, Some(why)),
        }
    }

    /// The claim node `to` gets from a forward: this ticket's, with the token the owner
    /// made for it (the answer to `Connection.request_forward`).
    fn forwarded(&self, token: Vec<u8>, to: &str) -> PyResult<Ticket> {
        if token.len() != 32 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a forward's token has 32 bytes, not {}",
                token.len()
            )));
        }
        Ok(Ticket::for_node(
            TicketClaim {
                token,
                ..self.claim.clone()
            },
            to,
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "<Ticket lease {} of {} bytes, owner {}>",
            self.claim.lease,
            self.claim.len,
            &self.claim.owner[..self.claim.owner.len().min(12)]
        )
    }
}
