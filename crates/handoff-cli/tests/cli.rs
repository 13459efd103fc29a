//! The `handoff` binary end to end, with real processes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

fn handoff() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_handoff"));
    c.env("HANDOFF_LOG", "warn");
    c
}

fn run_json(args: &[&str]) -> Value {
    let out = handoff().args(args).output().expect("run handoff");
    assert!(
        out.status.success(),
        "handoff {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "handoff {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn demo_json_rows_cover_inproc_tcp_and_shm_and_are_verified() {
    let rows = run_json(&["demo", "--json", "--bytes", "3000000"]);
    let rows = rows.as_array().expect("an array");
    assert!(rows.len() >= 4, "{rows:?}");
    for r in rows {
        for key in ["from", "to", "locality", "channel", "bytes", "seconds", "verified"] {
            assert!(r.get(key).is_some(), "row lacks {key}: {r}");
        }
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["bytes"], 3_000_000, "{r}");
        assert!(r["seconds"].as_f64().unwrap() > 0.0);
    }
    let has = |channel: &str, locality: &str| {
        rows.iter()
            .any(|r| r["channel"] == channel && r["locality"] == locality)
    };
    assert!(has("inproc", "same-process"));
    assert!(has("tcp", "remote"));
    assert!(has("shm", "same-host"), "a same-host row between two processes on shm");
    assert!(rows.iter().any(|r| r["channel"] == "shm" && r["from"] == "delta"));
    assert!(rows.iter().any(|r| r["channel"] == "shm" && r["to"] == "delta"));
    // Both directions between processes.
    assert!(rows.iter().any(|r| r["channel"] == "tcp" && r["from"] == "gamma"));
    assert!(rows.iter().any(|r| r["channel"] == "tcp" && r["to"] == "gamma"));

    // Data handles: each receiver took the path its place allows, counted at the storage server.
    let data_row = |data: &str, to: &str| {
        rows.iter()
            .find(|r| r["data"] == data && r["to"] == to)
            .unwrap_or_else(|| panic!("no row sending {data} to {to}: {rows:?}"))
    };
    let remote = data_row("demo-blob", "gamma");
    assert_eq!(
        (&remote["path"], &remote["storage_gets"], &remote["locality"]),
        (&Value::from("storage"), &Value::from(1), &Value::from("remote")),
        "a remote node fetches from storage itself: {remote}"
    );
    let local = data_row("demo-blob", "delta");
    assert_eq!(
        (&local["path"], &local["storage_gets"], &local["channel"]),
        (&Value::from("shared-cache"), &Value::from(0), &Value::from("shm")),
        "a same-host node sharing the cache does not download again: {local}"
    );
    let fallback = data_row("alpha-notes", "gamma");
    assert_eq!(
        (&fallback["path"], &fallback["storage_gets"]),
        (&Value::from("remote-blob"), &Value::from(0)),
        "a dataset the receiver's catalog lacks comes from the sender: {fallback}"
    );
    if let Some(py) = rows.iter().find(|r| r["data"] == "demo-blob" && r["to"] == "py-remote") {
        assert_eq!(py["path"], "remote-blob", "the Python worker has no catalog: {py}");
    }
    // Each value row is the route's first transfer (cold), with the warm median of its repeats beside it;
    // a data-handle row is a first read, with no warm figure. (Dask's rows, where Dask is installed, are
    // python/tests/test_demo.py's.)
    for r in rows
        .iter()
        .filter(|r| !r["from"].as_str().unwrap().starts_with("dask-"))
    {
        assert_eq!(r["cold"], true, "{r}");
        if r["data"].is_null() {
            assert!(r["warm_seconds"].as_f64().is_some_and(|w| w > 0.0), "{r}");
        } else {
            assert!(r.get("warm_seconds").is_none(), "{r}");
        }
    }
    // Plain rows keep their keys only.
    assert!(rows
        .iter()
        .filter(|r| r["data"].is_null())
        .all(|r| r.get("path").is_none()));
}

#[test]
fn bench_quick_json_has_every_case_with_stable_keys() {
    let cases = run_json(&["bench", "--quick", "--json"]);
    let cases = cases.as_array().expect("an array");
    for name in [
        "inproc-msg",
        "tcp-rtt",
        "tcp-stream",
        "shm-view",
        "shm-read",
        "tcp-read",
        "shm-copy-in",
        "ticket-pull",
        "ticket-3party",
    ] {
        assert!(cases.iter().any(|c| c["case"] == name), "missing case {name}");
    }
    for c in cases {
        for key in ["case", "channel", "bytes", "ours", "baseline", "efficiency"] {
            assert!(c.get(key).is_some(), "case lacks {key}: {c}");
        }
        let ours = c["ours"].as_f64().unwrap();
        let baseline = c["baseline"].as_f64().unwrap();
        assert!(ours > 0.0 && baseline > 0.0, "{c}");
        let eff = c["efficiency"].as_f64().unwrap();
        assert!((eff - baseline / ours).abs() < 1e-9, "{c}");
    }
}

/// Starts `handoff node` and returns the child and its ready line.
fn start_node(args: &[&str]) -> (std::process::Child, Value) {
    let mut child = handoff()
        .arg("node")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn node");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad ready line {line:?}: {e}"));
    (child, ready)
}

#[test]
fn a_node_with_the_wrong_secret_is_refused_on_both_sides() {
    let dir = std::env::temp_dir().join(format!("handoff-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good");
    let bad = dir.join("bad");
    std::fs::write(&good, "right\n").unwrap();
    std::fs::write(&bad, "wrong\n").unwrap();
    let (mut server, ready) = start_node(&["--name", "server", "--secret-file", good.to_str().unwrap()]);
    let addr = ready["listen"].as_str().unwrap().to_string();

    let out = handoff()
        .args([
            "node",
            "--name",
            "intruder",
            "--secret-file",
            bad.to_str().unwrap(),
            "--connect",
            &addr,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("authentication failed"), "client stderr: {err}");

    std::thread::sleep(Duration::from_millis(200));
    server.kill().unwrap();
    let out = server.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("refused connection") && log.contains("authentication failed"),
        "server log: {log}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_command_lines_get_clear_errors() {
    let out = handoff()
        .args(["node", "--name", "x", "--secret-file", "/nonexistent/secret"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reading the cluster secret from /nonexistent/secret"),
        "{err}"
    );

    let out = handoff()
        .args(["node", "--name", "x", "--listen", "not-an-address"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("listening on not-an-address"));

    let out = handoff().args(["demo", "--bytes", "lots"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'lots'"));
}

#[test]
fn bench_remote_measures_a_node_elsewhere_against_its_raw_listener() {
    let dir = std::env::temp_dir().join(format!("handoff-cli-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "remote bench\n").unwrap();
    let secret = secret.to_str().unwrap();
    let (mut far, ready) = start_node(&[
        "--name",
        "far",
        "--host-id",
        "far-host",
        "--raw-listen",
        "127.0.0.1:0",
        "--ticket-threshold",
        "65536",
        "--secret-file",
        secret,
    ]);
    let (addr, raw) = (ready["listen"].as_str().unwrap(), ready["raw_listen"].as_str().unwrap());
    let remote = ["--remote", addr, "--raw-remote", raw, "--secret-file", secret];
    let mut args = vec!["bench", "--only", "remote", "--json", "--sizes", "1M", "--reps", "1"];
    args.extend(remote);
    let cases = run_json(&args);
    let cases = cases.as_array().expect("an array");
    let names: Vec<&str> = cases.iter().map(|c| c["case"].as_str().unwrap()).collect();
    assert_eq!(names, ["remote-rtt", "remote-ticket-pull"], "{cases:?}");
    for c in cases {
        assert_eq!(c["channel"], "tcp", "{c}");
        assert!(
            c["ours"].as_f64().unwrap() > 0.0 && c["baseline"].as_f64().unwrap() > 0.0,
            "{c}"
        );
    }
    let pull = &cases[1];
    assert_eq!(pull["bytes"], 1 << 20);
    let (ours, base, rtt) = (
        pull["ours"].as_f64().unwrap(),
        pull["baseline"].as_f64().unwrap(),
        pull["round_trip"].as_f64().unwrap(),
    );
    assert!(rtt > 0.0, "{pull}");
    assert!((pull["extra_round_trips"].as_f64().unwrap() - (ours - base) / rtt).abs() < 1e-9);

    // Without the remote's addresses the remote cases are refused, with a clear error.
    let out = handoff().args(["bench", "--only", "remote-rtt"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("need --remote"), "{err}");
    // A node that sends inline (no ticket threshold) is named as the cause.
    let (mut inline, ready) = start_node(&[
        "--name",
        "inline",
        "--host-id",
        "inline-host",
        "--raw-listen",
        "127.0.0.1:0",
        "--secret-file",
        secret,
    ]);
    let (addr, raw) = (ready["listen"].as_str().unwrap(), ready["raw_listen"].as_str().unwrap());
    let out = handoff()
        .args(["bench", "--only", "remote-ticket-pull", "--sizes", "1M", "--reps", "1"])
        .args(["--remote", addr, "--raw-remote", raw, "--secret-file", secret])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ticket-threshold"), "{err}");
    for child in [&mut far, &mut inline] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
