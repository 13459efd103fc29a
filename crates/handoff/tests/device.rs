//! GPU memory between nodes (spec §7.10), on the emulated driver (`HANDOFF_CUDA_EMULATE=1`,
//! host memory playing device memory): handoff's side end to end, where no GPU is. On a
//! machine with a GPU the same code runs on CUDA (`scripts/gpu-check`).

mod common;
use common::wait_until;

use std::time::Duration;

use handoff::{Buffer, Channel, DeviceBuffer, Message, Node};
use serde::{Deserialize, Serialize};

const SECRET: &str = "device-secret";
const T: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Weights {
    layer: u32,
    data: Buffer,
}
impl Message for Weights {
    const TYPE_NAME: &'static str = "test.Weights";
}

/// The tests of this file one at a time (`cargo test` runs them as threads of one process,
/// and one of them turns mapping off through the environment).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the emulated bus takes to copy a MiB to the host (beyond the memcpy).
const COPY_MS_PER_MIB: u64 = 20;

/// The emulated driver, asked for before any node loads one (every test here starts so),
/// with mapping on unless `ipc` is false, and a slow bus (`COPY_MS_PER_MIB`); held until
/// the test ends.
async fn emulate(ipc: bool) -> tokio::sync::MutexGuard<'static, ()> {
    let serial = SERIAL.lock().await;
    std::env::set_var("HANDOFF_CUDA_EMULATE", "1");
    std::env::set_var("HANDOFF_CUDA_EMULATE_DTOH_MS_PER_MIB", COPY_MS_PER_MIB.to_string());
    std::env::set_var("HANDOFF_CUDA_IPC", if ipc { "1" } else { "0" });
    serial
}

async fn node(name: &str, shm: bool) -> Node {
    Node::builder(name)
        .secret(SECRET)
        .listen("127.0.0.1:0")
        .shm(shm)
        .register::<Weights>()
        .build()
        .await
        .unwrap()
}

/// Node `{name}-a` sends `bytes` in device memory to node `{name}-b`, which cannot map it
/// (`emulate(false)`): both nodes, what `b` received, and its device buffer (unmapped).
async fn sent_to_a_peer_that_cannot_map(name: &str, bytes: &[u8]) -> (Node, Node, Weights, DeviceBuffer) {
    let a = node(&format!("{name}-a"), true).await;
    let b = node(&format!("{name}-b"), true).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    peer.send(Weights {
        layer: 3,
        data: DeviceBuffer::upload(0, bytes).unwrap().into(),
    })
    .await
    .unwrap();
    let got: Weights = b.recv_timeout(T).await.unwrap().decode().unwrap();
    let device = DeviceBuffer::of(&got.data).expect("a device buffer");
    assert_eq!(device.via(), "unmapped");
    (a, b, got, device)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[tokio::test]
async fn device_memory_goes_by_handle_to_a_same_host_peer_and_comes_back_to_its_owner() {
    let _serial = emulate(true).await;
    let a = node("dev-a", true).await;
    let b = node("dev-b", true).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Shm);
    let bytes = pattern(1 << 20, 3);
    let sent = DeviceBuffer::upload(0, &bytes).unwrap();
    peer.send(Weights {
        layer: 1,
        data: sent.into(),
    })
    .await
    .unwrap();
    let env = b.recv_timeout(T).await.unwrap();
    assert!(env.wire_bytes() < 4096, "no byte of the array crossed the socket");
    let got: Weights = env.decode().unwrap();
    let device = DeviceBuffer::of(&got.data).expect("a device buffer");
    assert_eq!(device.via(), "ipc");
    assert_eq!(device.to_host().await.unwrap(), bytes);
    assert_eq!(a.ticket_leases().count, 1, "the owner keeps it for the peer");
    drop(device);
    drop(got);
    wait_until("the peer let it go", || a.ticket_leases().count == 0).await;
}

#[tokio::test]
async fn a_peer_over_tcp_gets_a_host_copy() {
    let _serial = emulate(true).await;
    let a = node("dev-tcp-a", false).await;
    let b = node("dev-tcp-b", false).await;
    let peer = a.connect(b.listen_addr().unwrap()).await.unwrap();
    assert_eq!(peer.channel(), Channel::Tcp);
    let bytes = pattern(300_000, 9);
    peer.send(Weights {
        layer: 2,
        data: DeviceBuffer::upload(0, &bytes).unwrap().into(),
    })
    .await
    .unwrap();
    let got: Weights = b.recv_timeout(T).await.unwrap().decode().unwrap();
    assert!(DeviceBuffer::of(&got.data).is_none());
    assert_eq!(got.data.as_ref(), &bytes[..]);
    assert_eq!(a.ticket_leases().count, 0, "nothing kept for a copy");
}

/// Where the handle cannot be opened (another container, a device it does not see; here
/// `HANDOFF_CUDA_IPC=0`), the receiver pulls the bytes under the frame's lease, and puts
/// them on a device of its own when asked.
#[tokio::test]
async fn a_receiver_that_cannot_map_pulls_the_bytes() {
    let _serial = emulate(false).await;
    let bytes = pattern(200_000, 5);
    let (a, _b, got, device) = sent_to_a_peer_that_cannot_map("dev-pull", &bytes).await;
    assert!(device.ptr().is_none());
    let local = device.on_device().await.unwrap();
    assert_eq!(local.via(), "local");
    assert_eq!(local.to_host().await.unwrap(), bytes);
    drop(device);
    drop(got);
    wait_until("the hold ends once the claim is dropped", || {
        a.ticket_leases().count == 0
    })
    .await;
}

/// The host copy a pull asks for is made off the owner's runtime threads: 16 MiB over the
/// emulated bus take about a third of a second, and a task of the same runtime (one thread,
/// as `#[tokio::test]` makes it) keeps being woken on time meanwhile. Made inside the
/// owner's reader, the copy held up every task of the runtime for all of that.
#[tokio::test]
async fn a_slow_host_copy_for_a_pull_holds_up_only_the_peer_that_asked() {
    let _serial = emulate(false).await;
    let bytes = pattern(16 << 20, 11);
    let (_a, _b, _got, device) = sent_to_a_peer_that_cannot_map("dev-slow", &bytes).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let lag = tokio::spawn(async move {
        let mut stopped = stopped;
        let mut worst = Duration::ZERO;
        loop {
            let t0 = std::time::Instant::now();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                _ = &mut stopped => return worst,
            }
            worst = worst.max(t0.elapsed().saturating_sub(Duration::from_millis(5)));
        }
    });
    let started = std::time::Instant::now();
    assert_eq!(device.to_host().await.unwrap(), bytes);
    let took = started.elapsed();
    stop.send(()).unwrap();
    let worst = lag.await.unwrap();
    let copy = Duration::from_millis(16 * COPY_MS_PER_MIB);
    assert!(
        took >= copy,
        "the pull took {took:?}, less than the emulated copy ({copy:?})"
    );
    assert!(
        worst < copy / 3,
        "the runtime was held up {worst:?} while the owner copied"
    );
}
