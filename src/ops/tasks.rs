//! The operations on tasks and queues: enqueue (one or a batch), `queue
//! list`, `task show`, `task remove`, `task retry`. (A task's attempts and
//! `task cancel` are in `attempts.rs`.)

use serde_json::Value;

use super::{Ctx, OpError};
use crate::report::{self, QueueView};
use crate::store::{Placement, Store};
use crate::submit;
use crate::task::{Status, TaskSpec};

fn no_task(id: u64) -> OpError {
    OpError::runtime(format!("no task {id}"))
}

/// The store, for an operation that needs one to exist.
fn store<'a>(ctx: &Ctx<'a>) -> Result<&'a Store, OpError> {
    ctx.store
        .ok_or_else(|| OpError::runtime("the data dir does not exist"))
}

/// Adds one task; returns its id once it is durable. (A running engine
/// adds it itself, so that its loop wakes up.)
pub fn enqueue(ctx: &Ctx<'_>, spec: TaskSpec, placement: Placement) -> Result<u64, OpError> {
    ctx.check_kinds(std::slice::from_ref(&spec), false)?;
    Ok(match ctx.engine {
        Some(engine) => engine.enqueue(spec, placement)?,
        None => submit::enqueue_one(store(ctx)?, spec, placement)?,
    })
}

/// Adds a batch, all or nothing; returns the ids that went into queues.
pub fn enqueue_batch(ctx: &Ctx<'_>, specs: Vec<TaskSpec>) -> Result<Vec<u64>, OpError> {
    ctx.check_kinds(&specs, true)?;
    Ok(match ctx.engine {
        Some(engine) => engine.enqueue_batch(specs)?,
        None => submit::enqueue_batch(store(ctx)?, specs)?,
    })
}

/// Every queue, with live statuses when a daemon runs. A data dir lists the
/// parallel queues of the daemon that last ran on it.
/// How many tasks of each queue `queue list` lists unless asked for all:
/// enough for an operator to read, and a queue of a million tasks is then
/// listed as fast as a short one.
pub const QUEUE_LIST_LIMIT: usize = 1000;

pub fn queue_list(ctx: &Ctx<'_>, all: bool) -> Result<Vec<QueueView>, OpError> {
    let limit = if all { usize::MAX } else { QUEUE_LIST_LIMIT };
    Ok(match (ctx.engine, ctx.store) {
        (Some(engine), _) => engine.queue_views_limited(limit),
        (None, Some(store)) => report::snapshot(store, ctx.parallel_queues(store)?, limit, &|_| {
            String::new()
        }),
        (None, None) => report::empty_views(
            ctx.parallel_queues
                .unwrap_or(crate::queues::DEFAULT_PARALLEL_QUEUES),
        ),
    })
}

/// One task, live or finished, in its wire form: a large stored blob stays
/// compressed (the reader inflates it, not the daemon).
pub fn task_show(ctx: &Ctx<'_>, id: u64) -> Result<Value, OpError> {
    let store = ctx.store.ok_or_else(|| no_task(id))?;
    let task = store.task(id)?.ok_or_else(|| no_task(id))?;
    let mut wire = report::task_wire(&task, store.budget());
    if !task.children.is_empty()
        && let Some(m) = wire.as_object_mut()
    {
        let expires = crate::ttl::expires_at(&task, group_started(store, &task.children)?);
        m.insert("expires_at".into(), serde_json::json!(expires));
    }
    Ok(wire)
}

/// Whether a group has started (see `ttl::group_started`), from its
/// children's records and places.
fn group_started(store: &Store, children: &[u64]) -> Result<bool, OpError> {
    let mut known = Vec::with_capacity(children.len());
    for c in children {
        let live = store.live_task(*c)?;
        known.push(live.map(|t| {
            let placed = store.queue_of(t.id).is_some();
            (t, placed)
        }));
    }
    Ok(crate::ttl::group_started(
        known.iter().map(|k| k.as_ref().map(|(t, p)| (t, *p))),
    ))
}

/// Removes a task (a group parent with its children); returns the ids
/// removed. A group child is refused whatever its state: remove its group.
/// A running task (or a group with a running child) is refused: cancel it
/// first. A finished task is removed only with `history` (its record and
/// attempt logs are deleted).
pub fn task_remove(ctx: &Ctx<'_>, id: u64, history: bool) -> Result<Vec<u64>, OpError> {
    let store = ctx.store.ok_or_else(|| no_task(id))?;
    let mut w = store.write();
    let task = w.task(id)?.clone();
    // First: a running child told to be cancelled would be refused there
    // too (a child is cancelled with its group).
    w.check_removable_alone(id)?;
    if !w.is_live(id)? {
        if !history {
            return Err(OpError::runtime(format!(
                "task {id} is finished ({}); removing it deletes its record and its attempt logs: \
                 add --history to do that (berth task remove {id} --history)",
                task.status.as_str()
            )));
        }
    } else if task.status == Status::Running {
        return Err(OpError::runtime(format!(
            "task {id} is running; cancel it first (berth task cancel {id})"
        )));
    } else {
        for child in task.children.iter().copied() {
            if w.exists(child) && w.is_live(child)? && w.task(child)?.status == Status::Running {
                return Err(OpError::runtime(format!(
                    "task {id} is a group whose task {child} is running; cancel the group \
                     first (berth task cancel {id})"
                )));
            }
        }
    }
    let removed = w.remove(id)?;
    w.commit()?;
    ctx.changed();
    Ok(removed)
}

/// Puts a dead letter back at the tail of its queue.
pub fn task_retry(ctx: &Ctx<'_>, id: u64) -> Result<(), OpError> {
    let store = ctx.store.ok_or_else(|| no_task(id))?;
    let mut w = store.write();
    w.retry(id, Placement::Last)?;
    w.commit()?;
    ctx.changed();
    Ok(())
}
