//! Ticket failures with real processes: an owner killed before or during a pull gives the
//! holder a clear error in bounded time; a killed holder's hold ends at once; a lost
//! release ends at the deadline. Plus a short `handoff chaos` run.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use handoff::tickets::LeaseConfig;
use handoff::{Buffer, Error, Message, Node, Redeem, Ticket};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(20);

// The CLI's protocol (spec/WIRE.md, appendix A), declared as any peer would.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SendRequest {
    id: u64,
    bytes: u64,
}
impl Message for SendRequest {
    const TYPE_NAME: &'static str = "handoff.demo.SendRequest";
}
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Payload {
    id: u64,
    digest: Buffer,
    data: Buffer,
    prepare_seconds: f64,
}
impl Message for Payload {
    const TYPE_NAME: &'static str = "handoff.demo.Payload";
}
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Take {
    id: u64,
    #[serde(with = "serde_bytes")]
    digest: Vec<u8>,
    data: Buffer,
    forward_to: Option<String>,
    leak: bool,
}
impl Message for Take {
    const TYPE_NAME: &'static str = "handoff.chaos.Take";
}
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report {
    id: u64,
    node: String,
    outcome: String,
    detail: String,
}
impl Message for Report {
    const TYPE_NAME: &'static str = "handoff.chaos.Report";
}

struct Proc {
    child: Child,
    secret_file: std::path::PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.secret_file);
    }
}

/// Starts `handoff node` with `args`; returns it and its listen address.
fn start(name: &str, secret: &str, args: &[&str]) -> (Proc, String) {
    let secret_file = std::env::temp_dir().join(format!("handoff-tp-{name}-{}", std::process::id()));
    std::fs::write(&secret_file, secret).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args([
            "node",
            "--name",
            name,
            "--host-id",
            &format!("host-{name}"),
            "--secret-file",
        ])
        .arg(&secret_file)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    (
        Proc { child, secret_file },
        ready["listen"].as_str().unwrap().to_string(),
    )
}

async fn tester(name: &str, secret: &str, redeem: Redeem, ttl: Duration) -> Node {
    Node::builder(name)
        .secret(secret)
        .host_id(format!("host-{name}"))
        .listen("127.0.0.1:0")
        .register::<Payload>()
        .register::<Report>()
        .redeem(redeem)
        .leases(LeaseConfig {
            ttl,
            ..LeaseConfig::default()
        })
        .pull_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_before_the_pull_gives_a_clear_error() {
    let secret = "tp-secret-1";
    let (mut owner, addr) = start("owner-before", secret, &["--ticket-threshold", "0"]);
    let me = tester("holder-before", secret, Redeem::Lazy, Duration::from_secs(30)).await;
    let to_owner = me.connect(&addr).await.unwrap();
    to_owner.send(SendRequest { id: 1, bytes: 4 << 20 }).await.unwrap();
    let payload: Payload = me.recv_timeout(T).await.unwrap().decode().unwrap();
    let ticket = Ticket::of(&payload.data).expect("sent by ticket");
    owner.child.kill().unwrap(); // SIGKILL
    owner.child.wait().unwrap();
    let started = Instant::now();
    let err = ticket.redeem().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, Error::OwnerLost { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("owner-before") || text.contains(&ticket.owner()[..8]),
        "names the owner: {text}"
    );
    assert!(
        text.contains(&format!("lease {}", ticket.lease())),
        "names the lease: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_during_a_pull_gives_an_error_or_the_whole_verified_buffer() {
    let secret = "tp-secret-2";
    let (mut owner, addr) = start("owner-during", secret, &["--ticket-threshold", "0"]);
    let me = tester("holder-during", secret, Redeem::Lazy, Duration::from_secs(30)).await;
    let to_owner = me.connect(&addr).await.unwrap();
    to_owner
        .send(SendRequest {
            id: 2,
            bytes: 128 << 20,
        })
        .await
        .unwrap();
    let payload: Payload = me.recv_timeout(T).await.unwrap().decode().unwrap();
    let ticket = Ticket::of(&payload.data).unwrap();
    let pulling = tokio::spawn(async move { ticket.redeem().await });
    tokio::time::sleep(Duration::from_millis(3)).await;
    owner.child.kill().unwrap();
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(10), pulling)
        .await
        .expect("no hang")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    match result {
        // Finished before the kill: the runtime checked it against the ticket's digest.
        Ok(bytes) => assert_eq!(bytes.len(), 128 << 20),
        Err(e) => assert!(matches!(e, Error::OwnerLost { .. }), "{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_ends_its_hold_and_a_lost_release_ends_at_the_deadline() {
    let secret = "tp-secret-3";
    let me = tester("chaos", secret, Redeem::Eager, Duration::from_millis(500)).await;
    let addr = me.listen_addr().unwrap().to_string();
    let (mut holder, _) = start("holder-killed", secret, &["--redeem", "lazy", "--connect", &addr]);
    let (_leaker, _) = start("holder-leaks", secret, &["--redeem", "lazy", "--connect", &addr]);
    let killed = me.wait_for_peer("holder-killed", T).await.unwrap();
    let leaker = me.wait_for_peer("holder-leaks", T).await.unwrap();
    let take = |leak: bool| Take {
        id: 9,
        digest: vec![0; 32],
        data: Buffer::from(vec![5u8; 1 << 20]),
        forward_to: None,
        leak,
    };

    // The leaker keeps its hold and never releases it: the deadline ends it.
    leaker.send_by_ticket(take(true)).await.unwrap();
    let report = loop {
        let r: Report = me.recv_timeout(T).await.unwrap().decode().unwrap();
        if r.outcome != "received" {
            break r;
        }
    };
    assert_eq!(report.outcome, "leaked");
    assert_eq!(me.ticket_leases().count, 1);
    let started = Instant::now();
    while me.ticket_leases().count > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the deadline never freed the lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "not before the deadline"
    );

    // A holder that is killed while it holds: its hold ends with its connection.
    let holding = me.ticket_leases();
    assert_eq!(holding.count, 0);
    killed
        .send_by_ticket(Take {
            forward_to: Some("nobody".into()),
            ..take(false)
        })
        .await
        .unwrap();
    // (It cannot forward to "nobody"; it still holds the ticket until it drops the message.)
    holder.child.kill().unwrap();
    holder.child.wait().unwrap();
    let started = Instant::now();
    while me.ticket_leases().count > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the lost connection did not end the hold"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn a_short_chaos_run_keeps_every_invariant() {
    let out = Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args([
            "chaos",
            "--iterations",
            "12",
            "--seed",
            "3",
            "--max-bytes",
            "4194304",
            "--json",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["iterations"], 12);
    for key in ["leaked_leases", "premature_frees", "corrupt_reads"] {
        assert_eq!(v[key], 0, "{key}: {v}");
    }
    assert!(v["errors"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_stats_shows_the_leases_of_a_running_node() {
    let secret = "tp-secret-4";
    let (owner, addr) = start("owner-stats", secret, &["--ticket-threshold", "0"]);
    let me = tester("holder-stats", secret, Redeem::Lazy, Duration::from_secs(30)).await;
    let to_owner = me.connect(&addr).await.unwrap();
    to_owner.send(SendRequest { id: 3, bytes: 1 << 20 }).await.unwrap();
    let payload: Payload = me.recv_timeout(T).await.unwrap().decode().unwrap();
    let stats = |addr: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_handoff"))
            .args(["stats", "--connect", addr, "--json", "--secret-file"])
            .arg(&owner.secret_file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let held = stats(&addr);
    assert_eq!(held["node"], "owner-stats");
    // The payload's data and digest each travel as a ticket.
    assert_eq!(held["ticket_leases"]["count"], 2, "{held}");
    assert_eq!(held["ticket_leases"]["bytes"], (1 << 20) + 32, "{held}");
    assert!(held["ticket_leases"]["oldest_seconds"].as_f64().unwrap() >= 0.0);
    drop(payload);
    let started = Instant::now();
    loop {
        let now = stats(&addr);
        if now["ticket_leases"]["count"] == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "released leases stay: {now}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
