//! `handoff`: run a node, the demo cluster, or the benchmarks.

mod bench;
mod chaos;
mod data_cmd;
mod demo;
mod demo_data;
mod demo_row;
mod demo_table;
mod dial;
mod hostile;
mod node_cmd;
mod protocol;
mod raw_serve;
mod scratch;
mod serve;
mod stats;
mod table;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Moves objects between workers, encoding each by where it goes.
#[derive(Debug, Parser)]
#[command(name = "handoff", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one node that serves the demo and bench protocol until killed.
    Node(Box<node_cmd::NodeArgs>),
    /// Start a small cluster on this machine and move a large buffer along every route.
    Demo(demo::DemoArgs),
    /// Measure each channel against a raw baseline in the same run.
    Bench(bench::BenchArgs),
    /// Inject faults into ticket transfers between real processes and check the lease invariants.
    Chaos(chaos::ChaosArgs),
    /// Ask a running node for its leases (count, bytes, oldest), shared memory and peers.
    Stats(stats::StatsArgs),
    /// Datasets of a catalog (Data.toml): list, fetch into the cache, verify, evict.
    Data(data_cmd::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HANDOFF_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result: Result<()> = runtime.block_on(async {
        match cli.command {
            Command::Node(args) => node_cmd::run(*args).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Chaos(args) => chaos::run(args).await,
            Command::Stats(args) => stats::run(args).await,
            Command::Data(args) => data_cmd::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
