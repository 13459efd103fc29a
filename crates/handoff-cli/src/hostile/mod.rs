//! `handoff chaos --hostile`: a hostile-peer suite. Each attack (one per class of issue 11)
//! runs against a fresh victim process — `handoff node`, or the Python peer's worker — started
//! with small bounds, while a legitimate peer keeps asking it for 100-byte round trips.
//! Around each attack the runner checks what no peer may break: the victim lives, its
//! resident memory (read from `/proc`) stays within what its bounds allow, and the
//! legitimate peer is served meanwhile, with its round trip compared to the idle one.

pub mod attacks;
mod raw;
pub mod victim;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

use self::victim::{median, Kind, Prober, Sampler, Victim};

/// Round trips the legitimate peer measures on the idle victim before each attack.
const IDLE_PROBES: usize = 100;
/// Memory a victim may use beyond what its bounds allow (allocator slack, runtime).
const SLACK: u64 = 64 << 20;
/// The longest one attack may run.
const ATTACK_LIMIT: Duration = Duration::from_secs(180);
/// What a victim may log during one attack (its warnings are limited per peer and period).
const LOG_ALLOWANCE: u64 = 256 << 10;
/// The shortest: a quicker attack is repeated until this much time passed.
const MIN_ATTACK: Duration = Duration::from_millis(1500);

/// One attack's result (keys are a public interface: keep them stable).
#[derive(Debug, Serialize)]
pub struct AttackReport {
    /// The attack's name.
    pub attack: String,
    /// The classes of issue 11 it exercises.
    pub classes: Vec<u8>,
    /// Whether every check passed.
    pub ok: bool,
    /// Whether the victim process still ran after the attack.
    pub alive: bool,
    /// Whether the legitimate peer's round trips were all answered, during and after.
    pub served: bool,
    /// Resident memory of the idle victim, MiB.
    pub rss_idle_mib: f64,
    /// Highest resident memory during the attack, MiB.
    pub rss_peak_mib: f64,
    /// What its bounds allow it to grow by, MiB.
    pub rss_allowance_mib: f64,
    /// Growth of its address space, MiB.
    pub vm_growth_mib: f64,
    /// Median 100-byte round trip of the legitimate peer on the idle victim, µs.
    pub rtt_idle_us: Option<f64>,
    /// The same during the attack, µs.
    pub rtt_attack_us: Option<f64>,
    /// `rtt_attack_us / rtt_idle_us`.
    pub rtt_ratio: Option<f64>,
    /// Whether that ratio is at most 2 (issue 11's criterion); absent when too few round
    /// trips fell inside the attack, or when the attack makes the victim's application
    /// slow on purpose (then the legitimate peer shares a slow application, and twice the
    /// idle round trip is the least a fair share can give).
    pub rtt_within_2x: Option<bool>,
    /// Round trips measured during the attack.
    pub rtt_samples: usize,
    /// Bytes the victim logged during the attack.
    pub log_bytes: u64,
    /// Checks that passed.
    pub passed: Vec<String>,
    /// Checks that failed.
    pub failed: Vec<String>,
    /// Seconds the attack took.
    pub seconds: f64,
}

/// The suite's result (keys are a public interface: keep them stable).
#[derive(Debug, Serialize)]
pub struct HostileSummary {
    /// `rust` or `python`.
    pub victim: String,
    /// One row per attack.
    pub attacks: Vec<AttackReport>,
    /// Whether every attack passed.
    pub ok: bool,
    /// The worst round-trip ratio over the attacks that measured one.
    pub worst_rtt_ratio: Option<f64>,
    /// Attacks whose round-trip ratio was over 2.
    pub over_2x: Vec<String>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Runs the attacks named in `only` (all when empty) against victims of `kind`.
pub async fn run(kind: Kind, python: PathBuf, only: &[String], json: bool) -> Result<()> {
    let started = Instant::now();
    let names: Vec<&str> = if only.is_empty() {
        attacks::ALL.to_vec()
    } else {
        only.iter().map(String::as_str).collect()
    };
    for n in &names {
        anyhow::ensure!(
            attacks::ALL.contains(n),
            "no attack named {n:?}; attacks: {}",
            attacks::ALL.join(", ")
        );
    }
    let mut reports = Vec::new();
    for name in names {
        if !json {
            eprintln!("attack {name} …");
        }
        let report = attack(kind, &python, name).await?;
        if !json {
            print_row(&report);
        }
        reports.push(report);
    }
    let ok = reports.iter().all(|r| r.ok);
    let over_2x: Vec<String> = reports
        .iter()
        .filter(|r| r.rtt_within_2x == Some(false))
        .map(|r| r.attack.clone())
        .collect();
    let worst = reports
        .iter()
        .filter_map(|r| r.rtt_ratio)
        .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
    let summary = HostileSummary {
        victim: format!("{kind:?}").to_lowercase(),
        attacks: reports,
        ok,
        worst_rtt_ratio: worst,
        over_2x,
        seconds: started.elapsed().as_secs_f64(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        eprintln!(
            "{} attacks on the {} victim in {:.1} s: {}; worst round-trip ratio {}; over 2x: {}",
            summary.attacks.len(),
            summary.victim,
            summary.seconds,
            if ok { "all passed" } else { "SOME FAILED" },
            worst.map_or("-".into(), |w| format!("{w:.2}")),
            if summary.over_2x.is_empty() {
                "none".to_string()
            } else {
                summary.over_2x.join(", ")
            },
        );
    }
    anyhow::ensure!(ok, "some attacks broke the victim (see above)");
    Ok(())
}

fn print_row(r: &AttackReport) {
    eprintln!(
        "  {:<22} {}  alive {}  served {}  rss {:.0} -> {:.0} MiB (allowed +{:.0})  rtt {} -> {} µs ({})",
        r.attack,
        if r.ok { "ok  " } else { "FAIL" },
        r.alive,
        r.served,
        r.rss_idle_mib,
        r.rss_peak_mib,
        r.rss_allowance_mib,
        r.rtt_idle_us.map_or("-".into(), |v| format!("{v:.0}")),
        r.rtt_attack_us.map_or("-".into(), |v| format!("{v:.0}")),
        r.rtt_ratio.map_or("-".into(), |v| format!("{v:.2}x")),
    );
    for f in &r.failed {
        eprintln!("      failed: {f}");
    }
}

/// One attack against a fresh victim.
async fn attack(kind: Kind, python: &std::path::Path, name: &str) -> Result<AttackReport> {
    let started = Instant::now();
    let mut victim = Victim::start(kind, python, attacks::victim_args(name)).await?;
    let second = match attacks::needs_second_victim(name) {
        true => Some(Victim::start(kind, python, attacks::victim_args(name)).await?),
        false => None,
    };
    let unix = raw::Raw::tcp_handshaken(&victim.listen, &raw::Identity::fresh("scout"), &victim.secret)
        .await
        .context("a first handshake with the victim")?
        .peer
        .and_then(|i| i.unix);
    let prober = Prober::start(&victim.listen, &victim.secret)?;
    prober.idle(IDLE_PROBES).await;
    let idle = victim::memory(victim.pid).unwrap_or_default();
    let log_before = victim.log_bytes();
    let target = attacks::Target {
        kind,
        listen: victim.listen.clone(),
        unix,
        secret: victim.secret.clone(),
        pid: victim.pid,
        bounds: victim::Bounds::SMALL,
        second: second.as_ref().map(|v| v.listen.clone()),
    };
    let sampler = Sampler::start(victim.pid);
    prober.attack_begins();
    // A quick attack is repeated for a while, so that the legitimate peer's round trips
    // are measured during it.
    let repeated = async {
        let begun = Instant::now();
        let mut all = attacks::Findings::default();
        loop {
            let f = attacks::run(name, &target).await?;
            if all.passed.is_empty() {
                all.passed = f.passed;
            }
            all.failed.extend(f.failed);
            if begun.elapsed() >= MIN_ATTACK || !all.failed.is_empty() {
                return Ok::<_, anyhow::Error>(all);
            }
        }
    };
    let outcome = tokio::time::timeout(ATTACK_LIMIT, repeated).await;
    prober.attack_ends().await;
    let peak = sampler.finish().await;
    let alive = victim.alive();
    let probes = prober.finish();
    let mut findings = match outcome {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => {
            let mut f = attacks::Findings::default();
            f.check(false, format!("the attack could not run to its end: {e:#}"));
            f
        }
        Err(_) => {
            let mut f = attacks::Findings::default();
            f.check(false, format!("the attack took over {ATTACK_LIMIT:?}"));
            f
        }
    };
    let allowance = target.bounds.memory_allowance() + SLACK;
    let grown = peak.rss.saturating_sub(idle.rss);
    findings.check(alive, "the victim process lives");
    findings.check(
        grown <= allowance,
        format!(
            "its resident memory grew by {:.0} MiB (bounds allow {:.0})",
            mib(grown),
            mib(allowance)
        ),
    );
    let served = probes.failures.is_empty() && !probes.after.is_empty();
    findings.check(
        served,
        format!(
            "the legitimate peer was served: {} round trips during, {} after, failures: {:?}",
            probes.attack.len(),
            probes.after.len(),
            probes.failures
        ),
    );
    let logged = victim.log_bytes().saturating_sub(log_before);
    findings.check(
        logged <= LOG_ALLOWANCE,
        format!(
            "its warnings are rate-limited: it logged {logged} bytes during the attack{}",
            if logged > LOG_ALLOWANCE {
                format!(", ending: {}", victim.log_tail())
            } else {
                String::new()
            }
        ),
    );
    let (idle_rtt, attack_rtt) = (median(&probes.idle), median(&probes.attack));
    let ratio = match (idle_rtt, attack_rtt) {
        (Some(i), Some(a)) if probes.attack.len() >= 5 => Some(us(a) / us(i)),
        _ => None,
    };
    if !alive {
        findings.check(false, format!("the victim's last words: {}", victim.log_tail()));
    }
    Ok(AttackReport {
        attack: name.to_string(),
        classes: attacks::classes(name).to_vec(),
        ok: findings.failed.is_empty(),
        alive,
        served,
        rss_idle_mib: mib(idle.rss),
        rss_peak_mib: mib(peak.rss),
        rss_allowance_mib: mib(allowance),
        vm_growth_mib: mib(peak.vm.saturating_sub(idle.vm)),
        rtt_idle_us: idle_rtt.map(us),
        rtt_attack_us: attack_rtt.map(us),
        rtt_ratio: ratio,
        rtt_within_2x: ratio
            .filter(|_| !attacks::slows_the_application(name))
            .map(|r| r <= 2.0),
        rtt_samples: probes.attack.len(),
        log_bytes: logged,
        passed: findings.passed,
        failed: findings.failed,
        seconds: started.elapsed().as_secs_f64(),
    })
}
