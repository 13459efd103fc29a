//! A small seeded generator for deterministic runs: the engine's simulations and the CLI's
//! chaos harness draw from it, so that a seed names one run and replays it exactly.

/// SplitMix64: a small, stable, seedable generator (the same seed gives the same sequence on
/// every platform). Not for secrets: nonces and tokens come from `rand`.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 bits.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_names_one_sequence() {
        let a: Vec<u64> = (0..4).scan(SplitMix64::new(7), |r, _| Some(r.next())).collect();
        let b: Vec<u64> = (0..4).scan(SplitMix64::new(7), |r, _| Some(r.next())).collect();
        assert_eq!(a, b);
        // SplitMix64's published first output for seed 0.
        assert_eq!(SplitMix64::new(0).next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(SplitMix64::new(1).below(0), 0);
    }
}
