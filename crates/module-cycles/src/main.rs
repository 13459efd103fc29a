//! `module-cycles`: fails when two source files of a crate import each other, directly or
//! round a ring, and names the files and the lines to cut. See the library's docs for what
//! counts as an import.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use module_cycles::workspace::{workspace_crates, CrateRoot};
use module_cycles::{check_crate, CrateReport};

/// Checks that no crate of the workspace has an import ring between its files.
#[derive(Parser)]
#[command(name = "module-cycles")]
struct Args {
    /// The workspace's Cargo.toml (default: the one cargo finds from here).
    #[arg(long)]
    manifest_path: Option<PathBuf>,
    /// Check these crate root files instead of the workspace's targets.
    roots: Vec<PathBuf>,
    /// Also print every import between files (what the rings are made of).
    #[arg(long)]
    edges: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("module-cycles: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Checks every crate; true when none has a ring.
fn run(args: &Args) -> anyhow::Result<bool> {
    let crates = if args.roots.is_empty() {
        workspace_crates(args.manifest_path.as_ref())?
    } else {
        args.roots
            .iter()
            .map(|root| CrateRoot {
                label: root.display().to_string(),
                root: root.clone(),
            })
            .collect()
    };
    let base = std::env::current_dir().unwrap_or_default();
    let (mut files, mut ring_count) = (0, 0);
    for krate in &crates {
        let report = check_crate(&krate.root)?;
        files += report.files.len();
        ring_count += report.rings.len();
        print_report(&krate.label, &report, &base, args.edges);
    }
    if ring_count == 0 {
        println!("module-cycles: {} crates, {files} files, no import rings", crates.len());
    } else {
        println!(
            "module-cycles: {ring_count} import ring(s) in {} crates ({files} files); \
             move what the files share into a module below them",
            crates.len()
        );
        return Ok(false);
    }
    Ok(true)
}

fn print_report(label: &str, report: &CrateReport, base: &Path, edges: bool) {
    let show = |p: &Path| p.strip_prefix(base).unwrap_or(p).display().to_string();
    if edges {
        println!("{label}: {} imports between files", report.edges.len());
        for edge in &report.edges {
            println!(
                "  {} -> {}   ({}:{} {})",
                show(&edge.from),
                show(&edge.to),
                show(&edge.from),
                edge.line,
                edge.path
            );
        }
    }
    for ring in &report.rings {
        println!("{label}: an import ring of {} files:", ring.files.len());
        for file in &ring.files {
            println!("    {}", show(file));
        }
        println!("  one loop through it:");
        for edge in &ring.cycle {
            println!(
                "    {} -> {}   ({}:{} uses {})",
                show(&edge.from),
                show(&edge.to),
                show(&edge.from),
                edge.line,
                edge.path
            );
        }
    }
}
