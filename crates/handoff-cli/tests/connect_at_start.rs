//! `handoff node --connect` at start, with real processes: nodes of a cluster start in any
//! order, so a peer that is not up yet is retried until `--connect-timeout`; a refusal is not.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

fn handoff(log: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_handoff"));
    c.env("HANDOFF_LOG", log);
    c
}

/// A loopback port that nothing listens on (bound and released at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `handoff node` whose stdout lines and stderr arrive on channels.
struct NodeProc {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

impl NodeProc {
    fn spawn(args: &[&str]) -> NodeProc {
        let mut child = handoff("warn,handoff=info")
            .arg("node")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn handoff node");
        NodeProc {
            stdout: lines(child.stdout.take().unwrap()),
            stderr: lines(child.stderr.take().unwrap()),
            child,
        }
    }

    /// The ready line (printed once the node is connected to every --connect peer).
    fn ready(&mut self, within: Duration) -> Value {
        match self.stdout.recv_timeout(within) {
            Ok(line) => serde_json::from_str(&line).unwrap_or_else(|e| panic!("bad ready line {line:?}: {e}")),
            Err(e) => {
                let _ = self.child.kill();
                panic!("no ready line within {within:?} ({e}); stderr: {}", self.log_so_far())
            }
        }
    }

    fn log_so_far(&self) -> String {
        self.stderr.try_iter().collect::<Vec<_>>().join("\n")
    }

    /// Kills the node and returns its whole stderr.
    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut log = Vec::new();
        while let Ok(line) = self.stderr.recv_timeout(Duration::from_secs(5)) {
            log.push(line);
        }
        log.join("\n")
    }
}

fn lines(from: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Runs a command that must end within `limit`; returns its status, stderr and run time.
fn run_bounded(cmd: &mut Command, limit: Duration) -> (std::process::ExitStatus, String, Duration) {
    let started = Instant::now();
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn handoff");
    let stderr = lines(child.stderr.take().unwrap());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "still running after {limit:?}: {}",
                stderr.try_iter().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let mut log = Vec::new();
    while let Ok(line) = stderr.recv_timeout(Duration::from_secs(5)) {
        log.push(line);
    }
    (status, log.join("\n"), took)
}

/// The line the CLI prints for the error it exits with.
fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in: {stderr}"))
}

#[test]
fn two_nodes_that_connect_to_each_other_at_start_both_come_up() {
    let (pa, pb) = (free_port(), free_port());
    let (a_addr, b_addr) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    // `a` starts first and dials `b`, which is not up yet: it must retry, not exit.
    let mut a = NodeProc::spawn(&["--name", "a", "--listen", &a_addr, "--connect", &b_addr]);
    std::thread::sleep(Duration::from_millis(400));
    assert!(a.child.try_wait().unwrap().is_none(), "a exited: {}", a.log_so_far());
    let mut b = NodeProc::spawn(&["--name", "b", "--listen", &b_addr, "--connect", &a_addr]);

    let ready_b = b.ready(Duration::from_secs(20));
    let ready_a = a.ready(Duration::from_secs(20));
    assert_eq!(ready_a["listen"], format!("tcp://{a_addr}"));
    assert_eq!(ready_b["listen"], format!("tcp://{b_addr}"));

    // Each knows the other as a peer.
    for (addr, other) in [(&a_addr, "b"), (&b_addr, "a")] {
        let out = handoff("warn")
            .args(["stats", "--json", "--connect", addr])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "stats of {addr}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
        let peers: Vec<&str> = stats["peers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[0].as_str().unwrap())
            .collect();
        assert!(peers.contains(&other), "{addr} has peers {peers:?}");
    }

    std::thread::sleep(Duration::from_millis(300));
    assert!(a.child.try_wait().unwrap().is_none(), "a exited");
    assert!(b.child.try_wait().unwrap().is_none(), "b exited");
    let (log_a, log_b) = (a.stop(), b.stop());
    for log in [&log_a, &log_b] {
        let failed = |l: &str| l.starts_with("error:") || l.contains(" ERROR ");
        assert!(!log.lines().any(failed), "{log}");
    }
    assert!(
        log_a.contains("not up yet, retrying") && log_a.contains("attempt=1"),
        "a's log shows no retry: {log_a}"
    );
    for log in [&log_a, &log_b] {
        assert!(log.contains("connected"), "{log}");
    }
}

#[test]
fn a_peer_that_never_comes_up_fails_after_the_connect_timeout_naming_the_cause_once() {
    let addr = format!("127.0.0.1:{}", free_port());
    let (status, stderr, took) = run_bounded(
        handoff("warn").args([
            "node",
            "--name",
            "lonely",
            "--connect",
            &addr,
            "--connect-timeout",
            "1s",
        ]),
        Duration::from_secs(15),
    );
    assert!(!status.success(), "{stderr}");
    assert!(took >= Duration::from_millis(900), "gave up after {took:?}: {stderr}");
    let error = error_line(&stderr);
    assert_eq!(error.matches(&addr).count(), 1, "{error}");
    assert_eq!(error.to_lowercase().matches("refused").count(), 1, "{error}");
    assert!(error.contains("gave up after"), "{error}");
    let retries = stderr.lines().filter(|l| l.contains("not up yet, retrying")).count();
    assert!(retries >= 1, "no retry in the log: {stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("attempt=1") && l.contains(&addr) && l.contains("retry_in_ms=")),
        "{stderr}"
    );
}

#[test]
fn a_wrong_secret_is_not_retried() {
    let dir = std::env::temp_dir().join(format!("handoff-connect-at-start-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (good, bad) = (dir.join("good"), dir.join("bad"));
    std::fs::write(&good, "right\n").unwrap();
    std::fs::write(&bad, "wrong\n").unwrap();
    let mut server = NodeProc::spawn(&["--name", "server", "--secret-file", good.to_str().unwrap()]);
    let ready = server.ready(Duration::from_secs(20));
    let addr = ready["listen"].as_str().unwrap().to_string();

    let (status, stderr, took) = run_bounded(
        handoff("warn").args([
            "node",
            "--name",
            "intruder",
            "--secret-file",
            bad.to_str().unwrap(),
            "--connect",
            &addr,
            "--connect-timeout",
            "30s",
        ]),
        Duration::from_secs(20),
    );
    server.stop();
    std::fs::remove_dir_all(&dir).ok();
    assert!(!status.success(), "{stderr}");
    assert!(took < Duration::from_secs(5), "a refusal took {took:?}: {stderr}");
    assert!(!stderr.contains("not up yet"), "a refusal was retried: {stderr}");
    let error = error_line(&stderr);
    assert!(error.contains("authentication failed"), "{error}");
    assert_eq!(error.matches("authentication failed").count(), 1, "{error}");
}
