//! One result row of `handoff bench` (`Case`, whose JSON keys are a public interface), how a row is made from
//! measured runs, and the plan of sizes and repetitions that `--quick`, `--sizes` and `--reps` choose.

use serde::Serialize;

/// One result row (keys are a public interface: keep them stable).
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// Case name: `inproc-msg`, `tcp-rtt`, `shm-rtt`, `tcp-stream`, `tls-stream`, `shm-view`, `shm-read`,
    /// `tcp-read`, `shm-copy-in`, `ticket-pull`, `ticket-3party`, `blob-hit`, `blob-cold`; with
    /// `--remote`, `remote-rtt` and `remote-ticket-pull`.
    pub case: String,
    /// Channel measured.
    pub channel: String,
    /// Bytes per operation.
    pub bytes: u64,
    /// Median seconds per operation through handoff.
    pub ours: f64,
    /// Median seconds per operation of the raw baseline.
    pub baseline: f64,
    /// `baseline / ours`: 1.0 is as fast as the baseline, higher is better.
    pub efficiency: f64,
    /// Seconds per operation of each measured repetition through handoff (`ours` is their
    /// median); absent for cases that report only a median.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ours_runs: Vec<f64>,
    /// Seconds per operation of each repetition of the baseline (`baseline` is their median).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub baseline_runs: Vec<f64>,
    /// `remote-ticket-pull` only: the median raw round trip (100 bytes) to the same node,
    /// measured in the same run, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round_trip: Option<f64>,
    /// `remote-ticket-pull` only: `(ours - baseline) / round_trip`, the round trips a
    /// redemption took over the raw request-response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_round_trips: Option<f64>,
}

/// What to measure: repetitions, message counts and the sizes of each family of cases.
pub(super) struct Plan {
    pub(super) reps: usize,
    /// Repetitions of the ticket cases: cross-process transfers whose raw baseline itself
    /// varies by a third from one repetition to the next on a small VM, so their medians
    /// need more runs to settle.
    pub(super) ticket_reps: usize,
    pub(super) msgs: u64,
    pub(super) rtts: u64,
    pub(super) sizes: Vec<u64>,
    pub(super) shm_sizes: Vec<u64>,
    pub(super) ticket_sizes: Vec<u64>,
    pub(super) blob_sizes: Vec<u64>,
}

impl Plan {
    pub(super) fn new(quick: bool, sizes: Option<&[u64]>, reps: Option<u64>) -> Plan {
        let mut plan = Plan::default_for(quick);
        if let Some(sizes) = sizes {
            plan.sizes = sizes.to_vec();
            plan.shm_sizes = sizes.to_vec();
            plan.ticket_sizes = sizes.iter().copied().filter(|&s| s >= 64 << 10).collect();
            plan.blob_sizes = sizes.to_vec();
        }
        if let Some(reps) = reps {
            plan.reps = reps as usize;
            plan.ticket_reps = reps as usize;
        }
        plan
    }

    fn default_for(quick: bool) -> Plan {
        if quick {
            Plan {
                reps: 3,
                ticket_reps: 3,
                msgs: 20_000,
                rtts: 300,
                sizes: vec![1 << 20, 16 << 20, 64 << 20],
                shm_sizes: vec![1 << 20, 64 << 20],
                ticket_sizes: vec![64 << 20],
                blob_sizes: vec![64 << 20],
            }
        } else {
            Plan {
                reps: 7,
                ticket_reps: 11,
                msgs: 200_000,
                rtts: 3_000,
                sizes: vec![1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20],
                shm_sizes: vec![1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30],
                ticket_sizes: vec![64 << 20, 256 << 20, 1 << 30],
                blob_sizes: vec![64 << 20, 256 << 20],
            }
        }
    }
}

/// The median of `v` (the upper one of an even count).
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// A case from medians measured elsewhere (seconds per operation, ours and the baseline).
pub(super) fn case(name: &str, channel: &str, bytes: u64, ours: f64, baseline: f64) -> Case {
    Case {
        case: name.into(),
        channel: channel.into(),
        bytes,
        ours,
        baseline,
        efficiency: if ours > 0.0 { baseline / ours } else { 0.0 },
        ours_runs: Vec::new(),
        baseline_runs: Vec::new(),
        round_trip: None,
        extra_round_trips: None,
    }
}

/// A case from every measured repetition: the medians, and the runs kept beside them.
pub(super) fn case_runs(name: &str, channel: &str, bytes: u64, ours: Vec<f64>, baseline: Vec<f64>) -> Case {
    Case {
        ours_runs: ours.clone(),
        baseline_runs: baseline.clone(),
        ..case(name, channel, bytes, median(ours), median(baseline))
    }
}

/// Parses a size such as `1024`, `64K`, `64KiB`, `16M` or `1G` (powers of 1024).
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number: u64 = number.parse().map_err(|_| format!("not a size: {text:?}"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("unknown unit in {text:?} (use K, M or G)")),
    };
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("too large: {text:?}"))?;
    if bytes == 0 {
        return Err("a size must be at least 1 byte".into());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size(" 1G "), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1T").is_err());
        assert!(parse_size("K").is_err());
    }
}
