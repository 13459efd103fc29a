//! Runs the data benchmarks: `cargo run --release -p handoff-data --example data_bench -- [MiB...]`.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sizes: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("MiB")).collect();
    let sizes = if sizes.is_empty() { vec![64, 256] } else { sizes };
    for mib in sizes {
        let size = mib << 20;
        let (ours, base) = handoff_data::bench::blob_hit(size).await?;
        println!(
            "blob-hit  {mib:>5} MiB: ours {:.2} ms, baseline {:.2} ms, efficiency {:.2}",
            ours * 1e3,
            base * 1e3,
            base / ours
        );
        let (ours, base) = handoff_data::bench::blob_cold(size).await?;
        println!(
            "blob-cold {mib:>5} MiB: ours {:.2} ms, baseline {:.2} ms, efficiency {:.2}",
            ours * 1e3,
            base * 1e3,
            base / ours
        );
    }
    Ok(())
}
