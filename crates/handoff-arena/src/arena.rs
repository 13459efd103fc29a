//! One arena's free space: page-aligned blocks, first fit, merged with their neighbours
//! when freed. Each free block knows whether its pages are known to read as zeros (never
//! used, or punched out), so a zeroed allocation from it needs no memset.

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
}

impl FreeList {
    /// An arena of `size` bytes, all free and reading as zeros.
    pub fn new(size: usize) -> FreeList {
        FreeList {
            blocks: BTreeMap::from([(0, Free { len: size, zero: true })]),
            free_bytes: size,
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
        Some((off, block.zero))
    }

    /// Gives back `len` bytes at `off`, merged with free neighbours; `zero` if they read as
    /// zeros.
    pub fn give(&mut self, off: usize, len: usize, zero: bool) {
        let mut block = Free { len, zero };
        let mut start = off;
        if let Some((&prev, &p)) = self.blocks.range(..off).next_back() {
            if prev + p.len == off {
                self.blocks.remove(&prev);
                start = prev;
                block = Free {
                    len: p.len + block.len,
                    zero: p.zero && block.zero,
                };
            }
        }
        if let Some(&next) = self.blocks.get(&(off + len)) {
            self.blocks.remove(&(off + len));
            block = Free {
                len: block.len + next.len,
                zero: block.zero && next.zero,
            };
        }
        self.blocks.insert(start, block);
        self.free_bytes += len;
    }

    /// Bytes free.
    pub fn free_bytes(&self) -> usize {
        self.free_bytes
    }

    /// The free blocks whose pages may be populated, `(offset, len)`, now marked as reading
    /// as zeros: the caller punches them out.
    pub fn take_populated(&mut self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for (&off, block) in self.blocks.iter_mut() {
            if !block.zero {
                out.push((off, block.len));
                block.zero = true;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_taken_first_fit_and_merged_back() {
        let mut list = FreeList::new(100);
        assert_eq!(list.take(30), Some((0, true)));
        assert_eq!(list.take(30), Some((30, true)));
        assert_eq!(list.take(50), None, "40 left");
        list.give(0, 30, false);
        assert_eq!(list.take(20), Some((0, false)), "first fit, and it was used");
        list.give(30, 30, false);
        list.give(0, 20, false);
        assert_eq!(list.free_bytes(), 100);
        assert_eq!(list.take(100), Some((0, false)), "merged into one, no longer all zeros");
        assert_eq!(list.take(1), None);
    }

    #[test]
    fn populated_blocks_are_handed_out_once_to_be_punched() {
        let mut list = FreeList::new(30);
        list.take(30);
        list.give(0, 10, false);
        list.give(20, 10, true);
        assert_eq!(list.take_populated(), vec![(0, 10)]);
        assert!(list.take_populated().is_empty());
        assert_eq!(list.take(10), Some((0, true)));
    }

    #[test]
    fn a_block_reads_as_zeros_only_if_every_part_does() {
        let mut list = FreeList::new(10);
        list.take(10);
        list.give(0, 5, true);
        list.give(5, 5, true);
        assert_eq!(list.take(10), Some((0, true)));
        list.give(5, 5, false);
        list.give(0, 5, true);
        assert_eq!(list.take(10), Some((0, false)));
    }
}
