//! Nodes talking in-process and over TCP: delivery, routes, authentication.

use std::time::Duration;

use handoff::{Buffer, Channel, Error, Locality, Message, Node, Route};
use serde::{Deserialize, Serialize, Serializer};

const SECRET: &str = "test-secret";
const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payload {
    name: String,
    seq: u64,
    data: Buffer,
    parts: Vec<Buffer>,
}
impl Message for Payload {
    const TYPE_NAME: &'static str = "test.Payload";
}

fn payload(len: usize) -> Payload {
    Payload {
        name: "p".into(),
        seq: 42,
        data: Buffer::from((0..len).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>()),
        parts: vec![
            Buffer::from_static(b"one"),
            Buffer::new(),
            Buffer::from_static(b"three"),
        ],
    }
}

/// A type that must never be serialized: its `Serialize` panics.
#[derive(Debug, Deserialize)]
struct NotSerializable(u32);
impl Serialize for NotSerializable {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        panic!("NotSerializable was serialized")
    }
}
impl Message for NotSerializable {
    const TYPE_NAME: &'static str = "test.NotSerializable";
}

/// Encodes itself per destination: a same-host peer gets a handle, a remote one the bytes.
#[derive(Debug, PartialEq, Deserialize)]
enum DeviceArray {
    Handle { id: u64 },
    Bytes(Buffer),
}
impl Serialize for DeviceArray {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        enum Wire<'a> {
            Handle { id: u64 },
            Bytes(&'a Buffer),
        }
        let DeviceArray::Bytes(data) = self else {
            return Err(serde::ser::Error::custom("only device-resident arrays are sent"));
        };
        let near = Route::current().is_some_and(|r| r.locality != Locality::Remote);
        if near {
            Wire::Handle { id: data.len() as u64 }.serialize(s)
        } else {
            Wire::Bytes(data).serialize(s)
        }
    }
}
impl Message for DeviceArray {
    const TYPE_NAME: &'static str = "test.DeviceArray";
}

async fn node(name: &str) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .register::<Payload>()
        .register::<NotSerializable>()
        .register::<DeviceArray>()
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn inproc_moves_the_value_without_serializing() {
    let a = node("inproc-a").await;
    let b = node("inproc-b").await;
    let peer = a.connect(&b.inproc_addr()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Inproc);
    assert_eq!(peer.locality(), Locality::SameProcess);
    peer.send(NotSerializable(7)).await.unwrap();
    let env = b.recv_timeout(T).await.unwrap();
    assert!(!env.is_encoded());
    assert_eq!(env.from().name(), "inproc-a");
    assert_eq!(env.decode::<NotSerializable>().unwrap().0, 7);

    // The buffer is the very same memory.
    let p = payload(1000);
    let ptr = p.data.as_ptr();
    peer.send(p).await.unwrap();
    let got: Payload = b.recv_timeout(T).await.unwrap().decode().unwrap();
    assert_eq!(got.data.as_ptr(), ptr);

    // Replies go back through the envelope's sender.
    let back = b.peer("inproc-a").unwrap();
    back.send(payload(3)).await.unwrap();
    assert_eq!(
        a.recv_timeout(T).await.unwrap().decode::<Payload>().unwrap(),
        payload(3)
    );
}

#[tokio::test]
async fn forced_encoding_in_process_gives_the_same_values() {
    let a = Node::builder("force-a")
        .secret(SECRET)
        .force_encode_inproc(true)
        .build()
        .await
        .unwrap();
    let b = node("force-b").await;
    let peer = a.connect(&b.inproc_addr()).await.unwrap();
    let sent = payload(100_000);
    peer.send(sent.clone()).await.unwrap();
    let env = b.recv_timeout(T).await.unwrap();
    assert!(env.is_encoded(), "the switch must force real encoding");
    assert_eq!(env.decode::<Payload>().unwrap(), sent);
    // With encoding forced, a type that cannot serialize fails to send, as it would over TCP.
    let sender = peer.clone();
    let joined = tokio::spawn(async move { sender.send(NotSerializable(1)).await }).await;
    assert!(
        joined.unwrap_err().is_panic(),
        "encoding NotSerializable must reach its Serialize"
    );
}

#[tokio::test]
async fn tcp_delivers_large_buffers_intact() {
    let a = Node::builder("tcp-a")
        .secret(SECRET)
        .host_id("host-1")
        .build()
        .await
        .unwrap();
    let b = Node::builder("tcp-b")
        .secret(SECRET)
        .host_id("host-2")
        .listen("127.0.0.1:0")
        .register::<Payload>()
        .build()
        .await
        .unwrap();
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Tcp);
    assert_eq!(peer.locality(), Locality::Remote);
    assert_eq!(peer.endpoint().host_id, "host-2");
    for len in [0, 1, 65_535, 65_536, 3 << 20] {
        let sent = payload(len);
        peer.send(sent.clone()).await.unwrap();
        let env = b.recv_timeout(T).await.unwrap();
        assert!(env.is_encoded());
        assert_eq!(env.from().name(), "tcp-a");
        assert_eq!(env.route().locality, Locality::Remote);
        assert_eq!(env.decode::<Payload>().unwrap(), sent, "len {len}");
    }
}

#[tokio::test]
async fn route_aware_type_encodes_per_destination() {
    let a = node("route-a").await;
    let near = node("route-near").await;
    let far = Node::builder("route-far")
        .secret(SECRET)
        .host_id("another-host")
        .listen("127.0.0.1:0")
        .register::<DeviceArray>()
        .build()
        .await
        .unwrap();
    let to_near = a.connect(near.listen_addr().unwrap()).await.unwrap();
    let to_far = a.connect(far.listen_addr().unwrap()).await.unwrap();
    assert_eq!(to_near.locality(), Locality::SameProcess);
    assert_eq!(to_far.locality(), Locality::Remote);
    let data = Buffer::from(vec![9u8; 4096]);
    to_near.send(DeviceArray::Bytes(data.clone())).await.unwrap();
    to_far.send(DeviceArray::Bytes(data.clone())).await.unwrap();
    let got_near = near.recv_timeout(T).await.unwrap();
    let got_far = far.recv_timeout(T).await.unwrap();
    assert!(got_near.wire_bytes() < 100, "the near peer gets a small handle");
    assert!(got_far.wire_bytes() >= 4096, "the far peer gets the bytes");
    assert_eq!(
        got_near.decode::<DeviceArray>().unwrap(),
        DeviceArray::Handle { id: 4096 }
    );
    assert_eq!(got_far.decode::<DeviceArray>().unwrap(), DeviceArray::Bytes(data));
}

#[tokio::test]
async fn wrong_secret_is_refused_on_both_sides() {
    let server = node("secret-server").await;
    let client = Node::builder("secret-client")
        .secret("not-the-secret")
        .build()
        .await
        .unwrap();
    let err = client.connect(server.listen_addr().unwrap()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("authentication failed") && text.contains("secret"),
        "unclear error: {text}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(server.peers().is_empty(), "the server must not accept the peer");
    // In-process too.
    let err = client.connect(&server.inproc_addr()).await.unwrap_err();
    assert!(err.to_string().contains("different cluster secret"), "{err}");
}

#[tokio::test]
async fn unknown_type_is_refused_before_reading_frames() {
    let a = node("unknown-a").await;
    let b = Node::builder("unknown-b")
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .build()
        .await
        .unwrap();
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(payload(10)).await.unwrap();
    // b closes the connection with unknown-type; a sees its peer go away.
    let deadline = tokio::time::Instant::now() + T;
    while a.peer("unknown-b").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "b did not close the connection");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // In-process the sender gets the error directly.
    let inproc = a.connect(&b.inproc_addr()).await.unwrap();
    let err = inproc.send(payload(1)).await.unwrap_err();
    assert!(err.to_string().contains("unknown type name \"test.Payload\""), "{err}");
}

#[tokio::test]
async fn decode_as_wrong_type_is_a_clear_error() {
    let a = node("mismatch-a").await;
    let b = node("mismatch-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(payload(1)).await.unwrap();
    let err = b.recv_timeout(T).await.unwrap().decode::<DeviceArray>().unwrap_err();
    assert!(matches!(err, Error::TypeMismatch { .. }), "{err}");
}

#[tokio::test]
async fn duplicate_names_in_one_process_are_refused() {
    let _a = node("dup").await;
    let err = Node::builder("dup").build().await.unwrap_err();
    assert!(err.to_string().contains("already runs"), "{err}");
}

#[tokio::test]
async fn registry_decodes_by_the_name_in_the_header() {
    let a = node("registry-a").await;
    let b = node("registry-b").await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(payload(5000)).await.unwrap();
    peer.send(DeviceArray::Bytes(Buffer::from_static(b"xyz")))
        .await
        .unwrap();
    let mut kinds = Vec::new();
    for _ in 0..2 {
        let env = b.recv_timeout(T).await.unwrap();
        let name = env.type_name().to_string();
        let any = env.decode_any(b.registry()).unwrap();
        if let Some(p) = any.downcast_ref::<Payload>() {
            assert_eq!(p, &payload(5000));
        } else if let Some(d) = any.downcast_ref::<DeviceArray>() {
            // Same process over TCP: the near encoding.
            assert_eq!(d, &DeviceArray::Handle { id: 3 });
        } else {
            panic!("decoded {name} to an unexpected type");
        }
        kinds.push(name);
    }
    kinds.sort();
    assert_eq!(kinds, ["test.DeviceArray", "test.Payload"]);
}
