//! Compaction (addon-operator's compacted queues): an enqueue with a
//! `compaction_key` merges into a task that already waits for the same
//! thing, instead of queueing it twice.
//!
//! The rule:
//!
//! - A task with a compaction key, enqueued while a task of the same kind
//!   with the same key waits in the same queue (placed in it, `queued`, not
//!   running, not part of a group), is merged into the earliest such task:
//!   that task takes the newer payload (the latest enqueue says what is
//!   wanted now) and keeps everything else: its id, its place in the queue,
//!   its name, target and tags, its attempts, failures and retry time. The
//!   placement asked for (`--first`, `--after`) is not used. The enqueue
//!   reports the waiting task's id.
//! - A group from a batch (a run of equal weight, see `groups`) whose
//!   children all have keys merges into a group in the same queue whose
//!   parent waits and whose children have not been dispatched yet (all
//!   still waiting outside every queue), when its children have the same
//!   kinds and keys in the same order: each child takes its newer payload,
//!   and the enqueue reports the parent's id.
//! - A task that runs, has finished (also one that expired), whose group
//!   has been dispatched, or whose TTL has run out (it is due to expire,
//!   see `ttl`) is never merged into: the new one is queued (it will run
//!   after, with the new payload). A merge keeps the waiting task's TTL
//!   and `queued_at`, so it expires when it would have.
//!
//! Each merge is one `merged` event (`EventKind::Merged`) in the same
//! transaction as the rest of the enqueue, so a batch stays all or
//! nothing, `verify` replays it, and the counters count it (`merged`).
//!
//! So `berth run --enqueue FILE` at every start (a service manager's
//! restart) adds each keyed task of FILE at most once while it waits: the
//! entries whose earlier copy still waits are merged into it, and only
//! those whose copy already ran (or runs now) are queued again.

use std::collections::HashMap;

use crate::store::{WriteError, WriteTxn};
use crate::task::{Status, Task};

/// What a task is compacted by: its kind and its key.
type Key = (String, String);

fn key_of(t: &Task) -> Option<Key> {
    t.compaction_key.clone().map(|k| (t.kind.clone(), k))
}

/// The waiting tasks of one queue that an enqueue may merge into.
#[derive(Debug, Default)]
struct Index {
    singles: HashMap<Key, u64>,
    /// The children's keys, in order → the parent and its children.
    groups: HashMap<Vec<Key>, (u64, Vec<u64>)>,
}

/// Finds what an enqueue merges into, within one transaction. Each queue
/// is read once (the first time an enqueue into it has a key), then kept up
/// to date with what the transaction adds; the transaction holds the
/// store's write lock, so nothing else changes it meanwhile.
#[derive(Debug, Default)]
pub struct Compactor {
    queues: HashMap<String, Index>,
}

impl Compactor {
    pub fn new() -> Self {
        Compactor::default()
    }

    fn index(&mut self, w: &mut WriteTxn<'_>, queue: &str) -> Result<&mut Index, WriteError> {
        if !self.queues.contains_key(queue) {
            let index = read_queue(w, queue)?;
            self.queues.insert(queue.to_string(), index);
        }
        Ok(self.queues.entry(queue.to_string()).or_default())
    }

    /// The waiting task that `task` (not yet enqueued) merges into, if any.
    pub fn single(&mut self, w: &mut WriteTxn<'_>, task: &Task) -> Result<Option<u64>, WriteError> {
        let Some(key) = key_of(task) else {
            return Ok(None);
        };
        Ok(self.index(w, &task.queue)?.singles.get(&key).copied())
    }

    /// `task` was enqueued in its queue as `id`: later enqueues may merge into it.
    pub fn added_single(&mut self, id: u64, task: &Task) {
        if let (Some(key), Some(index)) = (key_of(task), self.queues.get_mut(&task.queue)) {
            index.singles.entry(key).or_insert(id);
        }
    }

    /// The waiting group that a group of `children` (not yet enqueued) in
    /// `queue` merges into: its parent and its children, in order.
    pub fn group(
        &mut self,
        w: &mut WriteTxn<'_>,
        queue: &str,
        children: &[Task],
    ) -> Result<Option<(u64, Vec<u64>)>, WriteError> {
        let Some(keys) = children.iter().map(key_of).collect::<Option<Vec<Key>>>() else {
            return Ok(None);
        };
        Ok(self.index(w, queue)?.groups.get(&keys).cloned())
    }

    /// A group was enqueued: later batches may merge into it.
    pub fn added_group(&mut self, queue: &str, parent: u64, children: &[(u64, &Task)]) {
        let keys = children.iter().map(|(_, t)| key_of(t)).collect();
        if let (Some(keys), Some(index)) = (keys, self.queues.get_mut(queue)) {
            let ids = children.iter().map(|(id, _)| *id).collect();
            index.groups.entry(keys).or_insert((parent, ids));
        }
    }
}

/// The tasks of `queue` that may be merged into, read from the head.
fn read_queue(w: &mut WriteTxn<'_>, queue: &str) -> Result<Index, WriteError> {
    let mut index = Index::default();
    let mut next = w.head(queue);
    while let Some(id) = next {
        next = w.next_in_queue(id);
        let Some(t) = waiting(w, id)? else {
            continue;
        };
        if t.parent.is_some() {
            continue;
        }
        if t.children.is_empty() {
            if let Some(key) = key_of(&t) {
                index.singles.entry(key).or_insert(id);
            }
            continue;
        }
        if let Some(keys) = undispatched_keys(w, &t)? {
            index
                .groups
                .entry(keys)
                .or_insert((id, t.children.to_vec()));
        }
    }
    Ok(index)
}

/// The task, if it waits (`queued`) and its TTL has not run out (a task
/// due to expire is as good as expired: see `ttl`). A corrupt record is
/// never merged into.
fn waiting(w: &mut WriteTxn<'_>, id: u64) -> Result<Option<Task>, WriteError> {
    let now = w.now();
    let due =
        |t: &Task| crate::ttl::may_expire(t) && crate::ttl::deadline(t).is_some_and(|d| d <= now);
    match w.peek(id) {
        Ok(Some(t)) if t.status == Status::Queued && !due(&t) => Ok(Some(t)),
        Ok(_) | Err(WriteError::Corrupt(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The keys of a group parent's children, if none has been dispatched (each
/// waits outside every queue) and each has a key.
fn undispatched_keys(w: &mut WriteTxn<'_>, parent: &Task) -> Result<Option<Vec<Key>>, WriteError> {
    let mut keys = Vec::with_capacity(parent.children.len());
    for &c in parent.children.iter() {
        if w.queue_of(c).is_some() {
            return Ok(None);
        }
        match waiting(w, c)?.as_ref().and_then(key_of) {
            Some(k) => keys.push(k),
            None => return Ok(None),
        }
    }
    Ok(Some(keys))
}
