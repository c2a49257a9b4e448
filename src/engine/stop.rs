//! A stop whose grace period ran out: the attempts still running are asked
//! to stop at once (`LiveAttempt::stop_now`: a command handler's process
//! group gets SIGKILL; a library handler sees `cancel_requested`), and each
//! that returns within [`STOP_WAIT`] is recorded as a recovery at the next
//! open would record it, but now, with its output and its real end: an
//! `interrupted` attempt, then a failure with no delay (one failure more,
//! still at the head of its queue; no backoff, never a dead letter: the
//! task did not fail), and its group parent brought up to date. An attempt
//! that does not return by then (a library handler that ignores the
//! request, a process that cannot die) stays `running` in the store and is
//! left to that recovery, as before; it is never put back while it may
//! still run.

use std::time::Duration;

use crate::engine::scheduler::{Completion, LOG_TARGET, Named, Scheduler};
use crate::store::{AttemptOutcome, WriteError, WriteTxn};
use crate::task::Task;

/// How long a stop waits, after its grace period, for the attempts it
/// stopped at once to return.
pub const STOP_WAIT: Duration = Duration::from_secs(2);

/// The failure an attempt stopped at the end of the grace period records.
pub const STOPPED_AT_GRACE: &str =
    "interrupted: the daemon stopped and its grace period ran out while this task ran";

impl Scheduler {
    /// Asks every attempt still running to stop at once. Returns how many.
    pub(super) fn stop_running(&mut self) -> usize {
        let ids: Vec<u64> = self.running_jobs().collect();
        for id in &ids {
            self.stopped_at_grace.insert(*id);
            if let Some(a) = self.live.get(*id) {
                a.stop_now();
            }
        }
        ids.len()
    }

    /// Records an attempt that [`Scheduler::stop_running`] stopped (see the
    /// module doc), with `log`, its attempt log (outcome `interrupted`).
    pub(super) fn record_stopped(
        &mut self,
        w: &mut WriteTxn<'_>,
        task: &Task,
        c: &Completion,
        log: crate::store::AttemptLog,
    ) -> Result<(), WriteError> {
        log::warn!(
            target: LOG_TARGET,
            "{} stopped at the end of the grace period (attempt {}, {} ms): back at the head of \
             its queue",
            Named(task),
            task.attempts,
            c.duration_ms,
        );
        debug_assert_eq!(log.outcome, AttemptOutcome::Interrupted);
        self.tally.interrupted += 1;
        w.log_attempt(task.id, log)?;
        w.fail(task.id, STOPPED_AT_GRACE.to_string(), None)?;
        if let Some(p) = task.parent {
            self.parent_due(p, true);
        }
        Ok(())
    }
}
