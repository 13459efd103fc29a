//! Buffers born in an arena (`ArenaBufMut`) between two Rust nodes of one host: the receiver
//! maps the sender's arena, and the range is reused only after the receiver released it.

use std::time::Duration;

use handoff::shm::segment_info;
use handoff::{ArenaBufMut, Buffer, Channel, Message, Node};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Blob {
    data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "test.Blob";
}

async fn node(name: &str) -> Node {
    Node::builder(name)
        .secret("arena-secret")
        .listen("127.0.0.1:0")
        .register::<Blob>()
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_arena_buffer_is_mapped_by_a_same_host_peer_and_reused_only_once_released() {
    let a = node("arena-a").await;
    let b = node("arena-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);

    let mut buf = ArenaBufMut::new(3 << 20).unwrap();
    buf.iter_mut().enumerate().for_each(|(i, x)| *x = (i % 253) as u8);
    let data = buf.freeze();
    let local = segment_info(&data).expect("an arena buffer lies in a segment");
    assert!(!local.sealed && local.pool_id.is_none(), "{local:?}");
    peer.send(Blob { data: data.clone() }).await.unwrap();
    let got: Blob = b.recv_timeout(T).await.unwrap().decode().unwrap();
    let remote = segment_info(&got.data).expect("received as a view");
    assert_eq!(
        (remote.device, remote.inode, remote.offset),
        (local.device, local.inode, local.offset)
    );
    assert_eq!(got.data, data);

    // The sender lets its buffer go; the receiver still maps the range: never reused.
    drop(data);
    let again = ArenaBufMut::new(3 << 20).unwrap().freeze();
    assert_ne!(segment_info(&again).unwrap().offset, local.offset);
    assert_eq!(peer.leases().count, 1);
    drop(got);
    let deadline = std::time::Instant::now() + T;
    while peer.leases().count != 0 {
        assert!(std::time::Instant::now() < deadline, "the receiver never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Released and freed: the range serves the next buffer, zeroed.
    let mut reused = None;
    for _ in 0..100 {
        let next = ArenaBufMut::new(3 << 20).unwrap();
        assert!(next.iter().all(|&x| x == 0), "zeroed, whatever the range held");
        let info = segment_info(&next.freeze()).unwrap();
        if info.offset == local.offset {
            reused = Some(info);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(reused.is_some(), "the released range came back into use");
    drop(again);
}
