//! The worker side of one attempt, run on a pool thread: marks the job
//! picked up, decodes the payload, runs the handler's pre, run and post
//! steps (`handler::run_attempt`), and sends the outcome back to the
//! scheduler as one `Msg::Done`, with what the attempt printed (its
//! `LiveAttempt`). An attempt cancelled before a worker took it does not
//! run: the cancel took it back (its pickup flag), or, when the flag was
//! already the worker's, the worker sees the cancel signal first.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::budget::Budget;
use crate::engine::cancel::NOT_STARTED;
use crate::engine::handler::{Handlers, Outcome, TaskContext, run_attempt};
use crate::engine::live::LiveAttempt;
use crate::engine::pool::Job;
use crate::engine::scheduler::{Completion, Msg, StepEnv};
use crate::task::Task;

/// The job that runs one attempt of `task` (already started in the store).
/// `picked` is set when a worker takes it, or when a cancel takes it back
/// first (then the job does nothing).
pub(super) fn job(
    env: &StepEnv<'_>,
    task: Task,
    picked: Arc<AtomicBool>,
    live: Arc<LiveAttempt>,
) -> Job {
    let handlers = env.handlers.clone();
    let tx = env.tx.clone();
    let commits = env.commits.clone();
    let clock = env.clock.clone();
    let budget = *env.budget;
    let node = env.config.node.clone();
    Box::new(move || {
        if picked.swap(true, Ordering::SeqCst) {
            // A cancel took the attempt back before any worker took it
            // (`cancel.rs` `take_back`): it has ended already, and no
            // completion comes from here.
            commits.arrived(1);
            return;
        }
        let started = Instant::now();
        let (id, queue) = (task.id, task.queue.clone());
        let (outcome, began_at) = if live.cancel_requested() {
            (Outcome::fail(NOT_STARTED), None)
        } else {
            let began = clock.now_ms();
            live.began(began);
            (
                run(&handlers, &budget, node, task, live.clone()),
                Some(began),
            )
        };
        // The step that records it will commit soon (announced when the job
        // was launched): a flush about to begin waits for it, and carries
        // it with the completions beside it.
        commits.still_coming();
        let sent = tx.send(Msg::Done(Completion {
            id,
            queue,
            outcome,
            began_at,
            duration_ms: started.elapsed().as_millis() as u64,
            output: Box::new(live.captured()),
        }));
        if sent.is_err() {
            commits.arrived(1);
        }
    })
}

/// One attempt's outcome. A payload that cannot be read fails the attempt
/// without running the handler.
fn run(
    handlers: &Handlers,
    budget: &Budget,
    node: Option<String>,
    task: Task,
    live: Arc<LiveAttempt>,
) -> Outcome {
    match task.payload.to_json("payload", budget) {
        Ok(payload) => {
            let ctx = TaskContext {
                attempt: task.attempts,
                payload,
                node,
                task,
                live,
            };
            run_attempt(handlers, &ctx)
        }
        Err(e) => Outcome::fail(e.to_string()),
    }
}
