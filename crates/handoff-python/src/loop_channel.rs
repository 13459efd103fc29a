//! Option (b): a connection driven by the asyncio loop. The loop watches the socket
//! (`add_reader`); when it is readable, Python calls [`LoopChannel::read_frames`], which
//! makes the system calls and the framing here, and returns the frames that are whole.
//!
//! With `on_body`, the body of a frame of [`OFF_LOOP_FROM`] bytes or more is read by a
//! thread of its own instead, with blocking waits: the loop stops watching the socket
//! until `on_body(frame)` comes back through `call_soon_threadsafe`, so that a large frame
//! costs the loop one crossing, not one wake-up per socket buffer.

use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyBufferError, PyConnectionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::frames::{FrameReader, Next, MAX_FRAME_BYTES, PREFIX};
use crate::sys::{self, LargeFrame};

/// Bytes asked of the kernel per read of small frames.
const READ_CHUNK: usize = 256 * 1024;

/// Frames of this size and more are read off the loop when the channel has `on_body`.
pub const OFF_LOOP_FROM: usize = 1 << 20;

/// A body read off the loop fails when no byte came for this long.
const BODY_PROGRESS: Duration = Duration::from_secs(60);

/// Bytes one `read_frames` call reads at most, so that one busy connection leaves the
/// loop to the others between calls.
const READ_BUDGET: usize = 16 * 1024 * 1024;

/// Frames one `read_frames` call returns at most: a peer that sends empty frames would
/// otherwise make one call build a list of `READ_BUDGET / 4` of them. The rest stay staged
/// (at most one read's worth) and come out of the next call, which the caller makes at once
/// when the call said `more`.
pub const FRAMES_PER_CALL: usize = 1024;

/// Bytes `send` keeps for a socket that does not take them, at most (beyond that it raises
/// `BufferError`, and the caller waits for `flush`): a peer that reads nothing holds no
/// more than this of the sender's memory.
pub const MAX_UNSENT: usize = 64 * 1024 * 1024;

struct State {
    reader: FrameReader,
    large: Option<LargeFrame>,
    chunk: Vec<u8>,
    unsent: Vec<u8>,
}

/// A connection whose socket the asyncio loop watches, read and written by Rust.
#[pyclass(module = "handoff._native")]
pub struct LoopChannel {
    fd: Arc<OwnedFd>,
    state: Mutex<State>,
    off_loop: Option<Arc<OffLoop>>,
    body_reading: Arc<AtomicBool>,
}

/// Where a body read off the loop goes: `on_body(bytearray)`, or `on_body(reason)`.
struct OffLoop {
    event_loop: Py<PyAny>,
    on_body: Py<PyAny>,
}

fn read_body(fd: &OwnedFd, frame: &mut LargeFrame) -> io::Result<()> {
    let timeout = rustix::time::Timespec {
        tv_sec: BODY_PROGRESS.as_secs() as i64,
        tv_nsec: 0,
    };
    while !frame.is_full() {
        match sys::read_some(fd.as_fd(), frame.spare()) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed inside a frame",
                ))
            }
            Ok(n) => frame.advance(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                if rustix::event::poll(&mut fds, Some(&timeout))? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no byte of the frame for {} s", BODY_PROGRESS.as_secs()),
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn spawn_body_reader(fd: Arc<OwnedFd>, mut frame: LargeFrame, off: Arc<OffLoop>, busy: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let result = read_body(&fd, &mut frame);
        busy.store(false, Ordering::Release);
        Python::attach(|py| {
            let arg = match result {
                Ok(()) => frame.into_object().into_any(),
                Err(e) => pyo3::types::PyString::new(py, &e.to_string()).into_any().unbind(),
            };
            if let Err(e) = off
                .event_loop
                .call_method1(py, "call_soon_threadsafe", (&off.on_body, arg))
            {
                e.print(py);
            }
        });
    });
}

/// Where taking staged frames stopped.
enum Staged {
    /// The call returns [`FRAMES_PER_CALL`] frames: the rest wait for the next call.
    Full,
    /// A large body is now read off the loop.
    OffLoop,
    /// No whole frame is staged (or a large one waits for its body): read the socket.
    NeedMore,
}

impl LoopChannel {
    /// Moves the whole frames staged in `state` to `out`, up to [`FRAMES_PER_CALL`].
    fn take_staged(&self, py: Python<'_>, state: &mut State, out: &Bound<'_, PyList>) -> PyResult<Staged> {
        loop {
            if out.len() >= FRAMES_PER_CALL {
                return Ok(Staged::Full);
            }
            if state.large.is_some() {
                break;
            }
            match state
                .reader
                .take_next()
                .map_err(|e| PyValueError::new_err(e.to_string()))?
            {
                Next::Frame(f) => out.append(PyBytes::new(py, &f))?,
                Next::Large { len, head } => {
                    let frame = LargeFrame::new(py, len, &head)?;
                    if let (false, Some(off)) = (frame.is_full() || len < OFF_LOOP_FROM, &self.off_loop) {
                        self.body_reading.store(true, Ordering::Release);
                        spawn_body_reader(self.fd.clone(), frame, off.clone(), self.body_reading.clone());
                        return Ok(Staged::OffLoop);
                    }
                    if frame.is_full() {
                        out.append(frame.into_object())?;
                    } else {
                        state.large = Some(frame);
                    }
                }
                Next::NeedMore => break,
            }
        }
        Ok(Staged::NeedMore)
    }
}

fn connection_error(e: io::Error) -> PyErr {
    PyConnectionError::new_err(e.to_string())
}

#[pymethods]
impl LoopChannel {
    /// Wraps the connected stream socket `fd` (given up by Python with `socket.detach()`).
    /// With `event_loop` and `on_body`, large bodies are read off the loop (see the module).
    #[new]
    #[pyo3(signature = (fd, max_frame=MAX_FRAME_BYTES, event_loop=None, on_body=None))]
    fn new(fd: i32, max_frame: usize, event_loop: Option<Py<PyAny>>, on_body: Option<Py<PyAny>>) -> PyResult<Self> {
        let off_loop = match (event_loop, on_body) {
            (Some(event_loop), Some(on_body)) => Some(Arc::new(OffLoop { event_loop, on_body })),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("event_loop and on_body go together")),
        };
        let fd = Arc::new(sys::adopt(fd)?);
        let state = State {
            reader: FrameReader::new(max_frame),
            large: None,
            chunk: vec![0; READ_CHUNK],
            unsent: Vec::new(),
        };
        Ok(Self {
            fd,
            state: Mutex::new(state),
            off_loop,
            body_reading: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The socket's descriptor, for `loop.add_reader` and `add_writer`.
    fn fileno(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Reads what the socket has (up to a budget) and returns `(frames, off_loop, more)`:
    /// the frames now whole, in order (`bytes` for small ones, `bytearray` for large ones),
    /// at most [`FRAMES_PER_CALL`]; whether a body is now being read off the loop (stop
    /// watching the socket until `on_body` is called); and whether whole frames are left
    /// staged (call again now: the socket may not become readable for them). `None` at a
    /// clean end; `ConnectionError` for an end inside a frame, `ValueError` for a frame
    /// over the bound.
    fn read_frames<'py>(&self, py: Python<'py>) -> PyResult<Option<(Bound<'py, PyList>, bool, bool)>> {
        if self.body_reading.load(Ordering::Acquire) {
            return Err(PyValueError::new_err(
                "a body is being read off the loop: wait for on_body",
            ));
        }
        let mut state = self.state.lock().expect("not poisoned");
        let state = &mut *state;
        let out = PyList::empty(py);
        let mut read = 0usize;
        loop {
            // What is staged first: frames a capped call left, then what this one read.
            match self.take_staged(py, state, &out)? {
                Staged::Full => return Ok(Some((out, false, true))),
                Staged::OffLoop => return Ok(Some((out, true, false))),
                Staged::NeedMore => {}
            }
            if read >= READ_BUDGET {
                break;
            }
            if let Some(frame) = state.large.as_mut() {
                let fd = self.fd.as_fd();
                let got = py.detach(|| sys::read_some(fd, frame.spare()));
                let n = match got {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(connection_error(e)),
                };
                if n == 0 {
                    return Err(PyConnectionError::new_err("peer closed inside a frame"));
                }
                read += n;
                frame.advance(n);
                if frame.is_full() {
                    out.append(state.large.take().expect("checked above").into_object())?;
                }
                continue;
            }
            let n = match sys::read_some(self.fd.as_fd(), &mut state.chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(connection_error(e)),
            };
            if n == 0 {
                if state.reader.staged() == 0 && out.is_empty() {
                    return Ok(None);
                }
                if state.reader.staged() == 0 {
                    return Ok(Some((out, false, false))); // the end comes on the next call
                }
                return Err(PyConnectionError::new_err("peer closed inside a frame"));
            }
            read += n;
            state.reader.push(&state.chunk[..n]);
        }
        Ok(Some((out, false, false)))
    }

    /// Writes one frame, as much as the socket takes now. `True` when all of it is written;
    /// `False` when the rest waits: call `flush` when the socket is writable. `BufferError`,
    /// and nothing kept, when what waits would pass [`MAX_UNSENT`].
    fn send(&self, data: &[u8]) -> PyResult<bool> {
        let mut state = self.state.lock().expect("not poisoned");
        let prefix = (data.len() as u32).to_be_bytes();
        if state.unsent.len() + PREFIX + data.len() > MAX_UNSENT && !state.unsent.is_empty() {
            return Err(PyBufferError::new_err(format!(
                "{} bytes wait for a socket that takes none (the bound is {MAX_UNSENT}): call flush when it is writable",
                state.unsent.len()
            )));
        }
        if !state.unsent.is_empty() {
            state.unsent.extend_from_slice(&prefix);
            state.unsent.extend_from_slice(data);
            return Ok(false);
        }
        let n = match sys::write_some(self.fd.as_fd(), &[IoSlice::new(&prefix), IoSlice::new(data)]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(connection_error(e)),
        };
        if n == PREFIX + data.len() {
            return Ok(true);
        }
        if n < PREFIX {
            state.unsent.extend_from_slice(&prefix[n..]);
            state.unsent.extend_from_slice(data);
        } else {
            state.unsent.extend_from_slice(&data[n - PREFIX..]);
        }
        Ok(false)
    }

    /// Shuts the socket down: the peer reads its end. The descriptor is closed when the
    /// channel goes.
    fn close(&self) {
        let _ = rustix::net::shutdown(&*self.fd, rustix::net::Shutdown::Both);
    }

    /// Writes what `send` left. `True` when nothing is left.
    fn flush(&self) -> PyResult<bool> {
        let mut state = self.state.lock().expect("not poisoned");
        while !state.unsent.is_empty() {
            match sys::write_some(self.fd.as_fd(), &[IoSlice::new(&state.unsent)]) {
                Ok(n) => {
                    state.unsent.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(connection_error(e)),
            }
        }
        Ok(true)
    }
}
