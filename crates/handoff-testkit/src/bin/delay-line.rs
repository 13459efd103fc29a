//! `delay-line`: relays TCP connections and holds every byte for a set time in each
//! direction. The network lab (`scripts/netlab`) uses it for delay where the kernel has no
//! `netem`; `bench/lab.py`'s `delay` case runs one in front of each server it measures.
//!
//!     delay-line --delay-ms 0.5 --forward 10.77.0.2:0=10.77.0.2:7000 [--forward ...]
//!
//! Prints one JSON line, `{"one_way_ms": 0.5, "forwards": [{"listen": ..., "to": ...}]}`,
//! once every listener is bound, then relays until it is killed.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use handoff_testkit::DelayLine;

/// Relay TCP connections, holding every byte for a set time in each direction.
#[derive(Debug, Parser)]
#[command(name = "delay-line")]
struct Args {
    /// Delay in each direction, in milliseconds (a round trip gains twice this).
    #[arg(long, value_parser = parse_delay)]
    delay_ms: Duration,
    /// `LISTEN=TARGET`: accept on LISTEN (port 0 for any) and relay to TARGET. Repeatable.
    #[arg(long, required = true, value_parser = parse_forward)]
    forward: Vec<(SocketAddr, SocketAddr)>,
}

fn parse_delay(text: &str) -> Result<Duration, String> {
    let ms: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of milliseconds"))?;
    if !(0.0..=10_000.0).contains(&ms) {
        return Err(format!("{ms} ms is outside 0 to 10000 ms"));
    }
    Ok(Duration::from_secs_f64(ms / 1e3))
}

fn parse_forward(text: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (listen, to) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: expected LISTEN=TARGET, e.g. 10.77.0.2:0=10.77.0.2:7000"))?;
    let parse = |a: &str| {
        a.parse::<SocketAddr>()
            .map_err(|e| format!("{a:?}: {e} (expected IP:PORT)"))
    };
    Ok((parse(listen)?, parse(to)?))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut forwards = Vec::new();
    for (listen, to) in &args.forward {
        match DelayLine::start(*listen, *to, args.delay_ms) {
            Ok(line) => forwards.push(format!(r#"{{"listen": "{}", "to": "{to}"}}"#, line.addr())),
            Err(e) => {
                eprintln!("delay-line: cannot listen on {listen}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        r#"{{"one_way_ms": {}, "forwards": [{}]}}"#,
        args.delay_ms.as_secs_f64() * 1e3,
        forwards.join(", ")
    );
    loop {
        std::thread::park();
    }
}
