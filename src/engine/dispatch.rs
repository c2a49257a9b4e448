//! The queue state machine: which heads start in a step (and where a group's
//! children go), when a sleeping queue may start again, and what each queue
//! is doing for `queue list`. `complete.rs` moves a queue on through the
//! transitions at the end of this file when an attempt comes back.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::attempt;
use crate::engine::pool::Job;
use crate::engine::scheduler::{LOG_TARGET, LiveActivity, Named, Running, Scheduler, StepEnv};
use crate::engine::status::QueueActivity;
use crate::queues::parallel_queue;
use crate::store::{Placement, WriteError, WriteTxn};
use crate::task::Task;

/// A group's children placed per step: the first start (and a step's
/// commit stays small) while the rest of a large group is placed. Placing
/// 10,000 children in one step took 70 to 120 ms before any of them could
/// start, most of the gap between a group and the same tasks as singles.
pub const PLACE_PER_STEP: usize = 1_000;

impl Scheduler {
    /// Starts every ready head. Returns the jobs to hand to the pool once the
    /// transaction is durable.
    pub fn dispatch(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
    ) -> Result<Vec<Job>, WriteError> {
        let now = w.now();
        let mut jobs = Vec::new();
        // An attempt starts only when a worker is free to run it, so that a
        // task is `running` only while a worker runs it.
        let mut free = env.config.worker_count().saturating_sub(self.in_flight);
        // Since when each queue that waited for a worker has waited; a queue
        // shows it only while it still does (its head may have gone).
        let waited: BTreeMap<String, u64> = self
            .queues
            .iter_mut()
            .filter_map(|(name, q)| match q.activity_after {
                Some(QueueActivity::WaitingForWorker { since_ms }) => {
                    q.activity_after = None;
                    Some((name.clone(), since_ms))
                }
                _ => None,
            })
            .collect();
        // The next chunk of each group being placed (once per step).
        for parent in self.placing.keys().copied().collect::<Vec<_>>() {
            self.place_children(w, env, parent)?;
        }
        // A group puts its children into the parallel queues, which were not
        // in the list this pass started with: look again, so they start in
        // this step rather than at the next wake-up (up to 100 ms later).
        loop {
            let mut grouped = false;
            for name in self.in_turn(w.queues()) {
                let Some(task) = self.ready_head(w, env, &name, now)? else {
                    continue;
                };
                let q = self.queue(&name);
                if !task.children.is_empty() {
                    // A group parent runs no handler: it needs no worker.
                    q.activity_after = None;
                    self.dispatch_group(w, env, &task, now)?;
                    grouped = true;
                    continue;
                }
                if free == 0 {
                    if q.activity_after != Some(QueueActivity::Repeat) {
                        let since_ms = waited.get(&name).copied().unwrap_or(now);
                        q.activity_after = Some(QueueActivity::WaitingForWorker { since_ms });
                    }
                    continue;
                }
                let repeating = q.activity_after == Some(QueueActivity::Repeat);
                q.activity_after = None;
                w.start(task.id)?;
                let task = w.task(task.id)?.clone();
                jobs.push(self.hand_out(env, task, now, repeating));
                free -= 1;
                self.last_started = Some(name);
            }
            if !grouped {
                break;
            }
        }
        Ok(jobs)
    }

    /// The head of queue `name` if it may start now: the queue runs nothing,
    /// does not sleep, and its head (its first task for this node) is
    /// readable and not waiting for a retry (the queue then sleeps until the
    /// retry).
    fn ready_head(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        name: &str,
        now: u64,
    ) -> Result<Option<Task>, WriteError> {
        let q = self.queue(name);
        if let Some(r) = &q.running {
            // A group parent removed under us frees its queue.
            if r.group && !(w.exists(r.id) && w.is_live(r.id)?) {
                self.queue(name).running = None;
            } else {
                return Ok(None);
            }
        }
        let (sleeping, owner) = {
            let q = self.queue(name);
            (q.sleep_until > now, q.sleep_for)
        };
        // Still its owner's sleep when the owner is still the first task
        // (no record read; one put ahead is read below).
        if sleeping && (owner.is_none() || owner == w.head(name)) {
            return Ok(None);
        }
        let Some(task) = self.head_for_this_node(w, name)? else {
            return Ok(None);
        };
        if sleeping {
            if owner == Some(task.id) {
                return Ok(None);
            }
            // A task put ahead of the head whose sleep it was (`enqueue
            // --first`, `--before`) does not wait for that head's backoff;
            // the head keeps its own `retry_at` for when it is head again.
            let q = self.queue(name);
            q.sleep_until = 0;
            q.sleep_for = None;
            q.activity_after = None;
        }
        if let Some(at) = task.retry_at.filter(|at| *at > now) {
            // Waiting for a retry (for example after a restart).
            let q = self.queue(name);
            q.sleep_until = at;
            q.sleep_for = Some(task.id);
            if task.failures > 0 && q.activity_after.is_none() {
                // The delay its failure set (the record keeps only its
                // end): the backoff's for that many failures without its
                // jitter (under a second), or what is left if that is more.
                let left = at - now;
                let delay = env.config.backoff.delay(task.failures, 0).as_millis() as u64;
                q.activity_after = Some(QueueActivity::SleepAfterFail {
                    until_ms: at,
                    total_ms: delay.max(left),
                });
            }
            return Ok(None);
        }
        Ok(Some(task))
    }

    /// The first task in queue `name` that is for this node (see `routing`).
    /// Tasks for other nodes keep their places and are passed over, so they
    /// never hold the queue; each is logged once. None when there is no
    /// such task, or when the walk meets a record it cannot read: the queue
    /// then waits behind it, as it always waited behind a corrupt head.
    fn head_for_this_node(
        &mut self,
        w: &mut WriteTxn<'_>,
        name: &str,
    ) -> Result<Option<Task>, WriteError> {
        let mut next = w.head(name);
        while let Some(id) = next {
            next = w.next_in_queue(id);
            if self.elsewhere.contains(&id) {
                continue;
            }
            let task = match w.task(id) {
                Ok(t) => t,
                Err(WriteError::Corrupt(c)) => {
                    log::error!(target: LOG_TARGET, "queue {name} is stuck behind a corrupt task: {c}");
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            match self.node.accepts(task) {
                Ok(()) => return Ok(Some(task.clone())),
                Err(why) => {
                    log::info!(
                        target: LOG_TARGET,
                        "task {id} {} {} in {name} is not for this node ({why}); it keeps its place and waits",
                        task.kind,
                        task.name
                    );
                    self.elsewhere.insert(id);
                }
            }
        }
        Ok(None)
    }

    /// A group parent at its queue's head: its waiting children go to the
    /// shortest parallel queues, [`PLACE_PER_STEP`] in this step and as many
    /// in each step after (`placing`), and the parent holds its queue until
    /// the last child has finished.
    fn dispatch_group(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        parent: &Task,
        now: u64,
    ) -> Result<(), WriteError> {
        self.queue(&parent.queue).running = Some(Running {
            id: parent.id,
            since: now,
            picked: Arc::new(AtomicBool::new(true)),
            group: true,
            repeat: false,
            cancel: false,
        });
        self.placing.insert(parent.id, 0);
        self.place_children(w, env, parent.id)
    }

    /// Places the next [`PLACE_PER_STEP`] waiting children of group
    /// `parent` (those still live and in no queue: after a restart some are
    /// placed or finished already), each into the shortest parallel queue.
    /// After the last one: the group's progress view (`track_group`), and a
    /// group whose children all finished (before a crash) finishes now.
    fn place_children(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        parent: u64,
    ) -> Result<(), WriteError> {
        let Some(&from) = self.placing.get(&parent) else {
            return Ok(());
        };
        if !(w.exists(parent) && w.is_live(parent)?) {
            // Removed or cancelled meanwhile.
            self.placing.remove(&parent);
            return Ok(());
        }
        let (children, name, own) = {
            let p = w.task(parent)?;
            (p.children.clone(), p.name.clone(), p.queue.clone())
        };
        // Every parallel queue but the group's own: a child placed behind
        // its waiting parent would never start.
        let mut lens: Vec<(String, usize)> = (0..env.config.parallel_queues.max(1))
            .map(parallel_queue)
            .filter(|q| *q != own)
            .map(|q| {
                let len = w.queue_len(&q);
                (q, len)
            })
            .collect();
        if lens.is_empty() {
            self.placing.remove(&parent);
            log::error!(
                target: LOG_TARGET,
                "group {parent} {name} waits in {own}, the only parallel queue \
                 (parallel_queues = 1): its children have no other parallel queue to run \
                 in, so it cannot start (set parallel_queues to 2 or more)"
            );
            return Ok(());
        }
        let (mut next, mut placed) = (from, 0);
        while next < children.len() && placed < PLACE_PER_STEP {
            let child = children[next];
            next += 1;
            if !w.exists(child) || !w.is_live(child)? || w.queue_of(child).is_some() {
                continue;
            }
            // The shortest (the first of equals); `lens` is not empty.
            let Some(shortest) = lens.iter_mut().min_by_key(|(_, l)| *l) else {
                break;
            };
            w.place(child, &shortest.0, Placement::Last)?;
            shortest.1 += 1;
            placed += 1;
        }
        if placed > 0 {
            log::info!(
                target: LOG_TARGET,
                "group {parent} {name}: {placed} children dispatched ({next} of {} looked at)",
                children.len()
            );
        }
        if next < children.len() {
            self.placing.insert(parent, next);
            return Ok(());
        }
        self.placing.remove(&parent);
        // Its progress view, from this transaction's view of the children.
        w.track_group(parent)?;
        // A group whose children all finished before a crash finishes now.
        let any_live = children.iter().any(|c| match w.task(*c) {
            Err(WriteError::NoSuchTask(_)) => false,
            // A corrupt child is not known to be finished.
            Err(_) => true,
            Ok(_) => w.is_live(*c).unwrap_or(true),
        });
        if !any_live {
            self.update_parent(w, parent, 0)?;
        }
        Ok(())
    }

    /// The queues of `queues` (non-empty, in name order) in the order they
    /// take free workers: from the one after the queue that last started an
    /// attempt, round to it, so that with fewer workers than ready queues
    /// every ready queue gets a worker in turn.
    fn in_turn(&self, queues: Vec<(String, usize)>) -> Vec<String> {
        let mut names: Vec<String> = queues.into_iter().map(|(n, _)| n).collect();
        if let Some(last) = &self.last_started {
            let after = names.partition_point(|n| n <= last);
            names.rotate_left(after);
        }
        names
    }

    /// Marks `task`, just started in `w`, as its queue's running head, and
    /// makes the job that runs it on a worker.
    fn hand_out(&mut self, env: &StepEnv<'_>, task: Task, now: u64, repeat: bool) -> Job {
        let picked = Arc::new(AtomicBool::new(false));
        self.queue(&task.queue).running = Some(Running {
            id: task.id,
            since: now,
            picked: picked.clone(),
            group: false,
            repeat,
            cancel: false,
        });
        self.in_flight += 1;
        log::info!(
            target: LOG_TARGET,
            "{} started (attempt {})",
            Named(&task),
            task.attempts
        );
        let live = self.live.start(task.id, task.attempts, now);
        attempt::job(env, task, picked, live)
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
                    Some(r) if r.cancel => QueueActivity::Cancelling,
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

    /// A job came back from the pool: its queue runs nothing and forgets
    /// what it did after its last run.
    pub(super) fn returned(&mut self, queue: &str) {
        self.in_flight = self.in_flight.saturating_sub(1);
        let q = self.queue(queue);
        q.running = None;
        q.activity_after = None;
    }

    /// The queue starts nothing for `ms`: after a failed attempt (its
    /// backoff), or a handler's delay. `head`: the task that stays at the
    /// head and whose sleep it is (see `QueueState::sleep_for`).
    pub(super) fn sleep(
        &mut self,
        queue: &str,
        head: Option<u64>,
        now: u64,
        ms: u64,
        after_fail: bool,
    ) {
        let q = self.queue(queue);
        q.sleep_until = now + ms;
        q.sleep_for = head;
        q.activity_after = Some(if after_fail {
            QueueActivity::SleepAfterFail {
                until_ms: now + ms,
                total_ms: ms,
            }
        } else {
            QueueActivity::Sleep { total_ms: ms }
        });
    }

    /// The head asked to repeat: the queue shows it, and starts it again no
    /// earlier than `ready`.
    pub(super) fn repeat(&mut self, queue: &str, head: u64, now: u64, ready: u64) {
        let q = self.queue(queue);
        q.activity_after = Some(QueueActivity::Repeat);
        if ready > now {
            q.sleep_until = ready;
            q.sleep_for = Some(head);
        }
    }

    /// A task that was `queue`'s head ended without running (cancelled):
    /// the queue forgets its sleep (the head's backoff or delay), so the
    /// next task may start at once.
    pub(super) fn head_gone(&mut self, queue: &str) {
        let q = self.queue(queue);
        if q.running.is_none() {
            q.sleep_until = 0;
            q.sleep_for = None;
            q.activity_after = None;
        }
    }

    /// Group `parent` has finished: its queue is free again.
    pub(super) fn group_finished(&mut self, queue: &str, parent: u64) {
        let q = self.queue(queue);
        if q.running.as_ref().is_some_and(|r| r.id == parent) {
            q.running = None;
        }
    }
}
