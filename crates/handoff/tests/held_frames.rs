//! Received frames held by the thousand keep no descriptor open: a mapping of a received
//! segment closes its descriptor (the cache finds the segment again by device and inode),
//! and only the descriptors of the segments received last are kept, for forwarding.

mod common;
use common::wait_until;

use std::time::Duration;

use handoff::shm::segment_info;
use handoff::{Buffer, Channel, Message, Node, SharedBufMut};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(20);
const FRAMES: usize = 10_000;
const FRAME: usize = 4096;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Slice {
    seq: u64,
    data: Buffer,
}
impl Message for Slice {
    const TYPE_NAME: &'static str = "test.Slice";
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_held_frames_keep_no_descriptor_open() {
    let build = |name: &'static str| {
        Node::builder(name)
            .secret("held-frames")
            .listen("127.0.0.1:0")
            .register::<Slice>()
            .build()
    };
    let a = build("held-a").await.unwrap();
    let b = build("held-b").await.unwrap();
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);

    // One segment of the sender's, sent as 10,000 small slices: each arrives as its own
    // descriptor and is mapped as its own window (the segment is much larger than a frame).
    let mut whole = SharedBufMut::new(FRAMES * FRAME).unwrap();
    for (i, x) in whole.iter_mut().enumerate() {
        *x = (i / FRAME) as u8 ^ (i as u8);
    }
    let whole = whole.freeze();
    let before = open_descriptors();
    let mut held = Vec::with_capacity(FRAMES);
    for i in 0..FRAMES {
        let data = whole.slice(i * FRAME..(i + 1) * FRAME);
        peer.send(Slice { seq: i as u64, data }).await.unwrap();
        let got: Slice = b.recv_timeout(T).await.unwrap().decode().unwrap();
        assert!(
            segment_info(&got.data).is_some(),
            "frame {i} came through shared memory"
        );
        held.push(got);
    }
    let holding = open_descriptors();
    assert!(
        holding < before + 200,
        "holding {FRAMES} received frames opened {} descriptors ({before} before, {holding} now)",
        holding.saturating_sub(before)
    );
    // Every byte is what was sent.
    for (i, s) in held.iter().enumerate() {
        assert_eq!(s.seq, i as u64);
        let want: Vec<u8> = (0..FRAME).map(|j| i as u8 ^ ((i * FRAME + j) as u8)).collect();
        assert_eq!(&s.data[..], &want[..], "frame {i}");
    }
    assert_eq!(peer.leases().count, FRAMES, "the sender keeps each frame leased");

    // Forwarding: a frame received last still has its descriptor and passes the same
    // segment on; one received long ago is sent as bytes, and arrives whole.
    let c = build("held-c").await.unwrap();
    let bc = b.connect(c.listen_addr().unwrap()).await.unwrap();
    for i in [FRAMES - 1, 0] {
        bc.send(held[i].clone()).await.unwrap();
        let at_c: Slice = c.recv_timeout(T).await.unwrap().decode().unwrap();
        assert_eq!(at_c.data, held[i].data, "frame {i} forwarded whole");
        let (here, there) = (segment_info(&held[i].data).unwrap(), segment_info(&at_c.data));
        if i == FRAMES - 1 {
            let there = there.expect("the last frame is passed on as its segment");
            assert_eq!((there.device, there.inode), (here.device, here.inode));
        } else {
            assert!(
                there.is_none_or(|t| (t.device, t.inode) != (here.device, here.inode)),
                "an old frame's descriptor was closed: it cannot be passed on"
            );
        }
    }
    drop(held);
    wait_until("every lease is released", || peer.leases().count == 0).await;
}
