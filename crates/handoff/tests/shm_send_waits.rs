//! A same-host send that waits for lease room (the peer holds as much as it may) holds no
//! copy but the one its lease waits for: frames are copied into shared memory one at a
//! time, each leased before the next is copied. Alone in its binary, since it counts the
//! process's segments.

use std::time::Duration;

use handoff::{shm, Bounds, Buffer, Channel, Node};
mod common;
use common::Frames;

const T: Duration = Duration::from_secs(10);
const F: usize = 1 << 20;

async fn node(name: &str, bounds: Bounds) -> Node {
    Node::builder(name)
        .secret("waits")
        .listen("127.0.0.1:0")
        .register::<Frames>()
        .bounds(bounds)
        .build()
        .await
        .unwrap()
}

fn heap(seed: u8) -> Buffer {
    Buffer::from(vec![seed; F])
}

/// Segments of the process's pool in use now (live and not idle).
fn segments_in_use() -> usize {
    let s = shm::pool().stats();
    s.segments - s.idle_segments
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_send_copies_its_frames_one_at_a_time() {
    let capped = Bounds {
        max_shm_lease_bytes_per_peer: 3 * F as u64,
        ..Bounds::DEFAULT
    };
    let a = node("waits-a", capped).await;
    let b = node("waits-b", Bounds::DEFAULT).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);

    // The receiver holds a message of three copied frames: all the room its sender allows.
    peer.send(Frames {
        parts: vec![heap(1), heap(2), heap(3)],
    })
    .await
    .unwrap();
    let held = b.recv_timeout(T).await.unwrap().decode::<Frames>().unwrap();
    assert_eq!(a.leases().bytes, 3 * F);

    let before = segments_in_use();
    let sending = tokio::spawn(async move {
        peer.send(Frames {
            parts: vec![heap(4), heap(5), heap(6)],
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!sending.is_finished(), "the send waits for lease room");
    assert_eq!(
        segments_in_use() - before,
        1,
        "while it waits, only the frame whose lease it waits for is copied"
    );

    drop(held);
    sending.await.unwrap().unwrap();
    let got = b.recv_timeout(T).await.unwrap().decode::<Frames>().unwrap();
    for (i, part) in got.parts.iter().enumerate() {
        assert!(part.iter().all(|&x| x == 4 + i as u8), "frame {i} intact");
    }
}
