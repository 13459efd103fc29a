//! `Inbox`: the engine's inbox (`handoff_proto::inbox`) for the Python node, so that the
//! Python and Rust nodes serve their connections by one algorithm. Python keeps the wait
//! for a message (`handoff.inbox`); this holds the queues and chooses the next message.

use handoff_proto::inbox::{self, Queued};
use pyo3::prelude::*;

/// A waiting message: the object, its connection's key and its weight in bytes.
struct Entry {
    connection: usize,
    weight: u64,
    message: Py<PyAny>,
}

impl Queued for Entry {
    fn connection(&self) -> usize {
        self.connection
    }

    fn weight(&self) -> u64 {
        self.weight
    }
}

/// Messages for the application, taken fairly from each connection (see
/// `handoff_proto::inbox`): sparse connections first, then open ones by deficit
/// round-robin in bytes, then closed ones.
#[pyclass(module = "handoff._native")]
pub struct Inbox {
    queues: inbox::Inbox<Entry>,
}

#[pymethods]
impl Inbox {
    /// An inbox whose connections gain `quantum` bytes of credit per turn.
    #[new]
    fn new(quantum: u64) -> Inbox {
        Inbox {
            queues: inbox::Inbox::with_quantum(quantum),
        }
    }

    /// Adds `message` behind the others of connection `connection` (any integer unique
    /// among the node's live connections), weighing `weight` bytes; returns whether the
    /// inbox had been empty.
    fn push(&mut self, connection: usize, weight: u64, message: Py<PyAny>) -> bool {
        self.queues.push(Entry {
            connection,
            weight,
            message,
        })
    }

    /// The next message, or `None` if none waits.
    fn pop(&mut self) -> Option<Py<PyAny>> {
        self.queues.try_pop().map(|e| e.message)
    }

    /// Connection `connection` has closed: its messages wait until no open connection has
    /// one.
    fn closed(&mut self, connection: usize) {
        self.queues.closed(connection);
    }

    fn __len__(&self) -> usize {
        self.queues.len()
    }

    fn __bool__(&self) -> bool {
        !self.queues.is_empty()
    }
}
