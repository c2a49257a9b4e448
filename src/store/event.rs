//! The event log's records. Every state change is an [`Event`]; the store
//! changes a task only by applying an event to it ([`apply`]), in the same
//! atomic write that appends the event, so replaying the log rebuilds the
//! state exactly (see `verify`).

use bincode::{Decode, Encode};

use crate::budget::Blob;
use crate::store::attempts::AttemptLog;
use crate::store::order::Placement;
use crate::task::{Status, Task};

/// The message a task gets when the process died while it ran.
pub const INTERRUPTED: &str = "interrupted: the process stopped while this task ran";

pub use crate::store::commit_record::{CommitRecord, FromEvent, KeyWrite};

#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
#[bincode(decode_context = "crate::codec::Layout")]
pub struct Event {
    pub seq: u64,
    /// Milliseconds since the epoch.
    pub at: u64,
    pub kind: EventKind,
}

/// A task inside an event is decoded at its record's version (see `codec`).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
#[bincode(decode_context = "crate::codec::Layout")]
pub enum EventKind {
    /// A new task; `placement` is None for a group child that waits for its parent.
    Enqueued {
        task: Box<Task>,
        placement: Option<Placement>,
    },
    /// A waiting task was put into a queue (a group child dispatched).
    Placed {
        id: u64,
        queue: String,
        placement: Placement,
    },
    Started {
        id: u64,
    },
    Succeeded {
        id: u64,
        result: Option<Blob>,
    },
    /// An attempt failed; the task stays queued and may run again after `delay_ms`.
    Failed {
        id: u64,
        message: String,
        delay_ms: Option<u64>,
    },
    /// The task goes back to waiting without a failure (repeat, keep, delay).
    Requeued {
        id: u64,
        retry_at: Option<u64>,
    },
    /// A group parent's view of its children changed.
    GroupUpdated {
        id: u64,
        name: String,
        failures: u32,
        message: Option<String>,
    },
    /// The task was deleted with no trace but this event.
    Removed {
        id: u64,
    },
    /// The task left its queue for the history with its final status.
    MovedToHistory {
        id: u64,
        status: Status,
    },
    // New variants go last: bincode encodes the variant's position.
    /// A dead letter went back from the history to its queue, failures
    /// reset, keeping the times of its last run. Written by the builds
    /// before [`EventKind::RetriedAnew`] (which this build writes instead),
    /// and replayed as they applied it.
    Retried {
        id: u64,
        placement: Placement,
    },
    /// An attempt ended; its log goes under `o` ‖ id ‖ attempt, and the
    /// task's logs beyond the last `KEEP_ATTEMPTS` are dropped (see
    /// `attempts`). The task itself does not change. (Variant 10.)
    AttemptLogged {
        id: u64,
        log: Box<AttemptLog>,
    },
    /// `berth task cancel`: the task ends as `cancelled`; a
    /// `MovedToHistory(cancelled)` follows in the same commit. (Variant 11.)
    Cancelled {
        id: u64,
    },
    /// The task was not started within its TTL (see `ttl`): it ends as
    /// `expired`; a `MovedToHistory(expired)` follows in the same commit.
    /// (Variant 12.)
    Expired {
        id: u64,
    },
    /// An enqueue with the task's compaction key was merged into it while it
    /// waited: the task takes the newer payload and keeps everything else
    /// (its id, its place, its counts). See `compaction`.
    Merged {
        id: u64,
        payload: Blob,
    },
    /// A dead letter went back from the history to its queue (`task
    /// retry`), failures reset, and queued anew: queued at this event's
    /// time, not started since (so `task list --since` and the wait shown
    /// count from the retry). (Variant 14.)
    RetriedAnew {
        id: u64,
        placement: Placement,
    },
}

impl EventKind {
    /// The task this event is about.
    pub fn task_id(&self) -> u64 {
        match self {
            EventKind::Enqueued { task, .. } => task.id,
            EventKind::Placed { id, .. }
            | EventKind::Started { id }
            | EventKind::Succeeded { id, .. }
            | EventKind::Failed { id, .. }
            | EventKind::Requeued { id, .. }
            | EventKind::GroupUpdated { id, .. }
            | EventKind::Removed { id }
            | EventKind::Retried { id, .. }
            | EventKind::RetriedAnew { id, .. }
            | EventKind::AttemptLogged { id, .. }
            | EventKind::Cancelled { id }
            | EventKind::Expired { id }
            | EventKind::Merged { id, .. }
            | EventKind::MovedToHistory { id, .. } => *id,
        }
    }

    /// New work, which the disk-space guard refuses while space is short
    /// (see `health`): a task added, a dead letter put back, an enqueue
    /// merged into a waiting task.
    pub fn is_new_work(&self) -> bool {
        matches!(
            self,
            EventKind::Enqueued { .. }
                | EventKind::Retried { .. }
                | EventKind::RetriedAnew { .. }
                | EventKind::Merged { .. }
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Enqueued { .. } => "enqueued",
            EventKind::Placed { .. } => "placed",
            EventKind::Started { .. } => "started",
            EventKind::Succeeded { .. } => "succeeded",
            EventKind::Failed { .. } => "failed",
            EventKind::Requeued { .. } => "requeued",
            EventKind::GroupUpdated { .. } => "group-updated",
            EventKind::Removed { .. } => "removed",
            EventKind::Retried { .. } | EventKind::RetriedAnew { .. } => "retried",
            EventKind::MovedToHistory { .. } => "moved-to-history",
            EventKind::AttemptLogged { .. } => "attempt-logged",
            EventKind::Cancelled { .. } => "cancelled",
            EventKind::Merged { .. } => "merged",
            EventKind::Expired { .. } => "expired",
        }
    }
}

/// Applies an event's effect on the task's fields (not on queue order).
/// `Enqueued` and `Removed` create and delete tasks and are handled by the
/// caller; `AttemptLogged` changes no task field (its log is a key of its own).
pub fn apply(task: &mut Task, at: u64, kind: &EventKind) {
    match kind {
        EventKind::Enqueued { .. }
        | EventKind::Removed { .. }
        | EventKind::AttemptLogged { .. } => {}
        EventKind::Cancelled { .. } => {
            task.status = Status::Cancelled;
            task.retry_at = None;
            task.finished_at = Some(at);
        }
        EventKind::Expired { .. } => {
            task.status = Status::Expired;
            task.retry_at = None;
            task.finished_at = Some(at);
        }
        EventKind::Merged { payload, .. } => task.payload = payload.clone(),
        EventKind::Placed { queue, .. } => task.queue = queue.clone(),
        EventKind::Started { .. } => {
            task.status = Status::Running;
            task.started_at = Some(at);
            task.attempts = task.attempts.saturating_add(1);
            task.retry_at = None;
        }
        EventKind::Succeeded { result, .. } => {
            task.status = Status::Succeeded;
            task.finished_at = Some(at);
            if result.is_some() {
                task.result = result.clone();
            }
        }
        EventKind::Failed {
            message, delay_ms, ..
        } => {
            task.status = Status::Queued;
            task.failures = task.failures.saturating_add(1);
            task.last_failure = Some(message.clone());
            task.retry_at = delay_ms.map(|d| at.saturating_add(d));
        }
        EventKind::Requeued { retry_at, .. } => {
            task.status = Status::Queued;
            task.retry_at = *retry_at;
        }
        EventKind::GroupUpdated {
            name,
            failures,
            message,
            ..
        } => {
            task.name = name.clone();
            task.failures = *failures;
            task.last_failure = message.clone();
        }
        EventKind::Retried { .. } | EventKind::RetriedAnew { .. } => {
            task.status = Status::Queued;
            task.failures = 0;
            task.retry_at = None;
            task.finished_at = None;
            // Queued anew; the old event kept the times of the last run.
            if matches!(kind, EventKind::RetriedAnew { .. }) {
                task.queued_at = at;
                task.started_at = None;
            }
        }
        EventKind::MovedToHistory { status, .. } => {
            task.status = *status;
            task.retry_at = None;
            if task.finished_at.is_none() {
                task.finished_at = Some(at);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{Task, TaskSpec};

    /// The two retry events: the old one, as older builds wrote and applied
    /// it, keeps the times of the task's last run; the one this build writes
    /// queues it anew at the event's time.
    #[test]
    fn a_retry_keeps_the_old_times_only_in_an_old_event() {
        let mut dead = TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: "a".into(),
            ..Default::default()
        }
        .into_task(1_000, &crate::budget::Budget::default())
        .expect("task");
        dead.id = 7;
        for (at, kind) in [
            (2_000, EventKind::Started { id: 7 }),
            (
                3_000,
                EventKind::Failed {
                    id: 7,
                    message: "boom".into(),
                    delay_ms: None,
                },
            ),
            (
                3_000,
                EventKind::MovedToHistory {
                    id: 7,
                    status: Status::Failed,
                },
            ),
        ] {
            apply(&mut dead, at, &kind);
        }
        let retried = |kind: EventKind| -> Task {
            let mut t = dead.clone();
            apply(&mut t, 9_000, &kind);
            t
        };
        let old = retried(EventKind::Retried {
            id: 7,
            placement: Placement::Last,
        });
        let anew = retried(EventKind::RetriedAnew {
            id: 7,
            placement: Placement::Last,
        });
        for t in [&old, &anew] {
            assert_eq!(t.status, Status::Queued);
            assert_eq!((t.failures, t.attempts), (0, 1));
            assert_eq!((t.finished_at, t.retry_at), (None, None));
        }
        assert_eq!((old.queued_at, old.started_at), (1_000, Some(2_000)));
        assert_eq!((anew.queued_at, anew.started_at), (9_000, None));
        assert_eq!(old.kind, anew.kind);
        assert_eq!(
            EventKind::RetriedAnew {
                id: 7,
                placement: Placement::Last
            }
            .name(),
            "retried"
        );
    }
}
