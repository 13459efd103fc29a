//! The same-host channel between real processes: zero copy across processes, segments
//! returned after a release and after the receiver is killed with SIGKILL, and zero-copy
//! forwarding to a third process that keeps the segment out of the pool while it holds it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use handoff::shm::{self, segment_info, SegmentInfo};
use handoff::{Buffer, Channel, Message, Node, Peer, SharedBufMut};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(20);

// The CLI's demo protocol (spec/WIRE.md, appendix A), declared here as any peer would.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Hold {
    id: u64,
    data: Buffer,
}
impl Message for Hold {
    const TYPE_NAME: &'static str = "handoff.demo.Hold";
}
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Held {
    id: u64,
    holder: String,
    bytes: u64,
    segment: Option<SegmentInfo>,
}
impl Message for Held {
    const TYPE_NAME: &'static str = "handoff.demo.Held";
}
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Release {
    id: u64,
}
impl Message for Release {
    const TYPE_NAME: &'static str = "handoff.demo.Release";
}
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Forward {
    id: u64,
    to: String,
    data: Buffer,
}
impl Message for Forward {
    const TYPE_NAME: &'static str = "handoff.demo.Forward";
}

struct Cluster {
    node: Node,
    secret_file: std::path::PathBuf,
    children: Vec<Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.secret_file);
    }
}

impl Cluster {
    async fn new(name: &str) -> Cluster {
        let secret = format!("secret-{name}-{}", std::process::id());
        let secret_file = std::env::temp_dir().join(format!("handoff-{name}-{}.secret", std::process::id()));
        std::fs::write(&secret_file, &secret).unwrap();
        let node = Node::builder(name)
            .secret(secret)
            .listen("127.0.0.1:0")
            .register::<Held>()
            .build()
            .await
            .unwrap();
        Cluster {
            node,
            secret_file,
            children: Vec::new(),
        }
    }

    /// Starts `handoff node` connecting to us (and to `extra`); returns its listen address.
    fn spawn(&mut self, name: &str, extra: &[String]) -> String {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_handoff"));
        cmd.args(["node", "--name", name, "--secret-file"])
            .arg(&self.secret_file)
            .args(["--connect", self.node.listen_addr().unwrap()]);
        for e in extra {
            cmd.args(["--connect", e]);
        }
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn handoff node");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
        self.children.push(child);
        ready["listen"].as_str().unwrap().to_string()
    }

    async fn shm_peer(&self, name: &str) -> Peer {
        let deadline = tokio::time::Instant::now() + T;
        loop {
            if let Some(p) = self
                .node
                .peer(name)
                .filter(|p| p.channel() == Channel::Shm && !p.is_closed())
            {
                return p;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never connected over shm"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn held(&self) -> Held {
        self.node.recv_timeout(T).await.unwrap().decode::<Held>().unwrap()
    }
}

fn pattern(len: usize) -> Buffer {
    let mut b = SharedBufMut::new(len).unwrap();
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    b.freeze()
}

async fn wait_idle(pool_id: u64, what: &str) {
    let deadline = tokio::time::Instant::now() + T;
    while !shm::pool().is_idle(pool_id) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "segment not back in the pool: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_return_after_release_and_after_sigkill() {
    let mut cluster = Cluster::new("owner-1").await;
    cluster.spawn("holder", &[]);
    let holder = cluster.shm_peer("holder").await;

    // Zero copy across processes: the holder's view is the same memfd at the same offset.
    let data = pattern(4 << 20);
    let local = segment_info(&data).unwrap();
    let pool_id = local.pool_id.unwrap();
    holder
        .send(Hold {
            id: 1,
            data: data.clone(),
        })
        .await
        .unwrap();
    let held = cluster.held().await;
    assert_eq!(held.bytes, 4 << 20);
    let seen = held.segment.expect("held in shared memory");
    assert_eq!(
        (seen.device, seen.inode, seen.offset),
        (local.device, local.inode, local.offset)
    );
    drop(data);

    // Released by the holder: back in the pool.
    holder.send(Release { id: 1 }).await.unwrap();
    assert_eq!(cluster.held().await.bytes, 4 << 20);
    wait_idle(pool_id, "after the holder released it").await;

    // Held by a holder that is then killed: back in the pool too.
    let data = pattern(4 << 20);
    let pool_id = segment_info(&data).unwrap().pool_id.unwrap();
    holder
        .send(Hold {
            id: 2,
            data: data.clone(),
        })
        .await
        .unwrap();
    cluster.held().await;
    drop(data);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!shm::pool().is_idle(pool_id), "the holder still has it");
    assert_eq!(holder.leases().count, 1);
    let mut child = cluster.children.pop().unwrap();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    wait_idle(pool_id, "after the holder was killed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_to_a_third_process_is_zero_copy_and_keeps_the_segment() {
    let mut cluster = Cluster::new("owner-2").await;
    let c_addr = cluster.spawn("c", &[]);
    cluster.spawn("b", &[c_addr]);
    let b = cluster.shm_peer("b").await;
    let c = cluster.shm_peer("c").await;

    let data = pattern(8 << 20);
    let local = segment_info(&data).unwrap();
    let pool_id = local.pool_id.unwrap();
    b.send(Forward {
        id: 7,
        to: "c".into(),
        data: data.clone(),
    })
    .await
    .unwrap();
    let held = cluster.held().await;
    assert_eq!(held.holder, "c");
    let seen = held.segment.expect("c holds a shared view");
    assert_eq!(
        (seen.device, seen.inode, seen.offset),
        (local.device, local.inode, local.offset),
        "zero copy"
    );
    drop(data);

    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!shm::pool().is_idle(pool_id), "c holds it (through b)");
    // Not reused while a holder remains: a new buffer of the same size gets another segment.
    let other = SharedBufMut::new(8 << 20).unwrap();
    assert_ne!(other.segment().id(), pool_id);
    drop(other);

    c.send(Release { id: 7 }).await.unwrap();
    assert_eq!(cluster.held().await.bytes, 8 << 20);
    wait_idle(pool_id, "after c released and b let go").await;
}
