//! Tickets for connections driven from Python's event loop (spec §7.5–§7.9): the claims
//! this node holds on other nodes' buffers ([`Ticket`]), and the end of each hold when its
//! last handle is dropped. The owner's side (the lease table, its answers) is the engine's.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use handoff_wire::{TicketClaim, TicketDigest};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::engine::Shared;
use crate::frames::Frame;
use crate::holds::{EndedHold, MAX_ENDED_HOLDS};

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
}

impl Ticket {
    /// A claim this node received: its hold ends when the last handle is dropped.
    pub(crate) fn held(claim: TicketClaim, shared: &Arc<Shared>) -> Ticket {
        Ticket {
            holder: shared.me.node_id.clone(),
            claim,
            ours: Some(Arc::downgrade(shared)),
        }
    }

    /// A claim for node `holder` (a forward's answer), to send to it.
    pub(crate) fn for_node(claim: TicketClaim, holder: &str) -> Ticket {
        Ticket {
            claim,
            holder: holder.to_string(),
            ours: None,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(shared) = self.ours.as_ref().and_then(Weak::upgrade) else {
            return;
        };
        let mut ended = shared.ended_holds.lock();
        // Bounded: past this many unsent, a hold ends by its ttl at the owner instead.
        if ended.len() < MAX_ENDED_HOLDS {
            ended.push(EndedHold {
                owner: self.claim.owner.clone(),
                lease: self.claim.lease,
                token: self.claim.token.clone(),
            });
        }
        drop(ended);
        shared.wake.signal();
    }
}

#[pymethods]
impl Ticket {
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
