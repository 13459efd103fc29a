//! Where the time of one same-host shared-memory send goes, in the shape of `handoff bench`'s
//! `shm-view` and `shm-copy-in` cases: two nodes of this process on the Unix socket, the
//! sender's `send` timed apart from the receiver's `recv` and `decode`.
//!
//! `cargo run --release -p handoff --example shm_latency -- MODE [BYTES] [REPS] [PAUSE_MS]`
//!
//! Modes:
//! - `view`: a shared buffer filled in place before each send (untimed), as `shm-view`;
//! - `view0`: the same buffer, filled only once: what a send costs without the fill before it;
//! - `viewheap`: `view0`, but an unrelated heap buffer of `BYTES` is filled before each send;
//! - `copy`: a heap buffer copied into the pool on each send, as `shm-copy-in`;
//! - `hash`: BLAKE3 and memcpy throughput of this machine, for the ticket cases.
//!
//! `PAUSE_MS` sleeps that long before each timed send (the runtime's threads go idle).

use std::time::{Duration, Instant};

use handoff::{Buffer, Channel, Message, Node};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Blob {
    seq: u64,
    data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "handoff.bench.Blob";
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(run());
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, default: T) -> T {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// BLAKE3 over 256 MiB in pieces of several sizes, and memcpy of the same bytes.
fn hash_throughput() {
    let v = vec![7u8; 256 << 20];
    for piece in [1usize << 20, 256 << 10, 16 << 10] {
        for _ in 0..3 {
            let t = Instant::now();
            let mut h = blake3::Hasher::new();
            for c in v.chunks(piece) {
                h.update(c);
            }
            std::hint::black_box(h.finalize());
            let gbs = v.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("blake3, {piece}-byte pieces: {gbs:.2} GB/s");
        }
    }
    let mut w = vec![0u8; v.len()];
    for _ in 0..3 {
        let t = Instant::now();
        w.copy_from_slice(&v);
        std::hint::black_box(&w);
        println!("memcpy: {:.2} GB/s", v.len() as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
}

async fn run() {
    let args: Vec<String> = std::env::args().collect();
    let mode: String = arg(&args, 1, "view".to_string());
    if mode == "hash" {
        hash_throughput();
        return;
    }
    if mode == "memcpy" {
        let size: usize = arg(&args, 2, 1 << 30);
        let src = vec![0x3cu8; size];
        let mut dst = vec![0u8; size];
        let mut seg = handoff::SharedBufMut::new(size).expect("a segment");
        seg.fill(1);
        dst.copy_from_slice(&src);
        for _ in 0..5 {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            let heap = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            seg.copy_from_slice(std::hint::black_box(&src));
            let shm = t.elapsed().as_secs_f64() * 1e3;
            println!("heap->heap {heap:.1} ms  heap->segment {shm:.1} ms");
        }
        return;
    }
    let size: usize = arg(&args, 2, 1 << 30);
    let reps: usize = arg(&args, 3, 9);
    let pause_ms: u64 = arg(&args, 4, 0);
    let build = |name: &str| {
        Node::builder(name)
            .listen("127.0.0.1:0")
            .secret("x")
            .host_id("shm-latency-host")
            .register::<Blob>()
    };
    let a = build("shm-latency-a").build().await.expect("sender");
    let b = build("shm-latency-b").build().await.expect("receiver");
    let peer = a
        .connect_with(b.listen_addr().expect("listening"), Some(Channel::Shm))
        .await
        .expect("connected");
    let heap = Buffer::from(vec![0x3cu8; size]);
    let mut scratch = if mode == "viewheap" {
        vec![1u8; size]
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    for rep in 0..=reps {
        let data = if mode.starts_with("view") {
            let mut m = handoff::SharedBufMut::new(size).expect("a segment");
            if mode == "view" || rep == 0 {
                m.fill(rep as u8);
            }
            m.freeze()
        } else {
            heap.clone()
        };
        if mode == "viewheap" {
            scratch.fill(rep as u8);
            std::hint::black_box(&scratch);
        }
        if pause_ms > 0 {
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        }
        let t0 = Instant::now();
        peer.send(Blob { seq: 0, data }).await.expect("sent");
        let t1 = Instant::now();
        let env = b.recv_timeout(Duration::from_secs(60)).await.expect("received");
        let t2 = Instant::now();
        let blob: Blob = env.decode().expect("decoded");
        let t3 = Instant::now();
        drop(std::hint::black_box(blob));
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        rows.push((us(t1 - t0), us(t2 - t1), us(t3 - t2), us(t3 - t0)));
        // As the bench does: wait for the release, so the next send reuses the warm segment.
        let deadline = Instant::now() + Duration::from_secs(10);
        while peer.leases().count > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
    }
    for (send, recv, decode, total) in &rows[1..] {
        println!("send {send:8.1}  recv {recv:8.1}  decode {decode:6.1}  total {total:8.1} µs");
    }
    let mut totals: Vec<f64> = rows[1..].iter().map(|r| r.3).collect();
    totals.sort_by(f64::total_cmp);
    println!("median total {:.1} µs", totals[totals.len() / 2]);
}
