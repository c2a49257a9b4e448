//! `berth task cancel` in the scheduler: a request is handled in a step's
//! transaction (`WriteTxn::cancel` decides what ends at once); a running
//! task's handler is asked to stop (its `LiveAttempt`'s cancel signal: a
//! command handler's process group gets SIGTERM, then SIGKILL after its
//! grace), and it ends `cancelled` when its attempt returns
//! (`complete.rs`); an attempt no worker has taken yet (handed to the pool
//! in the step before, a worker free for it but not there yet) is taken
//! back instead (`take_back`) and ends `cancelled` in the same step,
//! without waiting for a worker; a group parent ends once no child is live
//! (`update_parent`). Each request is answered once its task has left the
//! live tasks and the step that did it is durable.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use crate::engine::handler::Outcome;
use crate::engine::scheduler::{
    CancelReply, CancelRequest, Completion, LOG_TARGET, Scheduler, StepEnv,
};
use crate::store::{WriteError, WriteTxn};

/// The outcome of an attempt cancelled before its handler ran.
pub(super) const NOT_STARTED: &str = "cancelled before it started";

/// An answer to send once the step's commit is durable.
pub(super) type Answer = (CancelReply, Result<Vec<u64>, WriteError>);

impl Scheduler {
    /// Handles one cancel request in the step's transaction. An error (no
    /// such task, a finished task, a group child alone) is answered at once
    /// (returned); otherwise the request waits until its task has ended.
    /// Returns Err only for store failures.
    pub(super) fn request_cancel(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        req: CancelRequest,
    ) -> Result<Option<Answer>, WriteError> {
        let id = req.id;
        let running: BTreeSet<u64> = self
            .queues
            .values()
            .filter_map(|q| q.running.as_ref().filter(|r| !r.group).map(|r| r.id))
            .collect();
        // The queues whose head may end now: their sleep (a backoff, a
        // delay) was the head's and must not hold the next task.
        let mut heads = Vec::new();
        let family = match w.task(id) {
            Ok(t) => std::iter::once(id)
                .chain(t.children.iter().copied())
                .collect(),
            Err(_) => Vec::new(),
        };
        for x in family {
            if let Some(q) = w.queue_of(x)
                && w.head(&q) == Some(x)
                && !running.contains(&x)
            {
                heads.push(q);
            }
        }
        let (queue, group) = match w.task(id) {
            Ok(t) => (t.queue.clone(), !t.children.is_empty()),
            Err(_) => (String::new(), false),
        };
        let c = match w.cancel(id, &|x| running.contains(&x)) {
            Ok(c) => c,
            Err(e) => return Ok(Some((req.reply, Err(e)))),
        };
        for q in heads {
            self.head_gone(&q);
        }
        if c.running.is_empty() {
            // Ended at once; a group that held its queue lets it go.
            self.group_finished(&queue, id);
            log::info!(target: LOG_TARGET, "task {id} cancelled (it was not running)");
        } else {
            for r in &c.running {
                self.cancels.stopping.insert(*r);
                if let Some(a) = self.live.get(*r) {
                    a.cancel();
                }
                self.mark_cancelling(*r);
            }
            if group {
                self.cancels.groups.insert(id);
                self.mark_cancelling(id);
            }
            log::info!(
                target: LOG_TARGET,
                "task {id}: cancelling; asked {} running handler(s) to stop",
                c.running.len()
            );
            for r in &c.running {
                self.take_back(w, env, *r)?;
            }
        }
        self.cancels.waiting.push((id, c.ids, req.reply));
        Ok(None)
    }

    /// A running task whose job no worker has taken yet (a step starts an
    /// attempt only for a free worker, but that worker may not have come
    /// for it yet): the job is taken back (its pickup flag claimed first, so no
    /// worker runs it: `attempt.rs`) and the attempt ends here, `cancelled`
    /// in this step, as it would have when a worker took it, instead of
    /// waiting for a worker to be free.
    fn take_back(
        &mut self,
        w: &mut WriteTxn<'_>,
        env: &StepEnv<'_>,
        id: u64,
    ) -> Result<(), WriteError> {
        let Some((queue, running)) = self.queues.iter().find_map(|(q, s)| {
            s.running
                .as_ref()
                .filter(|r| r.id == id && !r.group)
                .map(|r| (q, r))
        }) else {
            return Ok(());
        };
        if running.picked.swap(true, Ordering::SeqCst) {
            return Ok(()); // a worker has it: it stops when it sees the signal
        }
        let queue = queue.clone();
        log::info!(
            target: LOG_TARGET,
            "task {id}: no worker had taken it yet; it does not run"
        );
        self.complete(
            w,
            env,
            Completion {
                id,
                queue,
                outcome: Outcome::fail(NOT_STARTED),
                began_at: None,
                duration_ms: 0,
                output: Box::default(),
            },
        )
    }

    /// The queue whose running entry is `id` shows that it is being
    /// cancelled.
    fn mark_cancelling(&mut self, id: u64) {
        for q in self.queues.values_mut() {
            if let Some(r) = q.running.as_mut().filter(|r| r.id == id) {
                r.cancel = true;
            }
        }
    }

    /// The requests whose task has ended (as `w` sees it), with their
    /// answers, to send once `w` is durable.
    pub(super) fn answered_cancels(&mut self, w: &mut WriteTxn<'_>) -> Vec<Answer> {
        let mut out = Vec::new();
        let waiting = std::mem::take(&mut self.cancels.waiting);
        for (id, ids, reply) in waiting {
            let live = w.exists(id) && w.is_live(id).unwrap_or(true);
            if live {
                self.cancels.waiting.push((id, ids, reply));
            } else {
                out.push((reply, Ok(ids)));
            }
        }
        out
    }
}
