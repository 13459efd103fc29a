//! An established connection with the requests this node sent on it: the receiving engine
//! ([`Inbound`]) plus the table of our ticket requests that wait for the owner's answer
//! ([`Requests`]), so that a driver gets each answer as the request's own: a `pulled` is
//! checked against what its request asked before any of it is read, a late or unasked one
//! is skipped, and while answers are owed the connection's bounds are raised so that a
//! message waiting for room cannot hold them back (spec §9.1).
//!
//! The table is shared (behind a lock) with whatever sends requests on the connection; the
//! waiter `W` is the driver's (a tokio driver's is a oneshot sender, the asyncio driver's a
//! request id).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use handoff_wire::{TicketOp, WireError};

use crate::inbound::{Digest, Event, Inbound, Step as InboundStep};
use crate::receive;
use crate::ticket_requests::{Answer, Requests};

/// The owner refused one of our requests (`ticket-error`, spec §7.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The error code.
    pub code: String,
    /// The owner's explanation.
    pub message: String,
}

/// What the driver does next.
pub enum Step<W> {
    /// Read from the stream into [`Established::recv_space`].
    Read,
    /// Room in the receive budget is needed: call [`Established::try_take_room`] when the
    /// budget's waker fires (and, while we ask owners for answers, every
    /// [`receive::ROOM_RECHECK`]).
    Room,
    /// Something was received (answers to our requests come as [`Step::Answer`]).
    Event(Event),
    /// The answer to our request, for its waiter.
    Answer {
        /// The request's waiter.
        waiter: W,
        /// The owner's answer, or its refusal.
        answer: Result<Answer, Refused>,
    },
    /// Pulled bytes for our request, with a digest a driver's helper may still be computing
    /// ([`Digest::Behind`]: the driver waits for it before it hands the bytes on).
    Pulled {
        /// The request's waiter.
        waiter: W,
        /// Their digest, when the request asked for one; first, so that a step dropped
        /// whole joins a helper that still reads the bytes before they go.
        digest: Digest,
        /// The bytes.
        bytes: Bytes,
    },
    /// Pulled bytes whose request gave up while they arrived: the driver drops them, after
    /// waiting for a [`Digest::Behind`] that still reads them (so that no thread of its
    /// waits on a helper).
    Unclaimed {
        /// Their digest, first: dropped before the bytes.
        digest: Digest,
        /// The bytes.
        bytes: Bytes,
    },
    /// The peer ended the stream between two messages.
    Closed,
}

/// An established connection and our requests on it (see the module's text).
pub struct Established<W> {
    inbound: Inbound,
    requests: Arc<Mutex<Requests<W>>>,
    /// The receive budget's bound on one peer's bytes: the slack while answers are owed.
    max_per_peer: u64,
}

impl<W> Established<W> {
    /// `inbound`, answering the requests of `requests`; `max_per_peer` is the receive
    /// budget's bound on one peer's bytes.
    pub fn new(inbound: Inbound, requests: Arc<Mutex<Requests<W>>>, max_per_peer: u64) -> Established<W> {
        Established {
            inbound,
            requests,
            max_per_peer,
        }
    }

    /// The receiving engine.
    pub fn inbound(&mut self) -> &mut Inbound {
        &mut self.inbound
    }

    /// When the peer's silence inside a message times out (see [`Inbound::poll_timeout`]).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.inbound.poll_timeout()
    }

    /// Where the driver reads into next.
    pub fn recv_space(&mut self) -> &mut [u8] {
        self.inbound.recv_space()
    }

    /// Whether any of our requests waits for an answer on this connection.
    pub fn asking(&self) -> bool {
        !self.requests.lock().expect("requests lock").is_empty()
    }

    /// Tries to take the room the last [`Step::Room`] needs; whether it was taken. While we
    /// wait for answers on this connection the bounds are raised by one per-peer bound (and
    /// by the peer's tickets taken ahead of their pull), so that the answers behind the
    /// waiting message arrive.
    pub fn try_take_room(&mut self, now: Instant) -> bool {
        let slack = receive::room_slack(self.asking(), self.max_per_peer, self.inbound.ticket_bytes());
        self.inbound.try_take_room(slack, now)
    }

    /// The next thing to do (see [`Step`]).
    pub fn poll(&mut self, now: Instant) -> Result<Step<W>, WireError> {
        loop {
            let event = match self.inbound.poll(now)? {
                InboundStep::Read => return Ok(Step::Read),
                InboundStep::Room { .. } => return Ok(Step::Room),
                InboundStep::Closed => return Ok(Step::Closed),
                InboundStep::CheckPulled { req, len } => {
                    let asked = self.requests.lock().expect("requests lock").asked(req);
                    self.inbound.pulled_verdict(receive::pulled(asked, len), now);
                    continue;
                }
                InboundStep::Event(event) => event,
            };
            let answered = |req: u64| self.requests.lock().expect("requests lock").complete(req);
            match event {
                Event::Pulled { req, bytes, digest } => {
                    return Ok(match answered(req) {
                        Some(waiter) => Step::Pulled { waiter, bytes, digest },
                        None => Step::Unclaimed { digest, bytes },
                    });
                }
                Event::PulledMismatch { req, why } => {
                    if let Some(waiter) = answered(req) {
                        let answer = Ok(Answer::Mismatch(why));
                        return Ok(Step::Answer { waiter, answer });
                    }
                }
                Event::Ticket(TicketOp::Forwarded { req, token }) => {
                    if let Some(waiter) = answered(req) {
                        let answer = Ok(Answer::Token(token));
                        return Ok(Step::Answer { waiter, answer });
                    }
                }
                Event::Ticket(TicketOp::Refused { req, code, message }) => {
                    if let Some(waiter) = answered(req) {
                        let answer = Err(Refused { code, message });
                        return Ok(Step::Answer { waiter, answer });
                    }
                }
                other => return Ok(Step::Event(other)),
            }
            // An answer nobody waits for any more (given up, or late): dropped.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receive::{Asked, Receiving};
    use crate::recv_buffers::RecvPool;
    use handoff_wire::framing::encode_header_into;
    use handoff_wire::{Header, Limits};
    use std::time::Duration;

    fn established(requests: &Arc<Mutex<Requests<&'static str>>>) -> Established<&'static str> {
        let inbound = Inbound::new(
            Receiving::new(Limits::DEFAULT, true),
            Arc::new(|_: &str| Ok(())),
            RecvPool::new(1 << 20),
            Duration::from_secs(30),
        );
        Established::new(inbound, requests.clone(), 1 << 20)
    }

    fn feed(e: &mut Established<&'static str>, bytes: &[u8]) {
        let space = e.recv_space();
        space[..bytes.len()].copy_from_slice(bytes);
        e.inbound().received(bytes.len(), Instant::now());
    }

    fn header(h: &Header<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode_header_into(h, &mut out);
        out
    }

    #[test]
    fn an_answer_goes_to_its_request_and_a_late_one_is_dropped() {
        let requests = Arc::new(Mutex::new(Requests::default()));
        let mut e = established(&requests);
        requests
            .lock()
            .unwrap()
            .insert(7, Asked { len: None, hash: false }, "forward 7");
        let forwarded = header(&Header::Ticket(TicketOp::Forwarded {
            req: 7,
            token: vec![1; 32],
        }));
        feed(&mut e, &forwarded);
        match e.poll(Instant::now()).unwrap() {
            Step::Answer { waiter, answer } => {
                assert_eq!(waiter, "forward 7");
                assert!(matches!(answer, Ok(Answer::Token(t)) if t == vec![1; 32]));
            }
            _ => panic!("the answer"),
        }
        // The same answer again finds nobody: dropped, and the connection reads on.
        feed(&mut e, &forwarded);
        assert!(matches!(e.poll(Instant::now()).unwrap(), Step::Read));
        assert!(!e.asking());
    }

    #[test]
    fn a_refusal_and_pulled_bytes_reach_their_requests() {
        let requests = Arc::new(Mutex::new(Requests::default()));
        let mut e = established(&requests);
        requests.lock().unwrap().insert(
            1,
            Asked {
                len: Some(3),
                hash: true,
            },
            "pull 1",
        );
        requests.lock().unwrap().insert(
            2,
            Asked {
                len: Some(3),
                hash: false,
            },
            "pull 2",
        );
        assert!(e.asking());
        let mut bytes = header(&Header::Ticket(TicketOp::Pulled { req: 1, len: 3 }));
        bytes.extend_from_slice(b"abc");
        bytes.extend(header(&Header::Ticket(TicketOp::Refused {
            req: 2,
            code: "expired".into(),
            message: "gone".into(),
        })));
        feed(&mut e, &bytes);
        match e.poll(Instant::now()).unwrap() {
            Step::Pulled { waiter, bytes, digest } => {
                assert_eq!((waiter, &bytes[..]), ("pull 1", &b"abc"[..]));
                assert!(matches!(digest, Digest::Hashed(d) if d == *blake3::hash(b"abc").as_bytes()));
            }
            _ => panic!("the pulled bytes"),
        }
        match e.poll(Instant::now()).unwrap() {
            Step::Answer { waiter, answer } => {
                assert_eq!(waiter, "pull 2");
                assert_eq!(answer.unwrap_err().code, "expired");
            }
            _ => panic!("the refusal"),
        }
    }

    #[test]
    fn an_unasked_pulled_is_skipped_whole() {
        let requests = Arc::new(Mutex::new(Requests::<&'static str>::default()));
        let mut e = established(&requests);
        let mut bytes = header(&Header::Ticket(TicketOp::Pulled { req: 9, len: 4 }));
        bytes.extend_from_slice(b"wxyz");
        bytes.extend(header(&Header::Release { leases: vec![5] }));
        feed(&mut e, &bytes);
        // The pulled bytes are read past; the next header is handed on as it is.
        match e.poll(Instant::now()).unwrap() {
            Step::Event(Event::Release(l)) => assert_eq!(l, vec![5]),
            _ => panic!("the release after the skipped bytes"),
        }
    }
}
