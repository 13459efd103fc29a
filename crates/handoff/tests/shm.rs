//! The same-host channel: shared memory, zero copy, leases returned when released.

mod common;
use common::wait_until;

use std::time::Duration;

use handoff::shm::{self, segment_info};
use handoff::{Buffer, Channel, Locality, Message, Node, SharedBufMut};
use serde::{Deserialize, Serialize};

const SECRET: &str = "shm-secret";
const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Frame {
    seq: u64,
    data: Buffer,
    small: Buffer,
}
impl Message for Frame {
    const TYPE_NAME: &'static str = "test.Frame";
}

async fn node(name: &str) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Frame>()
        .build()
        .await
        .unwrap()
}

fn filled(len: usize, seed: u8) -> Buffer {
    let mut b = SharedBufMut::new(len).unwrap();
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    b.freeze()
}

#[tokio::test]
async fn same_host_peers_use_shm_and_the_view_is_the_same_memory() {
    let a = node("zc-a").await;
    let b = node("zc-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm, "same host id and a reachable socket: shm");
    assert_ne!(peer.locality(), Locality::Remote);

    let data = filled(1 << 20, 3);
    let local = segment_info(&data).expect("a shared buffer lives in a segment");
    let pool_id = local.pool_id.unwrap();
    peer.send(Frame {
        seq: 1,
        data: data.clone(),
        small: Buffer::from_static(b"tiny"),
    })
    .await
    .unwrap();
    let env = b.recv_timeout(T).await.unwrap();
    assert_eq!(env.channel(), Channel::Shm);
    let got: Frame = env.decode().unwrap();
    assert_eq!(got.data, data);
    let remote = segment_info(&got.data).expect("received as a view of the segment");
    assert_eq!(
        (remote.device, remote.inode),
        (local.device, local.inode),
        "same memfd: no copy"
    );
    assert_eq!(remote.offset, local.offset);
    assert!(segment_info(&got.small).is_none(), "small buffers travel inline");
    assert_eq!(&got.small[..], b"tiny");

    // Held by the receiver: not back in the pool even though we drop ours.
    drop(data);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!shm::pool().is_idle(pool_id), "the receiver still holds a view");
    assert_eq!(peer.leases().count, 1);
    drop(got);
    wait_until("the segment returns to the pool", || shm::pool().is_idle(pool_id)).await;
    assert_eq!(peer.leases().count, 0);
}

#[tokio::test]
async fn heap_buffers_are_copied_in_above_the_threshold_only() {
    let a = node("copyin-a").await;
    let b = node("copyin-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let big = Buffer::from(vec![7u8; 300_000]);
    let small = Buffer::from(vec![9u8; 1000]);
    peer.send(Frame {
        seq: 2,
        data: big.clone(),
        small: small.clone(),
    })
    .await
    .unwrap();
    let got: Frame = b.recv_timeout(T).await.unwrap().decode().unwrap();
    assert!(segment_info(&got.data).is_some(), "300 kB goes through shared memory");
    assert!(segment_info(&got.small).is_none(), "1 kB goes inline");
    assert_eq!(got.data, big);
    assert_eq!(got.small, small);
}

#[tokio::test]
async fn forwarding_to_a_third_node_passes_the_same_segment() {
    let a = node("fwd-a").await;
    let b = node("fwd-b").await;
    let c = node("fwd-c").await;
    let ab = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let bc = b.connect(c.listen_addr().unwrap()).await.unwrap();
    assert_eq!(bc.channel(), Channel::Shm);
    let data = filled(2 << 20, 5);
    let local = segment_info(&data).unwrap();
    let pool_id = local.pool_id.unwrap();
    ab.send(Frame {
        seq: 3,
        data: data.clone(),
        small: Buffer::new(),
    })
    .await
    .unwrap();
    drop(data);
    let at_b: Frame = b.recv_timeout(T).await.unwrap().decode().unwrap();
    bc.send(at_b.clone()).await.unwrap();
    let at_c: Frame = c.recv_timeout(T).await.unwrap().decode().unwrap();
    let seen = segment_info(&at_c.data).unwrap();
    assert_eq!(
        (seen.device, seen.inode, seen.offset),
        (local.device, local.inode, local.offset)
    );
    drop(at_b);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!shm::pool().is_idle(pool_id), "C still holds the segment through B");
    assert_eq!(&at_c.data[..4], &filled_prefix(5)[..]);
    drop(at_c);
    wait_until("the segment returns once every holder is done", || {
        shm::pool().is_idle(pool_id)
    })
    .await;
}

fn filled_prefix(seed: u8) -> [u8; 4] {
    [
        seed,
        31u8.wrapping_add(seed),
        62u8.wrapping_add(seed),
        93u8.wrapping_add(seed),
    ]
}

#[tokio::test]
async fn a_receiver_that_disconnects_holding_a_frame_keeps_it_and_the_segment_is_not_reused() {
    // The receiver's process (this one) lives on and still maps the segment after its
    // connection closed: the lease ends with the connection, but the segment must not go
    // back to the pool while that process lives, or the next send of that size would write
    // into the frame it holds. (When the peer's process exits, it does: the Python suite's
    // killed-worker test.)
    let a = node("gone-a").await;
    let b = node("gone-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let data = filled(1 << 20, 1);
    let pool_id = segment_info(&data).unwrap().pool_id.unwrap();
    peer.send(Frame {
        seq: 4,
        data: data.clone(),
        small: Buffer::new(),
    })
    .await
    .unwrap();
    drop(data);
    let held: Frame = b.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(peer.leases().count, 1);
    b.shutdown();
    wait_until("the lease ends with the connection", || peer.leases().count == 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // (the sweep looks every 50 ms)
    assert!(
        !shm::pool().is_idle(pool_id),
        "a segment a live receiver maps is not reused"
    );
    let next = filled(1 << 20, 2); // what a reuse would have written into `held`
    assert_ne!(segment_info(&next).unwrap().pool_id, Some(pool_id));
    assert_eq!(
        &held.data.as_bytes()[..4],
        &filled_prefix(1),
        "the frame kept its bytes"
    );
}

#[tokio::test]
async fn sealed_mode_sends_a_sealed_copy() {
    let a = Node::builder("sealed-a")
        .secret(SECRET)
        .shm_sealed(true)
        .build()
        .await
        .unwrap();
    let b = node("sealed-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    let data = filled(1 << 20, 9);
    let local = segment_info(&data).unwrap();
    peer.send(Frame {
        seq: 5,
        data: data.clone(),
        small: Buffer::new(),
    })
    .await
    .unwrap();
    let got: Frame = b.recv_timeout(T).await.unwrap().decode().unwrap();
    let seen = segment_info(&got.data).unwrap();
    assert!(seen.sealed, "the receiver checked the seals");
    assert_ne!(seen.inode, local.inode, "a fresh memfd, not the pooled segment");
    assert_eq!(got.data, data);
}

#[tokio::test]
async fn a_pinned_tcp_peer_stays_on_tcp_and_an_unreachable_socket_falls_back() {
    let a = node("pin-a").await;
    let b = node("pin-b").await;
    let pinned = a
        .connect_with(b.listen_addr().unwrap(), Some(Channel::Tcp))
        .await
        .unwrap();
    assert_eq!(pinned.channel(), Channel::Tcp);

    let c = node("pin-c").await;
    let sock = c.unix_addr().unwrap();
    std::fs::remove_file(sock.trim_start_matches("unix://")).unwrap();
    let err = a
        .connect_with(c.listen_addr().unwrap(), Some(Channel::Shm))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unix://"), "{err}");
    let fallback = a.connect(c.listen_addr().unwrap()).await.unwrap();
    assert_eq!(fallback.channel(), Channel::Tcp, "the socket is gone: tcp");
    // Still works over tcp, buffers and all.
    let data = filled(200_000, 2);
    fallback
        .send(Frame {
            seq: 6,
            data: data.clone(),
            small: Buffer::new(),
        })
        .await
        .unwrap();
    let got: Frame = c.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.data, data);
    assert!(segment_info(&got.data).is_none());
}

#[tokio::test]
async fn remote_hosts_do_not_use_shm() {
    let a = node("far-a").await;
    let b = Node::builder("far-b")
        .secret(SECRET)
        .host_id("elsewhere")
        .listen("127.0.0.1:0")
        .register::<Frame>()
        .build()
        .await
        .unwrap();
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Tcp);
    assert_eq!(peer.locality(), Locality::Remote);
}

#[tokio::test]
async fn the_socket_and_its_folder_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let a = node("perm-a").await;
    let path = a.unix_addr().unwrap().trim_start_matches("unix://").to_string();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let dir = std::path::Path::new(&path).parent().unwrap();
    let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "runtime directory mode");
    a.shutdown();
    assert!(
        !std::path::Path::new(&path).exists(),
        "the socket is removed at shutdown"
    );
}

/// Idle shared memory goes back to the host after its idle time
/// (`HANDOFF_SHM_POOL_IDLE_SECONDS`, `HANDOFF_SHM_KEEP_SECONDS`): the sender's segment that
/// no peer maps any more is retired, and the receiver's mapping of it dropped.
#[tokio::test]
async fn idle_segments_and_mappings_are_given_back_after_their_idle_time() {
    // (Each test is a process of its own under nextest; set before the nodes start.)
    std::env::set_var("HANDOFF_SHM_POOL_IDLE_SECONDS", "0.3");
    std::env::set_var("HANDOFF_SHM_KEEP_SECONDS", "0.3");
    let a = node("idle-a").await;
    let b = node("idle-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);
    let data = filled(1 << 20, 9);
    let pool_id = segment_info(&data).unwrap().pool_id.unwrap();
    peer.send(Frame {
        seq: 1,
        data: data.clone(),
        small: Buffer::from_static(b"x"),
    })
    .await
    .unwrap();
    let got: Frame = b.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.data, data);
    assert!(b.mapped_bytes() >= 1 << 20);
    let retired = shm::pool().stats().retired;
    drop((data, got));
    wait_until("the segment comes back to the pool", || shm::pool().is_idle(pool_id)).await;
    wait_until("it is retired after its idle time", || {
        shm::pool().stats().retired > retired
    })
    .await;
    assert!(!shm::pool().is_idle(pool_id));
    wait_until("the receiver's mapping is dropped", || b.mapped_bytes() == 0).await;
}
