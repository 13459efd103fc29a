//! One arena's free space: page-aligned blocks, first fit, merged with free neighbours of the
//! same kind when freed. A block either reads as zeros (never used, or punched out) or may
//! hold old bytes (populated, kept for reuse); the two kinds never merge, so the populated
//! bytes are known exactly and a zeroed allocation from a zero block needs no memset.

use std::collections::BTreeMap;

/// A free block: its length and whether it reads as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Free {
    len: usize,
    zero: bool,
}

/// The free blocks of an arena of `size` bytes, by offset.
#[derive(Debug)]
pub struct FreeList {
    blocks: BTreeMap<usize, Free>,
    free_bytes: usize,
    populated_bytes: usize,
}

impl FreeList {
    /// An arena of `size` bytes, all free and reading as zeros.
    pub fn new(size: usize) -> FreeList {
        FreeList {
            blocks: BTreeMap::from([(0, Free { len: size, zero: true })]),
            free_bytes: size,
            populated_bytes: 0,
        }
    }

    /// Takes `len` bytes (whole pages) from the first block that holds them: `(offset,
    /// whether they read as zeros)`, or `None` if no block is large enough.
    pub fn take(&mut self, len: usize) -> Option<(usize, bool)> {
        let (&off, &block) = self.blocks.iter().find(|(_, b)| b.len >= len)?;
        self.blocks.remove(&off);
        if block.len > len {
            self.blocks.insert(
                off + len,
                Free {
                    len: block.len - len,
                    zero: block.zero,
                },
            );
        }
        self.free_bytes -= len;
        if !block.zero {
            self.populated_bytes -= len;
        }
        Some((off, block.zero))
    }

    /// Gives back `len` bytes at `off`, merged with free neighbours of the same kind; `zero`
    /// if they read as zeros.
    pub fn give(&mut self, off: usize, len: usize, zero: bool) {
        let mut start = off;
        let mut total = len;
        if let Some((&prev, &p)) = self.blocks.range(..off).next_back() {
            if prev + p.len == off && p.zero == zero {
                self.blocks.remove(&prev);
                start = prev;
                total += p.len;
            }
        }
        if let Some(&next) = self.blocks.get(&(off + len)) {
            if next.zero == zero {
                self.blocks.remove(&(off + len));
                total += next.len;
            }
        }
        self.blocks.insert(start, Free { len: total, zero });
        self.free_bytes += len;
        if !zero {
            self.populated_bytes += len;
        }
    }

    /// Bytes free.
    pub fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// Free bytes that may be populated (kept for reuse).
    pub fn populated_bytes(&self) -> usize {
        self.populated_bytes
    }

    /// Takes every populated block out, `(offset, len)`, for the caller to punch and give
    /// back (as zeros if the punch worked, else as they were).
    pub fn take_populated(&mut self) -> Vec<(usize, usize)> {
        let taken: Vec<(usize, usize)> = self
            .blocks
            .iter()
            .filter(|(_, b)| !b.zero)
            .map(|(&off, b)| (off, b.len))
            .collect();
        for (off, len) in &taken {
            self.blocks.remove(off);
            self.free_bytes -= len;
            self.populated_bytes -= len;
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_taken_first_fit_and_merged_back_with_their_kind() {
        let mut list = FreeList::new(100);
        assert_eq!(list.take(30), Some((0, true)));
        assert_eq!(list.take(30), Some((30, true)));
        assert_eq!(list.take(50), None, "40 left");
        list.give(0, 30, false);
        assert_eq!(list.populated_bytes(), 30);
        assert_eq!(list.take(20), Some((0, false)), "first fit, and it was used");
        assert_eq!(list.populated_bytes(), 10);
        list.give(30, 30, false);
        list.give(0, 20, false);
        assert_eq!((list.free_bytes(), list.populated_bytes()), (100, 60));
        assert_eq!(list.take(60), Some((0, false)), "the used blocks merged");
        assert_eq!(list.take(40), Some((60, true)), "the zero block stayed apart");
        assert_eq!(list.take(1), None);
    }

    #[test]
    fn populated_blocks_are_taken_out_to_be_punched() {
        let mut list = FreeList::new(30);
        list.take(30);
        list.give(0, 10, false);
        list.give(20, 10, true);
        assert_eq!(list.take_populated(), vec![(0, 10)]);
        assert_eq!((list.free_bytes(), list.populated_bytes()), (10, 0));
        assert!(list.take_populated().is_empty());
        list.give(0, 10, true);
        assert_eq!(list.take(10), Some((0, true)));
    }
}
