//! Vectors of the `cuda` descriptor (spec §7.10): a range of the sender's GPU memory named
//! by a CUDA IPC handle, carried only on a Unix socket to a receiver that announced `cuda`.

use handoff_wire::{Descriptor, DeviceClaim, Header};
use serde_json::json;

use crate::fixtures::*;

/// The claim alpha gives beta for 1 MiB at offset 4096 of an allocation on device
/// `00112233-4455-6677-8899-aabbccddeeff`, under lease 43.
pub(crate) fn device_fixture() -> DeviceClaim {
    DeviceClaim {
        len: 1 << 20,
        offset: 4096,
        lease: 43,
        token: beta_token(),
        // A handle is opaque to handoff: the fixture's bytes are 0, 1, … 63.
        ipc: std::array::from_fn(|i| i as u8),
        device: std::array::from_fn(|i| (i as u8) * 0x11),
    }
}

/// The descriptor of [`device_fixture`] as raw msgpack, without `drop` and with `ipc`
/// `ipc_len` bytes long.
fn raw_desc(drop: &str, ipc_len: usize) -> rmpv::Value {
    let c = device_fixture();
    let fields = vec![
        ("k", s("cuda")),
        ("n", c.len.into()),
        ("off", c.offset.into()),
        ("lease", c.lease.into()),
        ("token", rmpv::Value::Binary(c.token.clone())),
        ("ipc", rmpv::Value::Binary(c.ipc[..ipc_len].to_vec())),
        ("device", rmpv::Value::Binary(c.device.to_vec())),
    ];
    map(fields.into_iter().filter(|(k, _)| *k != drop).collect())
}

fn msg_with(frames: Vec<rmpv::Value>) -> Vec<u8> {
    msgpack(&map(vec![
        ("k", s("msg")),
        ("t", s("demo.Sample")),
        ("b", rmpv::Value::Binary(vec![0x90])),
        ("f", rmpv::Value::Array(frames)),
    ]))
}

/// A vector decoded on a Unix socket by a receiver that announced `cuda`.
fn to_cuda_receiver(mut v: Vector) -> Vector {
    v.description["channel"] = json!("shm");
    v.description["caps"] = json!(["cuda", "ticket"]);
    v
}

/// The `cuda` vectors.
pub(crate) fn vectors() -> Vec<Vector> {
    let c = device_fixture();
    let header = Header::Msg {
        type_name: "demo.Sample",
        body: TWO_FRAME_REFS,
        frames: vec![Descriptor::Cuda(c.clone()), Descriptor::Inline { len: 3 }],
    };
    let mut v = vec![to_cuda_receiver(Vector {
        name: "msg-cuda",
        bytes: message(&header, &[b"abc"]),
        description: json!({
            "kind": "message", "valid": true,
            "description": "Frame 0 is GPU memory: 1 MiB at offset 4096 of the allocation that the CUDA IPC handle `ipc` names, on the device whose UUID is `device`. Alpha (the sender) keeps it under lease 43, held by beta with its token until beta releases it (`unlease`) or the connection ends; beta maps it through the handle, or pulls its bytes over this connection. No byte of it follows in the stream. Frame 1 is 3 inline bytes.",
            "header": {"k": "msg", "t": "demo.Sample",
                       "b": {"$bin": "82a464617461d60100000000a46d657461d60100000001"},
                       "f": [{"k": "cuda", "n": 1048576, "off": 4096, "lease": 43,
                              "token": bin_json(&c.token),
                              "ipc": bin_json(&c.ipc), "device": bin_json(&c.device)},
                             {"k": "inline", "n": 3}]},
            "frames": [{"$bin": "616263"}],
            "body": {"data": {"$frame": 0}, "meta": {"$frame": 1}},
        }),
    })];
    let mut without_cap = invalid(
        "msg-cuda-not-announced",
        "message",
        raw_message(&msg_with(vec![raw_desc("", 64)]), &[]),
        "unsupported-descriptor",
        "A cuda descriptor on a Unix socket to a receiver that did not announce `cuda`.",
    );
    without_cap.description["channel"] = json!("shm");
    v.push(without_cap);
    v.push(invalid(
        "msg-cuda-on-stream",
        "message",
        raw_message(&msg_with(vec![raw_desc("", 64)]), &[]),
        "unsupported-descriptor",
        "A cuda descriptor on a TCP connection: GPU memory is named to same-host peers only.",
    ));
    v.push(to_cuda_receiver(invalid(
        "msg-cuda-short-ipc",
        "message",
        raw_message(&msg_with(vec![raw_desc("", 63)]), &[]),
        "malformed-header",
        "A cuda descriptor whose `ipc` handle is 63 bytes; it is exactly 64.",
    )));
    v.push(to_cuda_receiver(invalid(
        "msg-cuda-missing-device",
        "message",
        raw_message(&msg_with(vec![raw_desc("device", 64)]), &[]),
        "malformed-header",
        "A cuda descriptor without the UUID of its device.",
    )));
    v.push(to_cuda_receiver(invalid(
        "msg-cuda-missing-token",
        "message",
        raw_message(&msg_with(vec![raw_desc("token", 64)]), &[]),
        "malformed-header",
        "A cuda descriptor without the receiver's token for its lease.",
    )));
    v
}
