//! The tokio driver of the connection handshake: moves bytes between the socket and the
//! engine's [`Handshake`] (crate `handoff-proto`), which decides everything (spec §5), and
//! keeps its clock and its eviction.

use std::sync::Arc;

use handoff_proto::handshake::{Config, Failure, Handshake, Status, ERROR_WRITE_LIMIT};
pub(crate) use handoff_proto::handshake::{DRAIN_BYTES, DRAIN_TIME};
use handoff_proto::Handshaken;
use handoff_wire::{Ident, Preamble, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::socket::Socket;
use crate::{Error, Result};

/// Checks a peer's authenticated identity before we send `ready` (node-id uniqueness, §5.1).
pub(crate) type Admit<'a> = &'a (dyn Fn(&Ident) -> std::result::Result<(), WireError> + Send + Sync);

/// Why a wait of the handshake ended.
enum Woke<T> {
    Done(T),
    TimedOut,
    Evicted,
}

/// Runs `fut` until the engine's next timeout, unless evicted first.
async fn until<T>(
    timeout: Option<Instant>,
    evicted: &mut Option<oneshot::Receiver<()>>,
    fut: impl std::future::Future<Output = T>,
) -> Woke<T> {
    let evict = async {
        // A dropped sender (the slot was released) is not an eviction.
        let fired = match evicted.as_mut() {
            Some(rx) => rx.await.is_ok(),
            None => false,
        };
        if !fired {
            std::future::pending::<()>().await
        }
    };
    let sleep = async {
        match timeout {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    // The timer and the eviction first: a read that completes as the deadline passes does
    // not move the handshake on (the engine refuses it too).
    tokio::select! {
        biased;
        _ = evict => Woke::Evicted,
        _ = sleep => Woke::TimedOut,
        r = fut => Woke::Done(r),
    }
}

/// The engine's clock: tokio's (paused in some tests), as a std `Instant`.
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// Runs the handshake the engine's `config` describes on a fresh connection, with `admit`
/// as the node-id check before `ready`; on any failure the peer is told why (when possible)
/// and an error returned.
///
/// Reads never go past the item the engine reads (its `wants`): so every descriptor that
/// arrives before the connection is established came with a handshake byte, and those of
/// the first message after `ready` are never taken for them (spec §5.1).
pub(crate) async fn handshake(
    socket: &Arc<Socket>,
    config: Config,
    admit: Admit<'_>,
    label: &str,
    mut evicted: Option<oneshot::Receiver<()>>,
) -> Result<Handshaken> {
    let mut hs = Handshake::new(config, now());
    let timeout_at = |hs: &Handshake| hs.poll_timeout().map(Instant::from_std);
    let mut buf = Vec::new();
    loop {
        if hs.has_transmit() && !hs.is_over() {
            let out = hs.take_transmit();
            // Not `send`: what a failed handshake queued is not written on by a task.
            let write = async {
                socket
                    .written(socket.queue(out.into(), Vec::new(), Vec::new()).await?)
                    .await
            };
            match until(timeout_at(&hs), &mut evicted, write).await {
                Woke::Done(Ok(())) => {}
                Woke::Done(Err(e)) => return Err(Error::io(format!("handshake with {label}"), e)),
                Woke::TimedOut => hs.handle_timeout(now()),
                Woke::Evicted => {
                    evicted = None;
                    hs.evict()
                }
            }
        }
        match hs.status().clone() {
            Status::InProgress => {}
            Status::Admit(peer) => {
                hs.admit(admit(&peer));
                continue;
            }
            Status::Done(done) => return Ok(done),
            Status::Failed(failure) => return Err(fail(socket, &mut hs, failure, label).await),
        }
        if hs.has_transmit() {
            continue;
        }
        buf.resize(hs.wants(), 0);
        match until(timeout_at(&hs), &mut evicted, socket.read(&mut buf, false)).await {
            Woke::Done(Ok(got)) => {
                // Descriptors that came with these bytes were closed by the kernel (the read
                // offers them no room) and are counted: the engine refuses a connection that
                // sent any before `ready` (spec §5.1).
                hs.handle_read(&buf[..got.bytes], got.fds.len() + usize::from(got.truncated), now());
            }
            Woke::Done(Err(e)) => return Err(Error::io(format!("reading from {label}"), e)),
            Woke::TimedOut => hs.handle_timeout(now()),
            Woke::Evicted => {
                evicted = None;
                hs.evict()
            }
        }
    }
}

/// Ends a failed handshake as the engine says: the queued `error` written (bounded in
/// time), our sending side shut down first (so the error is delivered and not reset away),
/// what the peer still sends read and dropped for a moment when the engine says so; then the
/// error to return (the caller drops the socket).
async fn fail(socket: &Arc<Socket>, hs: &mut Handshake, failure: Failure, label: &str) -> Error {
    let err = match failure {
        Failure::Refused(e) => e,
        Failure::PeerRefused { code, message } => {
            return Error::Refused {
                peer: label.to_string(),
                code,
                message,
            }
        }
        Failure::PeerClosed { waiting_for } => {
            return Error::PeerClosed(format!("{label} (during the handshake, waiting for {waiting_for})"))
        }
    };
    // What the engine queued, its `error` last (none to a peer that sent no preamble).
    socket.say_and_shutdown(hs.take_transmit(), ERROR_WRITE_LIMIT).await;
    if hs.drain_after_failure() {
        socket.drain(DRAIN_BYTES, DRAIN_TIME).await;
    }
    err.into()
}

/// Refuses a connection the node cannot take at all (too many connections): our preamble,
/// then, once the peer's whole preamble arrived (an error goes only to a peer that showed it
/// speaks the format, spec §3, §11.3; we wait for it a second at most),
/// `error {code: "overloaded"}` (readable by every version, §12), then close.
pub(crate) async fn refuse_overloaded<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    preamble: Preamble,
    why: String,
) {
    let (ours, error) = handoff_proto::handshake::overloaded(preamble, why);
    let _ = tokio::time::timeout(ERROR_WRITE_LIMIT, stream.write_all(&ours)).await;
    let mut theirs = [0u8; handoff_wire::preamble::PREAMBLE_LEN];
    let read = tokio::time::timeout(ERROR_WRITE_LIMIT, stream.read_exact(&mut theirs)).await;
    if matches!(read, Ok(Ok(_))) {
        let _ = tokio::time::timeout(ERROR_WRITE_LIMIT, stream.write_all(&error)).await;
    }
    let _ = tokio::time::timeout(ERROR_WRITE_LIMIT, stream.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use handoff_wire::framing::encode_header_into;
    use handoff_wire::Header;
    use std::time::Duration;
    use tokio::net::{TcpListener, TcpStream};

    /// One dialer handshake whose peer sends its challenge and then lets the deadline pass
    /// before the node's task runs again. Returns the kind of the node's next header.
    async fn one_trial() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (node_sock, mut attacker) = (client.unwrap(), server.unwrap().0);
        let node_task = tokio::spawn(async move {
            let socket = crate::socket::Socket::tcp(node_sock, None, Duration::from_secs(5));
            let me = handoff_wire::Endpoint {
                node_id: "0".repeat(32),
                name: "n".into(),
                host_id: "h".into(),
                process_id: "p".into(),
                language: "rust".into(),
                capabilities: vec!["inline".into()],
            };
            let config = Config {
                ident: handoff_proto::peers::ident_of(&me, "handoff-rs/test", None, None),
                secret: b"s".to_vec(),
                limits: handoff_wire::Limits::DEFAULT,
                preamble: Preamble::OURS,
                role: handoff_wire::auth::Role::Dialer,
                nonce: rand::random(),
                deadline: (Instant::now() + Duration::from_millis(300)).into_std(),
                progress_timeout: Duration::from_secs(30),
                dialed: std::sync::Arc::new(handoff_proto::handshake::DialerNonces::new(Duration::from_millis(300))),
            };
            let admit = |_: &Ident| Ok(());
            let _ = handshake(&socket, config, &admit, "peer", None).await;
        });
        let mut pre = [0u8; 16];
        attacker.read_exact(&mut pre).await.unwrap();
        attacker.write_all(&pre).await.unwrap();
        let mut len = [0u8; 4];
        attacker.read_exact(&mut len).await.unwrap();
        let mut ch = vec![0u8; u32::from_be_bytes(len) as usize];
        attacker.read_exact(&mut ch).await.unwrap();
        let mut mine = Vec::new();
        encode_header_into(
            &Header::Challenge {
                version: 3,
                nonce: vec![0x42; 32],
            },
            &mut mine,
        );
        attacker.write_all(&mine).await.unwrap();
        // The runtime is busy (here: this thread blocks) until the deadline has passed.
        std::thread::sleep(Duration::from_millis(400));
        attacker.read_exact(&mut len).await.unwrap();
        let mut next = vec![0u8; u32::from_be_bytes(len) as usize];
        attacker.read_exact(&mut next).await.unwrap();
        let kind = Header::decode(&next, &handoff_wire::Limits::DEFAULT)
            .map(|h| h.kind().to_string())
            .unwrap_or_default();
        node_task.abort();
        kind
    }

    /// A peer's challenge read only after the deadline (the runtime was busy) gets no proof.
    #[tokio::test(flavor = "current_thread")]
    async fn input_read_after_the_deadline_gets_no_proof() {
        let mut late = 0;
        let trials = 10;
        for _ in 0..trials {
            if one_trial().await == "auth" {
                late += 1;
            }
        }
        assert_eq!(
            late, 0,
            "{late} of {trials} handshakes acted on input read after their deadline"
        );
    }
}
