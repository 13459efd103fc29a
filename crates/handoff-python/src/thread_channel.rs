//! Option (a): a connection run by the extension's tokio thread. Its reader hands each
//! batch of received frames to the asyncio loop with `loop.call_soon_threadsafe`; sends go
//! to its writer task, or are written at once from the calling thread (`send_now`).

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyConnectionError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::frames::{self, FrameReader, Next, MAX_FRAME_BYTES};
use crate::runtime::runtime;
use crate::sys::{self, LargeFrame};

/// Sends queued for the writer task and not yet written, at most.
pub const SEND_QUEUE: usize = 1024;

/// Bytes asked of the kernel per read.
const READ_CHUNK: usize = 256 * 1024;

/// Bytes of received frames handed to the loop and not yet taken by it, at most, before the
/// reader stops reading (the peer's sends then wait in the kernel's buffers): a loop that is
/// busy, or a peer that sends faster than the program takes, holds no more than this plus
/// one batch (one read, or one large frame).
pub const MAX_UNDELIVERED: usize = 16 * 1024 * 1024;

/// A connection whose reads and writes run on the extension's tokio thread.
#[pyclass(module = "handoff._native")]
pub struct ThreadChannel {
    fd: Arc<AsyncFd<OwnedFd>>,
    outgoing: mpsc::Sender<Vec<u8>>,
    queued: Arc<AtomicUsize>,
    undelivered: Arc<Undelivered>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Bytes handed to the loop and not yet taken (the reader's backpressure).
#[derive(Default)]
struct Undelivered {
    bytes: AtomicUsize,
    taken: Notify,
}

impl Undelivered {
    /// Waits until at most [`MAX_UNDELIVERED`] bytes wait for the loop.
    async fn room(&self) {
        loop {
            let taken = self.taken.notified();
            if self.bytes.load(Ordering::Acquire) <= MAX_UNDELIVERED {
                return;
            }
            taken.await;
        }
    }
}

/// Runs on the loop: `on_frames(batch)`, after the batch's bytes are counted as taken.
#[pyclass(module = "handoff._native")]
struct Handover {
    undelivered: Arc<Undelivered>,
    on_frames: Py<PyAny>,
}

#[pymethods]
impl Handover {
    fn __call__(&self, py: Python<'_>, batch: Py<PyAny>, nbytes: usize) -> PyResult<()> {
        self.undelivered.bytes.fetch_sub(nbytes, Ordering::AcqRel);
        self.undelivered.taken.notify_waiters();
        self.on_frames.call1(py, (batch,))?;
        Ok(())
    }
}

/// Where received frames go: `on_frames(list)` on the loop, and `on_frames(str)` once at
/// the end (the reason).
struct Deliver {
    event_loop: Py<PyAny>,
    on_frames: Py<PyAny>,
    handover: Py<Handover>,
    undelivered: Arc<Undelivered>,
}

impl Deliver {
    fn frames(&self, ready: Vec<Ready>) {
        Python::attach(|py| {
            let mut nbytes = 0;
            let items: Vec<Py<PyAny>> = ready
                .into_iter()
                .map(|r| match r {
                    Ready::Small(b) => {
                        nbytes += b.len();
                        PyBytes::new(py, &b).into_any().unbind()
                    }
                    Ready::Large(obj) => {
                        nbytes += obj.bind(py).len();
                        obj.into_any()
                    }
                })
                .collect();
            let list = match PyList::new(py, items) {
                Ok(list) => list,
                Err(e) => return e.print(py),
            };
            self.undelivered.bytes.fetch_add(nbytes, Ordering::AcqRel);
            let sent = self
                .event_loop
                .call_method1(py, "call_soon_threadsafe", (&self.handover, list, nbytes));
            if let Err(e) = sent {
                self.undelivered.bytes.fetch_sub(nbytes, Ordering::AcqRel);
                e.print(py); // the loop is closed: nobody is left to tell
            }
        });
    }

    fn end(&self, reason: String) {
        Python::attach(|py| {
            let reason = pyo3::types::PyString::new(py, &reason).into_any();
            self.call(py, reason)
        });
    }

    fn call(&self, py: Python<'_>, arg: Bound<'_, PyAny>) {
        let sent = self
            .event_loop
            .call_method1(py, "call_soon_threadsafe", (&self.on_frames, arg));
        if let Err(e) = sent {
            // The loop is closed: nobody is left to tell.
            e.print(py);
        }
    }
}

enum Ready {
    Small(Vec<u8>),
    Large(Py<pyo3::types::PyByteArray>),
}

async fn read_ready(fd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| sys::read_some(inner.get_ref().as_fd(), buf)) {
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

async fn read_loop(fd: Arc<AsyncFd<OwnedFd>>, limit: usize, deliver: Deliver) {
    let reason = match read_frames(&fd, limit, &deliver).await {
        Ok(()) => "eof".to_string(),
        Err(e) => e.to_string(),
    };
    deliver.end(reason);
}

async fn read_frames(fd: &AsyncFd<OwnedFd>, limit: usize, deliver: &Deliver) -> io::Result<()> {
    let mut reader = FrameReader::new(limit);
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut large: Option<LargeFrame> = None;
    loop {
        let mut ready = Vec::new();
        if let Some(frame) = large.as_mut() {
            let n = read_ready(fd, frame.spare()).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed inside a frame",
                ));
            }
            frame.advance(n);
            if frame.is_full() {
                ready.push(Ready::Large(large.take().expect("checked above").into_object()));
            }
        } else {
            let n = read_ready(fd, &mut chunk).await?;
            if n == 0 {
                return if reader.staged() == 0 {
                    Ok(())
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "peer closed inside a frame",
                    ))
                };
            }
            reader.push(&chunk[..n]);
        }
        while large.is_none() {
            match reader
                .take_next()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
            {
                Next::Frame(f) => ready.push(Ready::Small(f)),
                Next::Large { len, head } => {
                    let frame = Python::attach(|py| LargeFrame::new(py, len, &head))
                        .map_err(|e| io::Error::new(io::ErrorKind::OutOfMemory, e.to_string()))?;
                    if frame.is_full() {
                        ready.push(Ready::Large(frame.into_object()));
                    } else {
                        large = Some(frame);
                    }
                }
                Next::NeedMore => break,
            }
        }
        if !ready.is_empty() {
            deliver.frames(ready);
            deliver.undelivered.room().await;
        }
    }
}

async fn write_all(fd: &AsyncFd<OwnedFd>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        let mut guard = fd.writable().await?;
        match guard.try_io(|inner| sys::write_some(inner.get_ref().as_fd(), &[IoSlice::new(bytes)])) {
            Ok(Ok(n)) => bytes = &bytes[n..],
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

async fn write_loop(fd: Arc<AsyncFd<OwnedFd>>, mut outgoing: mpsc::Receiver<Vec<u8>>, queued: Arc<AtomicUsize>) {
    while let Some(bytes) = outgoing.recv().await {
        let written = write_all(&fd, &bytes).await;
        queued.fetch_sub(1, Ordering::AcqRel);
        if written.is_err() {
            return; // the reader sees the same failure and reports it
        }
    }
}

#[pymethods]
impl ThreadChannel {
    /// Runs the connected stream socket `fd` (given up by Python with `socket.detach()`) on
    /// the extension's thread. Received frames reach `on_frames(list)` through
    /// `event_loop.call_soon_threadsafe`; the end reaches `on_frames(reason)`, once.
    #[new]
    #[pyo3(signature = (fd, event_loop, on_frames, max_frame=MAX_FRAME_BYTES))]
    fn new(py: Python<'_>, fd: i32, event_loop: Py<PyAny>, on_frames: Py<PyAny>, max_frame: usize) -> PyResult<Self> {
        let owned = sys::adopt(fd)?;
        let rt = runtime();
        let _entered = rt.enter();
        // SAFETY: an `OwnedFd` keeps its descriptor open, and the same one, until it drops,
        // which is when the `AsyncFd` drops.
        let fd = unsafe { AsyncFd::register(owned) }.map_err(io::Error::from)?;
        let fd = Arc::new(fd);
        let (tx, rx) = mpsc::channel(SEND_QUEUE);
        let queued = Arc::new(AtomicUsize::new(0));
        let undelivered = Arc::new(Undelivered::default());
        let handover = Py::new(
            py,
            Handover {
                undelivered: undelivered.clone(),
                on_frames: on_frames.clone_ref(py),
            },
        )?;
        let deliver = Deliver {
            event_loop,
            on_frames,
            handover,
            undelivered: undelivered.clone(),
        };
        let reader = rt.spawn(read_loop(fd.clone(), max_frame, deliver));
        let writer = rt.spawn(write_loop(fd.clone(), rx, queued.clone()));
        Ok(Self {
            fd,
            outgoing: tx,
            queued,
            undelivered,
            tasks: Mutex::new(vec![reader, writer]),
        })
    }

    /// Bytes of received frames handed to the loop that it has not taken yet.
    fn undelivered(&self) -> usize {
        self.undelivered.bytes.load(Ordering::Acquire)
    }

    /// Queues one frame for the writer task (a copy of `data`, behind its prefix).
    fn send(&self, data: &[u8]) -> PyResult<()> {
        let mut bytes = Vec::with_capacity(frames::PREFIX + data.len());
        frames::encode_into(data, &mut bytes);
        self.queue(bytes)
    }

    /// Writes one frame from the calling thread if nothing is queued before it and the
    /// socket takes it whole; else queues it (what is left of it) for the writer task.
    fn send_now(&self, data: &[u8]) -> PyResult<()> {
        if self.queued.load(Ordering::Acquire) == 0 {
            let prefix = (data.len() as u32).to_be_bytes();
            let fd = self.fd.get_ref().as_fd();
            let n = match sys::write_some(fd, &[IoSlice::new(&prefix), IoSlice::new(data)]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(e) => return Err(PyConnectionError::new_err(e.to_string())),
            };
            if n == prefix.len() + data.len() {
                return Ok(());
            }
            let mut rest = Vec::with_capacity(prefix.len() + data.len() - n);
            if n < prefix.len() {
                rest.extend_from_slice(&prefix[n..]);
                rest.extend_from_slice(data);
            } else {
                rest.extend_from_slice(&data[n - prefix.len()..]);
            }
            return self.queue(rest);
        }
        self.send(data)
    }

    /// The socket's descriptor.
    fn fileno(&self) -> i32 {
        self.fd.get_ref().as_raw_fd()
    }

    /// Shuts the socket down (the peer reads its end) and stops both tasks; the
    /// descriptor is closed when the channel goes.
    fn close(&self) {
        let _ = rustix::net::shutdown(self.fd.get_ref(), rustix::net::Shutdown::Both);
        for t in self.tasks.lock().expect("not poisoned").drain(..) {
            t.abort();
        }
    }
}

impl ThreadChannel {
    fn queue(&self, bytes: Vec<u8>) -> PyResult<()> {
        self.queued.fetch_add(1, Ordering::AcqRel);
        self.outgoing.try_send(bytes).map_err(|e| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            match e {
                mpsc::error::TrySendError::Full(_) => {
                    PyRuntimeError::new_err(format!("send queue full ({SEND_QUEUE} frames not yet written)"))
                }
                mpsc::error::TrySendError::Closed(_) => PyConnectionError::new_err("channel closed"),
            }
        })
    }
}

impl Drop for ThreadChannel {
    fn drop(&mut self) {
        self.close();
    }
}
