//! The handshake's view of the incoming byte stream: the 16-byte preamble, then headers
//! behind their 4-byte length prefix, read one item at a time.
//!
//! It never asks for a byte past the end of the item it reads ([`Input::wants`]), so that a
//! driver reading no more than that never takes the first bytes — or the descriptors — of
//! the first message after `ready` for the handshake's (spec §5.1).

use handoff_wire::framing::{header_len, LEN_PREFIX};
use handoff_wire::preamble::PREAMBLE_LEN;
use handoff_wire::{Limits, WireError};

/// What the next item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// The peer's preamble.
    Preamble,
    /// A header's length prefix.
    Prefix,
    /// A header of this many bytes.
    Header(usize),
}

/// One complete item read from the stream.
#[derive(Debug)]
pub(super) enum Read {
    /// The peer's 16 preamble bytes.
    Preamble([u8; PREAMBLE_LEN]),
    /// A header's bytes, without the length prefix.
    Header(Vec<u8>),
}

/// Bytes of the item in progress; whole items come out of [`Input::take`].
#[derive(Debug)]
pub(super) struct Input {
    item: Item,
    buf: Vec<u8>,
    /// Limits of a handshake header (spec §9: at most 64 KiB).
    limits: Limits,
}

impl Input {
    /// Input that starts with the peer's preamble; headers are bounded by `limits`.
    pub(super) fn new(limits: Limits) -> Input {
        Input {
            item: Item::Preamble,
            buf: Vec::with_capacity(PREAMBLE_LEN),
            limits,
        }
    }

    /// Bytes still needed to complete the item in progress (never 0).
    pub(super) fn wants(&self) -> usize {
        let whole = match self.item {
            Item::Preamble => PREAMBLE_LEN,
            Item::Prefix => LEN_PREFIX,
            Item::Header(n) => n,
        };
        whole - self.buf.len()
    }

    /// The whole item's length and the bytes of it that arrived (for `truncated`).
    pub(super) fn progress(&self) -> (usize, usize) {
        (self.wants() + self.buf.len(), self.buf.len())
    }

    /// Whether no byte of the next item has arrived: a clean end of stream here is the peer
    /// closing, anywhere else a truncated item.
    pub(super) fn at_boundary(&self) -> bool {
        self.buf.is_empty() && self.item != Item::Header(0)
    }

    /// What was being read, for an error that says where the stream ended.
    pub(super) fn reading(&self) -> &'static str {
        match self.item {
            Item::Preamble => "preamble",
            Item::Prefix => "header length",
            Item::Header(_) => "header",
        }
    }

    /// Takes bytes from the front of `bytes` (at most [`wants`](Self::wants) of them);
    /// returns how many it took and the item they completed, if any. A length prefix over
    /// the handshake's header limit is an error before anything of that size is kept.
    pub(super) fn take(&mut self, bytes: &[u8]) -> Result<(usize, Option<Read>), WireError> {
        let n = bytes.len().min(self.wants());
        self.buf.extend_from_slice(&bytes[..n]);
        if self.wants() > 0 {
            return Ok((n, None));
        }
        let whole = std::mem::take(&mut self.buf);
        let read = match self.item {
            Item::Preamble => {
                self.item = Item::Prefix;
                Some(Read::Preamble(whole[..].try_into().expect("a whole preamble")))
            }
            Item::Prefix => {
                let len = header_len(whole[..].try_into().expect("a whole prefix"), &self.limits)?;
                self.item = Item::Header(len);
                self.buf.reserve_exact(len);
                None
            }
            Item::Header(_) => {
                self.item = Item::Prefix;
                Some(Read::Header(whole))
            }
        };
        Ok((n, read))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_come_out_whole_and_no_byte_past_them_is_asked_for() {
        let mut input = Input::new(Limits::DEFAULT.during_handshake());
        assert_eq!(input.wants(), 16);
        let (n, r) = input.take(&[7u8; 10]).unwrap();
        assert_eq!((n, r.is_none()), (10, true));
        assert!(!input.at_boundary());
        let (n, r) = input.take(&[7u8; 10]).unwrap();
        assert_eq!(n, 6, "only the rest of the preamble is taken");
        assert!(matches!(r, Some(Read::Preamble(p)) if p == [7u8; 16]));
        assert!(input.at_boundary());
        assert_eq!(input.wants(), 4);
        let (_, r) = input.take(&[0, 0, 0, 3]).unwrap();
        assert!(r.is_none());
        assert_eq!(input.wants(), 3);
        let (n, r) = input.take(b"abcdef").unwrap();
        assert_eq!(n, 3);
        assert!(matches!(r, Some(Read::Header(h)) if h == b"abc"));
    }

    #[test]
    fn a_length_over_the_handshake_limit_is_refused_before_it_is_kept() {
        let mut input = Input::new(Limits::DEFAULT.during_handshake());
        input.take(&[0u8; 16]).unwrap();
        let err = input.take(&[0, 1, 0, 1]).unwrap_err();
        assert_eq!(err.code(), "header-too-large");
        let mut input = Input::new(Limits::DEFAULT.during_handshake());
        input.take(&[0u8; 16]).unwrap();
        assert!(input.take(&[0, 0, 0, 0]).is_err(), "a zero length is malformed");
    }
}
