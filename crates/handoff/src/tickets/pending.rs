//! Ticket requests waiting on a connection for the owner's answer, and the answers the
//! connection's read loop hands them.

use handoff_proto::established::Refused;
use tokio::sync::oneshot;

pub(crate) use handoff_proto::ticket_requests::Answer;

/// Where the answer to a request waiting on a connection goes, or the owner's refusal
/// (the engine's `ticket_requests` table keeps what each asked for).
pub(crate) type Waiter = oneshot::Sender<Result<Answer, Refused>>;
