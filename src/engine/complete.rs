//! An attempt's outcome, turned into store events in the step's transaction:
//! its log (`attempt-logged`: outcome, exit, output tails), follow-up tasks,
//! then success (result, to the history), failure (backoff, or after the
//! last attempt a dead letter), repeat or keep; and the group parent of a
//! child brought up to date (`groups::progress` decides what it becomes).
//! An attempt whose task was being cancelled ends it `cancelled`, whatever
//! it returned. The queue's own state moves through `dispatch.rs`.

use crate::budget::Budget;
use crate::engine::handler::{FollowUpAt, Outcome, REPEAT_INTERVAL, RunResult};
use crate::engine::live::Captured;
use crate::engine::scheduler::{Completion, LOG_TARGET, Named, Scheduler, StepEnv};
use crate::store::{AttemptLog, AttemptOutcome, OutputTail, Placement, WriteError, WriteTxn};
use crate::task::{Status, Task};

impl Scheduler {
    /// Applies one completion. Returns Err only for store failures.
    pub fn complete(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        c: Completion,
    ) -> Result<(), WriteError> {
        self.returned(&c.queue);
        self.live.end(c.id);
        let cancelled = self.cancels.stopping.remove(&c.id);
        let stopped = self.stopped_at_grace.remove(&c.id);
        let now = w.now();
        if !w.exists(c.id) || !w.is_live(c.id)? {
            log::info!(
                target: LOG_TARGET,
                "task {} finished after it was removed; its outcome is dropped",
                c.id
            );
            return Ok(());
        }
        let task = w.task(c.id)?.clone();
        let log_of = |outcome| attempt_log(&task, now, c.began_at, outcome, &c.output, env.budget);
        if cancelled {
            log::info!(
                target: LOG_TARGET,
                "{} ended (attempt {}, {} ms): cancelled",
                Named(&task),
                task.attempts,
                c.duration_ms,
            );
            w.log_attempt(task.id, log_of(AttemptOutcome::Cancelled))?;
            w.cancel_one(task.id)?;
            if let Some(p) = task.parent {
                self.parent_due(p, false);
            }
            return Ok(());
        }
        if stopped {
            let log = log_of(AttemptOutcome::Interrupted);
            return self.record_stopped(w, &task, &c, log);
        }
        let mut outcome = c.outcome;
        let follow = checked_follow_ups(&task, &mut outcome, now, env.budget);
        log::info!(
            target: LOG_TARGET,
            "{} ended (attempt {}, {} ms): {}",
            Named(&task),
            task.attempts,
            c.duration_ms,
            outcome_word(&outcome.result)
        );
        w.log_attempt(
            task.id,
            log_of(attempt_outcome(&outcome.result, c.output.timed_out)),
        )?;
        for (t, at) in follow {
            let placement = follow_up_placement(&task, &t, at);
            w.enqueue(t, Some(placement))?;
        }
        let delay_ms = outcome.delay.map(|d| d.as_millis() as u64);
        match outcome.result {
            RunResult::Success => {
                let result = outcome
                    .output
                    .as_ref()
                    .and_then(|v| env.budget.result_blob(v, outcome.output_cut.as_deref()));
                w.succeed(task.id, result)?;
                w.to_history(task.id, Status::Succeeded)?;
                self.tally.succeeded += 1;
                if let Some(d) = delay_ms {
                    self.sleep(&task.queue, None, now, d, false);
                }
                if let Some(p) = task.parent {
                    self.parent_due(p, false);
                }
            }
            RunResult::Fail(message) => self.failed(w, env, &task, message, now)?,
            RunResult::Repeat => {
                w.requeue(task.id, None)?;
                // Throttled: the next start comes at least REPEAT_INTERVAL
                // after this one (at once if the attempt took that long).
                let started = task.started_at.unwrap_or(now);
                let ready = started.saturating_add(REPEAT_INTERVAL.as_millis() as u64);
                self.repeat(&task.queue, task.id, now, ready);
            }
            RunResult::Keep => {
                let d = delay_ms.unwrap_or(env.config.keep_delay.as_millis() as u64);
                w.requeue(task.id, Some(now + d))?;
                self.sleep(&task.queue, Some(task.id), now, d, false);
            }
        }
        Ok(())
    }

    /// A failed attempt: the task waits at the head for its backoff, or,
    /// with its attempts used up, goes to the history as a dead letter.
    fn failed(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        task: &Task,
        message: String,
        now: u64,
    ) -> Result<(), WriteError> {
        self.tally.failed_attempts += 1;
        let failures = task.failures + 1;
        if env.config.backoff.exhausted(failures) {
            w.fail(task.id, message, None)?;
            w.to_history(task.id, Status::Failed)?;
            self.tally.dead_letters += 1;
            log::warn!(
                target: LOG_TARGET,
                "task {} {} used up its {} attempts: dead letter",
                task.id,
                task.name,
                failures
            );
        } else {
            let d = env.config.backoff.delay_random(failures).as_millis() as u64;
            w.fail(task.id, message, Some(d))?;
            self.sleep(&task.queue, Some(task.id), now, d, true);
        }
        if let Some(p) = task.parent {
            self.parent_due(p, true);
        }
        Ok(())
    }

    /// Notes that a child of `parent` changed (`failed`: by a failed
    /// attempt); the parent is brought up to date by `settle_parents`.
    pub(super) fn parent_due(&mut self, parent: u64, failed: bool) {
        *self.parents_due.entry(parent).or_default() += u32::from(failed);
    }

    /// Brings every parent noted since the last call up to date, once each,
    /// in `w`. The step calls it before it commits and before it starts
    /// anything (a group that finished frees its queue).
    pub fn settle_parents(&mut self, w: &mut WriteTxn<'_>) -> Result<(), WriteError> {
        for (parent, failures) in std::mem::take(&mut self.parents_due) {
            self.update_parent(w, parent, failures)?;
        }
        Ok(())
    }

    /// Brings a group parent up to date with its children; finishes it when
    /// every child has finished.
    pub(super) fn update_parent(
        &mut self,
        w: &mut WriteTxn<'_>,
        parent: u64,
        child_failures: u32,
    ) -> Result<(), WriteError> {
        if !w.exists(parent) || !w.is_live(parent)? {
            return Ok(());
        }
        let (queue, kind) = {
            let p = w.task(parent)?;
            (p.queue.clone(), p.kind.clone())
        };
        let g = w.group_progress(parent, child_failures)?;
        w.update_group(parent, g.name, g.failures, g.message)?;
        let Some(status) = g.finished else {
            return Ok(());
        };
        if self.cancels.groups.remove(&parent) {
            // The group was cancelled: its last running child has returned.
            w.cancel_one(parent)?;
            log::info!(target: LOG_TARGET, "group {parent} {kind} cancelled");
            self.group_finished(&queue, parent);
            return Ok(());
        }
        w.to_history(parent, status)?;
        if status == Status::Failed {
            self.tally.dead_letters += 1;
        } else {
            self.tally.succeeded += 1;
        }
        log::info!(target: LOG_TARGET, "group {parent} {kind} finished");
        self.group_finished(&queue, parent);
        Ok(())
    }
}

/// The follow-ups of an attempt that did not fail, as tasks (a follow-up
/// without a queue goes to the task's). They are checked before anything is
/// applied: an invalid one fails the attempt, and then none is added.
fn checked_follow_ups(
    task: &Task,
    outcome: &mut Outcome,
    now: u64,
    budget: &Budget,
) -> Vec<(Task, FollowUpAt)> {
    let mut follow = Vec::new();
    if matches!(outcome.result, RunResult::Fail(_)) {
        return follow;
    }
    for (i, f) in outcome.follow_ups.iter().enumerate() {
        let mut spec = f.spec.clone();
        if spec.queue.is_empty() {
            spec.queue = task.queue.clone();
        }
        match spec.into_task(now, budget) {
            Ok(t) => follow.push((t, f.at)),
            Err(e) => {
                outcome.result = RunResult::Fail(format!("follow-up task {i}: {}: {e}", e.field()));
                follow.clear();
                break;
            }
        }
    }
    follow
}

/// Where follow-up `t` of `task` goes: after the current task only in its
/// own queue; in another queue, at the tail.
fn follow_up_placement(task: &Task, t: &Task, at: FollowUpAt) -> Placement {
    match at {
        FollowUpAt::Head => Placement::First,
        FollowUpAt::Tail => Placement::Last,
        FollowUpAt::AfterCurrent if t.queue == task.queue => Placement::After(task.id),
        FollowUpAt::AfterCurrent => Placement::Last,
    }
}

/// An attempt's log, from the task as it was when the attempt ended. It
/// started when its handler began (`began_at`: a worker took it, a moment
/// after the task's start), or, if it never ran, when it ended; never
/// before the task's start or after now.
fn attempt_log(
    task: &Task,
    now: u64,
    began_at: Option<u64>,
    outcome: AttemptOutcome,
    out: &Captured,
    budget: &Budget,
) -> AttemptLog {
    let start = task.started_at.unwrap_or(now).min(now);
    AttemptLog {
        attempt: task.attempts,
        started_at: began_at.unwrap_or(now).clamp(start, now),
        ended_at: now,
        outcome,
        exit_code: out.exit_code,
        signal: out.signal,
        stdout: OutputTail::new(out.stdout.total, out.stdout.end(), budget),
        stderr: OutputTail::new(out.stderr.total, out.stderr.end(), budget),
    }
}

/// How an attempt ended, for its log: a failure after a process ran past
/// its timeout is `timed out`.
fn attempt_outcome(result: &RunResult, timed_out: bool) -> AttemptOutcome {
    match result {
        RunResult::Success => AttemptOutcome::Succeeded,
        RunResult::Fail(m) if timed_out => AttemptOutcome::TimedOut { message: m.clone() },
        RunResult::Fail(m) => AttemptOutcome::Failed { message: m.clone() },
        RunResult::Repeat => AttemptOutcome::Repeat,
        RunResult::Keep => AttemptOutcome::Keep,
    }
}

/// How an attempt ended, for its log line.
fn outcome_word(result: &RunResult) -> String {
    match result {
        RunResult::Success => "succeeded".to_string(),
        RunResult::Fail(m) => format!("failed: {m}"),
        RunResult::Repeat => "repeat".into(),
        RunResult::Keep => "keep".into(),
    }
}
