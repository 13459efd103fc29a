//! Bad shared-memory input from a same-host peer: missing, unexpected or mismatched file
//! descriptors get a clear `bad-shm` error, that connection closes, the node keeps serving.

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

mod raw;

use handoff::wire::framing::encode_header_into;
use handoff::wire::{decode_message, Descriptor, Header, Limits};
use handoff::{Buffer, Channel, Message, Node};
use raw::RawSide;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use serde::{Deserialize, Serialize};

const SECRET: &str = "bad-shm-secret";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Blob {
    data: Buffer,
}
impl Message for Blob {
    const TYPE_NAME: &'static str = "test.Blob";
}

async fn server(name: &str) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Blob>()
        .build()
        .await
        .unwrap()
}

fn header(h: &Header<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_header_into(h, &mut out);
    out
}

fn read_header(s: &mut UnixStream) -> Vec<u8> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut h = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut h).unwrap();
    h
}

/// Connects to the node's Unix socket and handshakes by hand (blocking).
fn handshaken(path: &str) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let ident = raw::ident(
        "000000000000000000000000000000aa",
        "raw-shm",
        "000000000000000000000000000000bb",
        &["inline", "shm"],
    );
    let mut me = RawSide::v3(SECRET, ident);
    s.write_all(&me.preamble()).unwrap();
    let mut pre = [0u8; 16];
    s.read_exact(&mut pre).unwrap();
    s.write_all(&me.first()).unwrap();
    let peer_challenge = read_header(&mut s);
    s.write_all(&me.auth(&pre, &peer_challenge)).unwrap();
    read_header(&mut s);
    s.write_all(&me.ident()).unwrap();
    read_header(&mut s);
    s.write_all(&me.ready()).unwrap();
    assert_eq!(
        Header::decode(&read_header(&mut s), &Limits::default()).unwrap(),
        Header::Ready
    );
    s
}

fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[OwnedFd]) {
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
    let n = rustix::net::sendmsg(s, &[IoSlice::new(bytes)], &mut control, SendFlags::empty()).unwrap();
    assert_eq!(n, bytes.len());
}

/// A memfd of `size` bytes with no seals at all (it could shrink under a receiver).
fn bare_memfd(size: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("test", MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, size).unwrap();
    fd
}

/// A segment as a conforming sender passes it: sealed against shrinking and growing, and
/// with `sealed` against writes too (spec §7.4).
fn memfd(size: u64, sealed: bool) -> OwnedFd {
    let fd = bare_memfd(size);
    let seals = if sealed {
        SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW
    } else {
        SealFlags::SHRINK | SealFlags::GROW
    };
    rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
    fd
}

fn shm_msg(size: u64, sealed: bool) -> Vec<u8> {
    let body = [0x81, 0xa4, b'd', b'a', b't', b'a', 0xd6, 0x01, 0, 0, 0, 0];
    header(&Header::Msg {
        type_name: "test.Blob",
        body: &body,
        frames: vec![Descriptor::Shm {
            len: 4096,
            offset: 0,
            size,
            lease: 1,
            sealed,
        }],
    })
}

/// Sends `bytes` with `fds`, then reads what the node answers until it closes.
async fn expect_refusal(node: &Node, bytes: Vec<u8>, fds: Vec<OwnedFd>) -> String {
    let path = node.unix_addr().unwrap().trim_start_matches("unix://").to_string();
    tokio::task::spawn_blocking(move || {
        let mut s = handshaken(&path);
        send_with_fds(&s, &bytes, &fds);
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        let m = decode_message(&reply, &Limits::default()).expect("an error message");
        match m.header {
            Header::Error { code, message } => format!("{code}: {message}"),
            other => panic!("expected an error, got {other:?}"),
        }
    })
    .await
    .unwrap()
}

async fn still_serves(node: &Node, name: &str) {
    let client = Node::builder(name).secret(SECRET).build().await.unwrap();
    let peer = client.connect(node.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);
    let blob = Blob {
        data: Buffer::from(vec![4u8; 100_000]),
    };
    peer.send(blob.clone()).await.unwrap();
    loop {
        let env = node.recv_timeout(Duration::from_secs(10)).await.unwrap();
        if env.from().name() == name {
            assert_eq!(env.decode::<Blob>().unwrap(), blob);
            return;
        }
    }
}

#[tokio::test]
async fn a_shm_frame_without_its_descriptor() {
    let node = server("shm-missing-fd").await;
    let reply = expect_refusal(&node, shm_msg(8192, false), vec![]).await;
    assert!(
        reply.starts_with("bad-shm") && reply.contains("fewer descriptors"),
        "{reply}"
    );
    still_serves(&node, "after-missing-fd").await;
}

#[tokio::test]
async fn a_descriptor_whose_size_differs_from_the_header() {
    let node = server("shm-wrong-size").await;
    let reply = expect_refusal(&node, shm_msg(8192, false), vec![memfd(4096, false)]).await;
    assert!(reply.starts_with("bad-shm") && reply.contains("8192"), "{reply}");
    still_serves(&node, "after-wrong-size").await;
}

#[tokio::test]
async fn a_descriptor_that_no_header_announced() {
    let node = server("shm-stray-fd").await;
    let plain = header(&Header::Msg {
        type_name: "test.Blob",
        body: &[0x81, 0xa4, b'd', b'a', b't', b'a', 0xc4, 0x00],
        frames: vec![],
    });
    let reply = expect_refusal(&node, plain, vec![memfd(4096, false)]).await;
    assert!(
        reply.starts_with("bad-shm") && reply.contains("no header announced"),
        "{reply}"
    );
    still_serves(&node, "after-stray-fd").await;
}

#[tokio::test]
async fn a_sealed_claim_on_an_unsealed_segment() {
    let node = server("shm-unsealed").await;
    let reply = expect_refusal(&node, shm_msg(8192, true), vec![memfd(8192, false)]).await;
    assert!(reply.starts_with("bad-shm") && reply.contains("sealed"), "{reply}");
    // A really sealed one is accepted.
    let path = node.unix_addr().unwrap().trim_start_matches("unix://").to_string();
    let client = tokio::task::spawn_blocking(move || {
        let s = handshaken(&path);
        send_with_fds(&s, &shm_msg(8192, true), &[memfd(8192, true)]);
        s
    })
    .await
    .unwrap();
    let got: Blob = node
        .recv_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .decode()
        .unwrap();
    assert_eq!(got.data.len(), 4096);
    assert!(handoff::shm::segment_info(&got.data).unwrap().sealed);
    drop(client);
}

#[tokio::test]
async fn a_segment_that_could_shrink_under_the_mapping() {
    let node = server("shm-shrinkable").await;
    let reply = expect_refusal(&node, shm_msg(8192, false), vec![bare_memfd(8192)]).await;
    assert!(
        reply.starts_with("bad-shm") && reply.contains("not sealed against shrinking"),
        "{reply}"
    );
    still_serves(&node, "after-shrinkable").await;
}

#[tokio::test]
async fn a_regular_file_passed_as_a_segment() {
    let node = server("shm-regular-file").await;
    let path = std::env::temp_dir().join(format!("handoff-bad-shm-{}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(8192).unwrap();
    std::fs::remove_file(&path).unwrap();
    let reply = expect_refusal(&node, shm_msg(8192, false), vec![OwnedFd::from(file)]).await;
    assert!(
        reply.starts_with("bad-shm") && reply.contains("not a sealable shared-memory file"),
        "{reply}"
    );
    still_serves(&node, "after-regular-file").await;
}

/// Frames are checked in their order (spec §11.2 step 6): a bad segment before an inline
/// frame that never comes is `bad-shm`, not `truncated`.
#[tokio::test]
async fn a_bad_segment_is_refused_before_a_later_frame_is_read() {
    let node = server("shm-in-order").await;
    let body = [0x81, 0xa4, b'd', b'a', b't', b'a', 0xd6, 0x01, 0, 0, 0, 0];
    let bytes = header(&Header::Msg {
        type_name: "test.Blob",
        body: &body,
        frames: vec![
            Descriptor::Shm {
                len: 4096,
                offset: 0,
                size: 8192,
                lease: 1,
                sealed: false,
            },
            Descriptor::Inline { len: 100 },
        ],
    });
    let path = node.unix_addr().unwrap().trim_start_matches("unix://").to_string();
    let reply = tokio::task::spawn_blocking(move || {
        let mut s = handshaken(&path);
        // The segment is smaller than the header says, and the inline frame's bytes never
        // come: the stream ends where they should start.
        send_with_fds(&s, &bytes, &[memfd(4096, false)]);
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        match decode_message(&reply, &Limits::default())
            .expect("an error message")
            .header
        {
            Header::Error { code, message } => format!("{code}: {message}"),
            other => panic!("expected an error, got {other:?}"),
        }
    })
    .await
    .unwrap();
    assert!(reply.starts_with("bad-shm") && reply.contains("8192"), "{reply}");
    still_serves(&node, "after-in-order").await;
}
