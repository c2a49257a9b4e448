//! The worker side of one attempt, run on a pool thread: marks the job
//! picked up, decodes the payload, runs the handler's pre, run and post
//! steps (`handler::run_attempt`), and sends the outcome back to the
//! scheduler as one `Msg::Done`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::budget::Budget;
use crate::engine::handler::{Handlers, Outcome, TaskContext, run_attempt};
use crate::engine::pool::Job;
use crate::engine::scheduler::{Completion, Msg, StepEnv};
use crate::task::Task;

/// The job that runs one attempt of `task` (already started in the store).
/// `picked` is set when a worker takes it.
pub(super) fn job(env: &StepEnv<'_>, task: Task, picked: Arc<AtomicBool>) -> Job {
    let handlers = env.handlers.clone();
    let tx = env.tx.clone();
    let budget = *env.budget;
    let node = env.config.node.clone();
    Box::new(move || {
        picked.store(true, Ordering::SeqCst);
        let started = Instant::now();
        let (id, queue) = (task.id, task.queue.clone());
        let outcome = run(&handlers, &budget, node, task);
        let _ = tx.send(Msg::Done(Completion {
            id,
            queue,
            outcome,
            duration_ms: started.elapsed().as_millis() as u64,
        }));
    })
}

/// One attempt's outcome. A payload that cannot be read fails the attempt
/// without running the handler.
fn run(handlers: &Handlers, budget: &Budget, node: Option<String>, task: Task) -> Outcome {
    match task.payload.to_json("payload", budget) {
        Ok(payload) => {
            let ctx = TaskContext {
                attempt: task.attempts,
                payload,
                node,
                task,
            };
            run_attempt(handlers, &ctx)
        }
        Err(e) => Outcome::fail(e.to_string()),
    }
}
