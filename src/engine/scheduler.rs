//! The scheduler: the one owner of "what runs where". Each step applies the
//! completions that came back from the pool and starts every queue's head
//! that is ready, all in one store transaction, so several completions and
//! starts share one atomic write and one flush. Nothing is handed to the
//! pool before the write that records its start is durable.
//!
//! Invariants kept here: a queue runs at most its head task; a failed head
//! stays at the head until its retry time; a repeating head starts at most
//! once per `REPEAT_INTERVAL`; a group parent's queue waits for
//! every child; a finished task leaves its queue in the same write that
//! records how it finished.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Sender;

use crate::budget::Budget;
use crate::engine::EngineConfig;
use crate::engine::handler::{
    FollowUpAt, Handlers, Outcome, REPEAT_INTERVAL, RunResult, TaskContext, run_attempt,
};
use crate::engine::pool::Job;
use crate::engine::status::QueueActivity;
use crate::groups::{self, Child};
use crate::queues::parallel_queue;
use crate::store::{Placement, WriteError, WriteTxn};
use crate::task::{Status, Task};

/// A finished attempt, sent back from a worker.
#[derive(Debug)]
pub struct Completion {
    pub id: u64,
    pub queue: String,
    pub outcome: Outcome,
    pub duration_ms: u64,
}

/// Messages to the scheduler.
#[derive(Debug)]
pub enum Msg {
    Done(Completion),
    Wake,
}

#[derive(Debug)]
struct Running {
    id: u64,
    since: u64,
    /// Set by the worker when it picks the job up.
    picked: Arc<AtomicBool>,
    /// A group parent waiting for its children (no job in the pool).
    group: bool,
    /// Started again because it asked to repeat.
    repeat: bool,
}

#[derive(Debug, Default)]
struct QueueState {
    running: Option<Running>,
    /// Do not start anything before this time.
    sleep_until: u64,
    activity_after: Option<QueueActivity>,
}

/// A queue's activity as of the last step, plus the pickup flag of a job
/// waiting for a worker.
#[derive(Debug, Clone)]
pub struct LiveActivity {
    pub activity: QueueActivity,
    pub picked: Option<Arc<AtomicBool>>,
}

impl LiveActivity {
    /// The activity now.
    pub fn current(&self) -> QueueActivity {
        match &self.picked {
            Some(p) if p.load(Ordering::SeqCst) => QueueActivity::Running,
            _ => self.activity.clone(),
        }
    }
}

/// Counts of how tasks ended, for `--until-idle` and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub succeeded: u64,
    pub failed_attempts: u64,
    pub dead_letters: u64,
}

pub struct Scheduler {
    queues: BTreeMap<String, QueueState>,
    in_flight: usize,
    pub tally: Tally,
}

/// What the scheduler needs from the engine for one step.
pub struct StepEnv<'a> {
    pub config: &'a EngineConfig,
    pub handlers: &'a Arc<Handlers>,
    pub budget: &'a Budget,
    pub tx: &'a Sender<Msg>,
}

impl Scheduler {
    pub fn new() -> Self {
        Scheduler {
            queues: BTreeMap::new(),
            in_flight: 0,
            tally: Tally::default(),
        }
    }

    /// Jobs handed to the pool and not yet back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The earliest time a sleeping queue may start something.
    pub fn next_wake(&self, now: u64) -> Option<u64> {
        self.queues
            .values()
            .filter(|q| q.running.is_none() && q.sleep_until > now)
            .map(|q| q.sleep_until)
            .min()
    }

    /// Each known queue's activity now. A job not yet picked up by a worker
    /// carries its flag, so a reader sees the pickup without a new snapshot.
    pub fn activities(&self, now: u64) -> BTreeMap<String, LiveActivity> {
        self.queues
            .iter()
            .map(|(name, q)| {
                let mut picked = None;
                let a = match &q.running {
                    Some(r) if !r.group && !r.picked.load(Ordering::SeqCst) => {
                        picked = Some(r.picked.clone());
                        if r.repeat {
                            QueueActivity::Repeat
                        } else {
                            QueueActivity::WaitingForWorker { since_ms: r.since }
                        }
                    }
                    Some(_) => QueueActivity::Running,
                    None => match &q.activity_after {
                        Some(QueueActivity::SleepAfterFail { .. })
                        | Some(QueueActivity::Sleep { .. })
                            if q.sleep_until <= now =>
                        {
                            QueueActivity::Idle
                        }
                        Some(a) => a.clone(),
                        None => QueueActivity::Idle,
                    },
                };
                (
                    name.clone(),
                    LiveActivity {
                        activity: a,
                        picked,
                    },
                )
            })
            .collect()
    }

    fn queue(&mut self, name: &str) -> &mut QueueState {
        self.queues.entry(name.to_string()).or_default()
    }

    /// Applies one completion. Returns Err only for store failures.
    pub fn complete(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        c: Completion,
    ) -> Result<(), WriteError> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let now = w.now();
        let q = self.queue(&c.queue);
        q.running = None;
        q.activity_after = None;
        if !w.exists(c.id) || !w.is_live(c.id)? {
            log::info!(
                "task {} finished after it was removed; its outcome is dropped",
                c.id
            );
            return Ok(());
        }
        let task = w.task(c.id)?.clone();
        let mut outcome = c.outcome;
        // Check follow-ups before applying anything: an invalid one fails the attempt.
        let mut follow = Vec::new();
        if !matches!(outcome.result, RunResult::Fail(_)) {
            for (i, f) in outcome.follow_ups.iter().enumerate() {
                let mut spec = f.spec.clone();
                if spec.queue.is_empty() {
                    spec.queue = task.queue.clone();
                }
                match spec.into_task(now, env.budget) {
                    Ok(t) => follow.push((t, f.at)),
                    Err(e) => {
                        outcome.result =
                            RunResult::Fail(format!("follow-up task {i}: {}: {e}", e.field()));
                        follow.clear();
                        break;
                    }
                }
            }
        }
        let outcome_word = match &outcome.result {
            RunResult::Success => "succeeded".to_string(),
            RunResult::Fail(m) => format!("failed: {m}"),
            RunResult::Repeat => "repeat".into(),
            RunResult::Keep => "keep".into(),
        };
        log::info!(
            "task {} {} {} in {} ended (attempt {}, {} ms): {}",
            task.id,
            task.kind,
            task.name,
            task.queue,
            task.attempts,
            c.duration_ms,
            outcome_word
        );
        for (t, at) in follow {
            let placement = match at {
                FollowUpAt::Head => Placement::First,
                FollowUpAt::Tail => Placement::Last,
                FollowUpAt::AfterCurrent if t.queue == task.queue => Placement::After(task.id),
                FollowUpAt::AfterCurrent => Placement::Last,
            };
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
                    self.sleep(&task.queue, now, d, false);
                }
                if let Some(p) = task.parent {
                    self.update_parent(w, p, false)?;
                }
            }
            RunResult::Fail(message) => {
                self.tally.failed_attempts += 1;
                let failures = task.failures + 1;
                if env.config.backoff.exhausted(failures) {
                    w.fail(task.id, message, None)?;
                    w.to_history(task.id, Status::Failed)?;
                    self.tally.dead_letters += 1;
                    log::warn!(
                        "task {} {} used up its {} attempts: dead letter",
                        task.id,
                        task.name,
                        failures
                    );
                } else {
                    let d = env.config.backoff.delay_random(failures).as_millis() as u64;
                    w.fail(task.id, message, Some(d))?;
                    self.sleep(&task.queue, now, d, true);
                }
                if let Some(p) = task.parent {
                    self.update_parent(w, p, true)?;
                }
            }
            RunResult::Repeat => {
                w.requeue(task.id, None)?;
                // Throttled: the next start comes at least REPEAT_INTERVAL
                // after this one (at once if the attempt took that long).
                let started = task.started_at.unwrap_or(now);
                let ready = started.saturating_add(REPEAT_INTERVAL.as_millis() as u64);
                let q = self.queue(&task.queue);
                q.activity_after = Some(QueueActivity::Repeat);
                if ready > now {
                    q.sleep_until = ready;
                }
            }
            RunResult::Keep => {
                let d = delay_ms.unwrap_or(env.config.keep_delay.as_millis() as u64);
                w.requeue(task.id, Some(now + d))?;
                self.sleep(&task.queue, now, d, false);
            }
        }
        Ok(())
    }

    fn sleep(&mut self, queue: &str, now: u64, ms: u64, after_fail: bool) {
        let q = self.queue(queue);
        q.sleep_until = now + ms;
        q.activity_after = Some(if after_fail {
            QueueActivity::SleepAfterFail {
                until_ms: now + ms,
                total_ms: ms,
            }
        } else {
            QueueActivity::Sleep { total_ms: ms }
        });
    }

    /// After a restart: children that recovery marked as interrupted count as
    /// failed attempts on their parents, as any other child failure does.
    pub fn note_recovered(&mut self, w: &mut WriteTxn<'_>, ids: &[u64]) -> Result<(), WriteError> {
        for id in ids {
            if !w.exists(*id) {
                continue;
            }
            if let Some(p) = w.task(*id)?.parent {
                self.update_parent(w, p, true)?;
            }
        }
        Ok(())
    }

    /// Brings a group parent up to date with its children; finishes it when
    /// every child has finished.
    fn update_parent(
        &mut self,
        w: &mut WriteTxn<'_>,
        parent: u64,
        child_failed: bool,
    ) -> Result<(), WriteError> {
        if !w.exists(parent) || !w.is_live(parent)? {
            return Ok(());
        }
        let p = w.task(parent)?.clone();
        let children = read_children(w, &p)?;
        let g = groups::progress(&p, &children, child_failed);
        w.update_group(parent, g.name, g.failures, g.message)?;
        let Some(status) = g.finished else {
            return Ok(());
        };
        w.to_history(parent, status)?;
        if status == Status::Failed {
            self.tally.dead_letters += 1;
        } else {
            self.tally.succeeded += 1;
        }
        log::info!("group {} {} finished", p.id, p.kind);
        let q = self.queue(&p.queue);
        if q.running.as_ref().is_some_and(|r| r.id == parent) {
            q.running = None;
        }
        Ok(())
    }

    /// Starts every ready head. Returns the jobs to hand to the pool once the
    /// transaction is durable.
    pub fn dispatch(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
    ) -> Result<Vec<Job>, WriteError> {
        let now = w.now();
        let mut jobs = Vec::new();
        // A group puts its children into the parallel queues, which were not
        // in the list this pass started with: look again, so they start in
        // this step rather than at the next wake-up (up to 100 ms later).
        loop {
            let mut grouped = false;
            for (name, _) in w.queues() {
                let q = self.queue(&name);
                if let Some(r) = &q.running {
                    // A group parent removed under us frees its queue.
                    if r.group && !(w.exists(r.id) && w.is_live(r.id)?) {
                        self.queue(&name).running = None;
                    } else {
                        continue;
                    }
                }
                let q = self.queue(&name);
                if q.sleep_until > now {
                    continue;
                }
                let Some(head) = w.head(&name) else { continue };
                let task = match w.task(head) {
                    Ok(t) => t.clone(),
                    Err(WriteError::Corrupt(c)) => {
                        log::error!("queue {name} is stuck behind a corrupt task: {c}");
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                if let Some(at) = task.retry_at.filter(|at| *at > now) {
                    // Waiting for a retry (for example after a restart).
                    let q = self.queue(&name);
                    q.sleep_until = at;
                    if task.failures > 0 && q.activity_after.is_none() {
                        q.activity_after = Some(QueueActivity::SleepAfterFail {
                            until_ms: at,
                            total_ms: at - now,
                        });
                    }
                    continue;
                }
                let q = self.queue(&name);
                let repeating = q.activity_after == Some(QueueActivity::Repeat);
                q.activity_after = None;
                if !task.children.is_empty() {
                    self.dispatch_group(w, env, &task, now)?;
                    grouped = true;
                    continue;
                }
                w.start(task.id)?;
                let task = w.task(task.id)?.clone();
                jobs.push(self.job(env, task, now, repeating));
            }
            if !grouped {
                break;
            }
        }
        Ok(jobs)
    }

    fn dispatch_group(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        parent: &Task,
        now: u64,
    ) -> Result<(), WriteError> {
        let n = env.config.parallel_queues.max(1);
        let mut lens: Vec<usize> = (0..n).map(|i| w.queue_len(&parallel_queue(i))).collect();
        let mut placed = 0;
        for child in &parent.children {
            if !w.exists(*child) || !w.is_live(*child)? || w.queue_of(*child).is_some() {
                continue;
            }
            let (i, _) = lens
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| **l)
                .unwrap_or((0, &0));
            w.place(*child, &parallel_queue(i), Placement::Last)?;
            lens[i] += 1;
            placed += 1;
        }
        if placed > 0 {
            log::info!(
                "group {} {}: {placed} children dispatched",
                parent.id,
                parent.name
            );
        }
        self.queue(&parent.queue).running = Some(Running {
            id: parent.id,
            since: now,
            picked: Arc::new(AtomicBool::new(true)),
            group: true,
            repeat: false,
        });
        // A group whose children all finished before a crash finishes now.
        let any_live = parent.children.iter().any(|c| match w.task(*c) {
            Err(WriteError::NoSuchTask(_)) => false,
            // A corrupt child is not known to be finished.
            Err(_) => true,
            Ok(_) => w.is_live(*c).unwrap_or(true),
        });
        if !any_live {
            self.update_parent(w, parent.id, false)?;
        }
        Ok(())
    }

    fn job(&mut self, env: &StepEnv<'_>, task: Task, now: u64, repeat: bool) -> Job {
        let picked = Arc::new(AtomicBool::new(false));
        self.queue(&task.queue).running = Some(Running {
            id: task.id,
            since: now,
            picked: picked.clone(),
            group: false,
            repeat,
        });
        self.in_flight += 1;
        let handlers = env.handlers.clone();
        let tx = env.tx.clone();
        let budget = *env.budget;
        let node = env.config.node.clone();
        log::info!(
            "task {} {} {} in {} started (attempt {})",
            task.id,
            task.kind,
            task.name,
            task.queue,
            task.attempts
        );
        Box::new(move || {
            picked.store(true, Ordering::SeqCst);
            let started = std::time::Instant::now();
            let outcome = match task.payload.to_json("payload", &budget) {
                Ok(payload) => {
                    let ctx = TaskContext {
                        attempt: task.attempts,
                        payload,
                        node,
                        task,
                    };
                    let o = run_attempt(&handlers, &ctx);
                    let (id, queue) = (ctx.task.id, ctx.task.queue);
                    let _ = tx.send(Msg::Done(Completion {
                        id,
                        queue,
                        outcome: o,
                        duration_ms: started.elapsed().as_millis() as u64,
                    }));
                    return;
                }
                Err(e) => Outcome::fail(e.to_string()),
            };
            let _ = tx.send(Msg::Done(Completion {
                id: task.id,
                queue: task.queue,
                outcome,
                duration_ms: started.elapsed().as_millis() as u64,
            }));
        })
    }
}

impl Default for Scheduler {
    fn default() -> Self {
        Self::new()
    }
}

/// A group parent's children as they stand in `w`, for [`groups::progress`]:
/// a child that no longer exists is left out, an unreadable one is logged.
fn read_children(w: &mut WriteTxn<'_>, parent: &Task) -> Result<Vec<Child>, WriteError> {
    let mut children = Vec::with_capacity(parent.children.len());
    for &child in &parent.children {
        match w.task(child) {
            Err(WriteError::NoSuchTask(_)) => continue,
            Err(WriteError::Corrupt(c)) => {
                // Never trusted as finished: the group waits, and says why.
                log::error!("group {}: child {child} is unreadable: {c}", parent.id);
                children.push(Child::Corrupt(child));
                continue;
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let live = w.is_live(child)?;
        children.push(Child::read(w.task(child)?, live));
    }
    Ok(children)
}
