//! Measures where shared memory starts to beat copying bytes through the Unix socket, to
//! choose the default `shm_threshold`: for each size, the median time from send until the
//! receiver has read every byte, with the buffer inline (threshold above the size) and as
//! shared memory (a heap buffer copied into a warm pool, the common case).
//!
//! `cargo run --release -p handoff --example shm_threshold`

use std::time::{Duration, Instant};

use handoff::{Buffer, Channel, Message, Node};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Blob {
    data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "example.Blob";
}

async fn pair(name: &str, threshold: usize) -> (Node, Node, handoff::Peer) {
    let a = Node::builder(format!("{name}-a"))
        .secret("x")
        .shm_threshold(threshold)
        .build()
        .await
        .unwrap();
    let b = Node::builder(format!("{name}-b"))
        .secret("x")
        .listen("127.0.0.1:0")
        .register::<Blob>()
        .build()
        .await
        .unwrap();
    let p = a
        .connect_with(b.listen_addr().unwrap(), Some(Channel::Shm))
        .await
        .unwrap();
    (a, b, p)
}

async fn median_seconds(peer: &handoff::Peer, rx: &Node, data: &Buffer) -> f64 {
    let mut times = Vec::new();
    for i in 0..201 {
        let started = Instant::now();
        peer.send(Blob { data: data.clone() }).await.unwrap();
        let blob: Blob = rx
            .recv_timeout(Duration::from_secs(10))
            .await
            .unwrap()
            .decode()
            .unwrap();
        let sum: u64 = blob.data.iter().map(|b| *b as u64).sum();
        std::hint::black_box(sum);
        if i > 0 {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[tokio::main]
async fn main() {
    let (_a1, inline_rx, inline) = pair("inline", usize::MAX).await;
    let (_a2, shm_rx, shared) = pair("shared", 0).await;
    println!("{:>9}  {:>12}  {:>12}", "bytes", "inline µs", "shm µs");
    for size in [
        1usize << 10,
        4 << 10,
        16 << 10,
        32 << 10,
        64 << 10,
        128 << 10,
        256 << 10,
        1 << 20,
    ] {
        let data = Buffer::from(vec![7u8; size]);
        let t_inline = median_seconds(&inline, &inline_rx, &data).await;
        let t_shm = median_seconds(&shared, &shm_rx, &data).await;
        println!("{size:>9}  {:>12.1}  {:>12.1}", t_inline * 1e6, t_shm * 1e6);
    }
}
