//! The operations on a task's attempts: `task log` (the recorded attempts),
//! `task output` (the running attempt's output after an offset, which
//! `task log --follow` polls), and `task cancel`.

use serde_json::{Value, json};

use super::{Ctx, OpError};
use crate::attempt_view;
use crate::engine::CancelError;

fn no_task(id: u64) -> OpError {
    OpError::runtime(format!("no task {id}"))
}

/// A task's recorded attempts (all it keeps, or attempt `attempt`), in
/// their wire form: `{"id", "status", "attempts": [...]}`.
pub fn task_log(ctx: &Ctx<'_>, id: u64, attempt: Option<u32>) -> Result<Value, OpError> {
    let store = ctx.store.ok_or_else(|| no_task(id))?;
    let task = store.task(id)?.ok_or_else(|| no_task(id))?;
    let mut logs = store.attempts(id)?;
    if let Some(n) = attempt {
        let recorded: Vec<u32> = logs.iter().map(|l| l.attempt).collect();
        logs.retain(|l| l.attempt == n);
        if logs.is_empty() {
            let kept = match (recorded.first(), recorded.last()) {
                (Some(a), Some(b)) if a == b => format!("only attempt {a} is recorded"),
                (Some(a), Some(b)) => format!("attempts {a} to {b} are recorded"),
                _ => "no attempt is recorded".to_string(),
            };
            return Err(OpError::runtime(format!(
                "task {id} has no record of attempt {n} ({kept})"
            )));
        }
    }
    let budget = store.budget();
    Ok(json!({
        "id": id,
        "status": task.status.as_str(),
        "attempts": logs.iter().map(|l| attempt_view::wire(l, budget)).collect::<Vec<_>>(),
    }))
}

/// What `task log --follow` polls: the task's status, the last attempt
/// recorded, and (through a daemon) the output of the attempt running now
/// from the given offsets on. `attempt` is the running attempt the offsets
/// are about; for another one, its output is sent from the start.
pub fn task_output(
    ctx: &Ctx<'_>,
    id: u64,
    attempt: Option<u32>,
    stdout_from: u64,
    stderr_from: u64,
) -> Result<Value, OpError> {
    let store = ctx.store.ok_or_else(|| no_task(id))?;
    let task = store.task(id)?.ok_or_else(|| no_task(id))?;
    let finished = store.live_task(id)?.is_none();
    let last_logged = store.attempt_numbers(id)?.last().copied();
    // An attempt no worker has taken yet has printed nothing, and its start
    // is not yet its handler's.
    let live = ctx
        .engine
        .and_then(|e| e.live_attempt(id))
        .filter(|a| a.has_begun())
        .map(|a| {
            if attempt == Some(a.attempt) {
                a.output_json(stdout_from, stderr_from)
            } else {
                a.output_json(0, 0)
            }
        });
    Ok(json!({
        "daemon": ctx.engine.is_some(),
        "status": task.status.as_str(),
        "finished": finished,
        "last_logged": last_logged,
        "live": live,
    }))
}

/// Cancels a task (see `WriteTxn::cancel`): through a daemon, running
/// handlers are stopped first; without one, nothing runs, and a task the
/// store says is running is a leftover of a crash (opening the data dir
/// already recovered it), cancelled at once. Returns the ids cancelled,
/// children first.
pub fn task_cancel(ctx: &Ctx<'_>, id: u64) -> Result<Vec<u64>, OpError> {
    match ctx.engine {
        Some(engine) => engine.cancel(id).map_err(|e| match e {
            CancelError::Store(w) => w.into(),
            other => OpError::runtime(other.to_string()),
        }),
        None => {
            let store = ctx.store.ok_or_else(|| no_task(id))?;
            let mut w = store.write();
            let c = w.cancel(id, &|_| false)?;
            w.commit()?;
            Ok(c.ids)
        }
    }
}
