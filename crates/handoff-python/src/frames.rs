//! Length-prefixed frames (`u32` big-endian length, then that many bytes), reassembled
//! from whatever a non-blocking read returns. Protocol logic only: the channels do the
//! reading, into the buffer this module says to fill.

use std::fmt;

/// Bytes of the length prefix.
pub const PREFIX: usize = 4;

/// The largest frame a reader accepts unless told otherwise (1 GiB plus a little), checked
/// on the prefix, before anything is allocated for the frame.
pub const MAX_FRAME_BYTES: usize = (1 << 30) + (1 << 20);

/// Frames of this size and more are read straight into their destination; smaller ones
/// are read in batches through a staging buffer.
pub const DIRECT_FROM: usize = 64 * 1024;

/// A frame's length prefix announced more than the reader allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameTooLarge {
    /// The length the peer announced.
    pub len: usize,
    /// The reader's bound.
    pub limit: usize,
}

impl fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peer announced a frame of {} bytes; the limit is {}",
            self.len, self.limit
        )
    }
}

impl std::error::Error for FrameTooLarge {}

/// Parses a length prefix against `limit`.
pub fn frame_len(prefix: [u8; PREFIX], limit: usize) -> Result<usize, FrameTooLarge> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > limit {
        return Err(FrameTooLarge { len, limit });
    }
    Ok(len)
}

/// Appends `prefix | data` to `out`.
pub fn encode_into(data: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

/// The state of a reader between reads: what the next bytes of the stream are for.
#[derive(Debug, Default)]
pub struct FrameReader {
    staged: Vec<u8>,
    limit: usize,
}

/// What a reader found in its staged bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// A whole small frame, taken from the staged bytes.
    Frame(Vec<u8>),
    /// A large frame starts: `len` bytes, of which `have` were staged and are in `head`;
    /// the caller reads the rest straight into the frame's destination.
    Large { len: usize, head: Vec<u8> },
    /// More bytes are needed.
    NeedMore,
}

impl FrameReader {
    /// A reader that refuses frames over `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            staged: Vec::new(),
            limit,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.staged.extend_from_slice(bytes);
    }

    /// Bytes staged and not yet taken.
    pub fn staged(&self) -> usize {
        self.staged.len()
    }

    /// Takes the next frame, or the start of a large one, from the staged bytes.
    pub fn take_next(&mut self) -> Result<Next, FrameTooLarge> {
        if self.staged.len() < PREFIX {
            return Ok(Next::NeedMore);
        }
        let prefix = [self.staged[0], self.staged[1], self.staged[2], self.staged[3]];
        let len = frame_len(prefix, self.limit)?;
        if len >= DIRECT_FROM {
            let have = (self.staged.len() - PREFIX).min(len);
            let head = self.staged[PREFIX..PREFIX + have].to_vec();
            self.staged.drain(..PREFIX + have);
            return Ok(Next::Large { len, head });
        }
        if self.staged.len() < PREFIX + len {
            return Ok(Next::NeedMore);
        }
        let frame = self.staged[PREFIX..PREFIX + len].to_vec();
        self.staged.drain(..PREFIX + len);
        Ok(Next::Frame(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_frames_come_out_whole_whatever_the_reads_cut() {
        let mut stream = Vec::new();
        encode_into(b"hello", &mut stream);
        encode_into(b"", &mut stream);
        encode_into(&[7u8; 300], &mut stream);
        for cut in 1..stream.len() {
            let mut r = FrameReader::new(1000);
            let mut got = Vec::new();
            for chunk in stream.chunks(cut) {
                r.push(chunk);
                while let Next::Frame(f) = r.take_next().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, vec![b"hello".to_vec(), vec![], vec![7u8; 300]], "cut {cut}");
            assert_eq!(r.staged(), 0);
        }
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_on_its_prefix() {
        let mut r = FrameReader::new(10);
        r.push(&11u32.to_be_bytes());
        assert_eq!(r.take_next(), Err(FrameTooLarge { len: 11, limit: 10 }));
    }

    #[test]
    fn a_large_frame_hands_over_its_staged_head() {
        let mut r = FrameReader::new(MAX_FRAME_BYTES);
        let mut s = Vec::new();
        encode_into(&vec![1u8; DIRECT_FROM], &mut s);
        r.push(&s[..100]);
        assert_eq!(
            r.take_next(),
            Ok(Next::Large {
                len: DIRECT_FROM,
                head: vec![1u8; 96]
            })
        );
        assert_eq!(r.staged(), 0);
    }
}
