//! Which pages of a privately remapped range this process has written since: from
//! `/proc/self/pagemap`, where a written page of a private file mapping is anonymous
//! (bit 61 clear) and present (bit 63) or swapped (bit 62). An unwritten page is the file's.

use std::os::fd::OwnedFd;

use crate::error::ArenaError;
use crate::region::page;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const FILE_OR_SHARED: u64 = 1 << 61;

/// Reads pagemap entries.
pub struct PageMap(OwnedFd);

impl PageMap {
    /// Opens `/proc/self/pagemap`.
    pub fn open() -> Result<PageMap, ArenaError> {
        rustix::fs::open(
            "/proc/self/pagemap",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map(PageMap)
        .map_err(|e| ArenaError::new("opening /proc/self/pagemap", e))
    }

    /// The runs `(first page, count)` of written pages among the `count` pages from address
    /// `addr` (page-aligned), as page indices relative to `addr`.
    pub fn written(&self, addr: usize, count: usize) -> Result<Vec<(usize, usize)>, ArenaError> {
        let p = page();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut buf = vec![0u8; 8 * count.min(32768)];
        let mut i = 0;
        while i < count {
            let n = (count - i).min(32768);
            let want = &mut buf[..8 * n];
            let at = ((addr / p + i) * 8) as u64;
            let mut got = 0;
            while got < want.len() {
                let r = rustix::io::pread(&self.0, &mut want[got..], at + got as u64)
                    .map_err(|e| ArenaError::new("reading /proc/self/pagemap", e))?;
                if r == 0 {
                    return Err(ArenaError::new(
                        "reading /proc/self/pagemap",
                        std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                    ));
                }
                got += r;
            }
            for (j, entry) in want.chunks_exact(8).enumerate() {
                let e = u64::from_ne_bytes(entry.try_into().expect("8 bytes"));
                let written = (e & (PRESENT | SWAPPED)) != 0 && (e & FILE_OR_SHARED) == 0;
                if written {
                    let at = i + j;
                    match runs.last_mut() {
                        Some((first, len)) if *first + *len == at => *len += 1,
                        _ => runs.push((at, 1)),
                    }
                }
            }
            i += n;
        }
        Ok(runs)
    }
}
