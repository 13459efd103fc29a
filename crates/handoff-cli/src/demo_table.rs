//! The table `handoff demo` prints (without `--json`): one line per row, the first transfer of each route
//! beside its warm figure, and a legend that says which is which.

use crate::demo_row::Row;
use crate::table;

/// Renders the rows as a table and its legend; `warm_reps` is how many transfers the warm figure is the
/// median of.
pub fn render(rows: &[Row], warm_reps: u64) -> String {
    let gbps =
        |seconds: Option<f64>, bytes: u64| seconds.map_or_else(|| "-".to_string(), |s| table::throughput(bytes, s));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.from.clone(),
                r.to.clone(),
                r.locality.clone(),
                r.channel.clone(),
                table::size(r.bytes),
                r.first_seconds().map_or_else(|| "-".to_string(), table::duration),
                gbps(r.first_seconds(), r.bytes),
                gbps(r.warm(), r.bytes),
                if r.verified { "yes".into() } else { "NO".into() },
                sent_as(r),
            ]
        })
        .collect();
    let mut out = table::render(
        &[
            "from", "to", "locality", "channel", "bytes", "time", "cold", "warm", "verified", "sent as",
        ],
        &cells,
    );
    out.push_str(&format!(
        "\ntime, cold: the route's first transfer, into memory no process touched before and pools still\n  \
         empty: a start-up cost, not the steady speed.\n\
         warm: the median of {warm_reps} more transfers on the same route (Dask arrays: after one warm-up),\n  \
         the steady state that BENCHMARKS.md measures. A data handle has none: a second read would come\n  \
         from the receiver's own cache.\n"
    ));
    out
}

/// The last column: what travelled.
fn sent_as(r: &Row) -> String {
    match (&r.data, &r.path, r.storage_gets, r.dask_tcp_seconds) {
        (Some(d), Some(p), Some(g), _) => {
            format!("{d} via {p} ({g} storage GET{})", if g == 1 { "" } else { "s" })
        }
        (_, _, _, Some(t)) => format!(
            "Dask array (on tcp:// {}, {} warm)",
            table::duration(t),
            table::throughput(r.bytes, t)
        ),
        _ => "value".into(),
    }
}
