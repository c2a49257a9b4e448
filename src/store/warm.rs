//! Decoded records of live tasks that the engine reads again soon: each task
//! a step started (its completion reads it back) and the task behind each
//! running one (the next step starts it). A step then finds them here
//! instead of looking them up in sled and decoding them, which was most of
//! a step's time; the look-ups of the next heads are made while the step
//! before is being flushed ([`crate::store::Store::warm_next`]).
//!
//! Invariant: an entry is the committed record of the live task `t/ID`,
//! decoded, or a note that it was looked at and not kept (too large, a
//! group parent, unreadable: the step reads it itself). It holds because
//! entries live under the store's write lock and come only from the
//! committed state: from a read of `t/ID` under that lock, or from the
//! task a commit has just written (`WriteTxn::publish`); and every commit
//! first drops the entry of every task it writes, the only way a `t/` key
//! changes while the store is open.

use std::collections::HashMap;

use crate::task::{Status, Task};

/// Entries kept at most; past that the map starts again empty.
const MAX_TASKS: usize = 1024;

/// Tasks with a larger payload and result are not kept: the map holds at
/// most about 4 MiB of them (a larger task's clone also costs about what
/// reading and decoding it does).
const MAX_BYTES: usize = 4 * 1024;

/// A stored record longer than this holds more than [`MAX_BYTES`] of
/// payload and result whatever else it holds: it is passed over unread.
pub(crate) const MAX_RECORD_BYTES: usize = 2 * MAX_BYTES;

#[derive(Debug, Default)]
pub(crate) struct Warm {
    /// A task's record, or None for one looked at and not kept (too large,
    /// a group parent, unreadable), so that the read ahead of every loop
    /// turn while the task before it runs does not read it again.
    tasks: HashMap<u64, Option<Task>>,
}

impl Warm {
    pub fn get(&self, id: u64) -> Option<&Task> {
        self.tasks.get(&id)?.as_ref()
    }

    /// Whether task `id` was looked at: kept, or passed over.
    pub fn contains(&self, id: u64) -> bool {
        self.tasks.contains_key(&id)
    }

    pub fn forget(&mut self, id: u64) {
        self.tasks.remove(&id);
    }

    /// Keeps `task`, the committed record of a live task, if it is small
    /// and has no children (a group parent's list is kept apart); else
    /// notes it as passed over.
    pub fn keep(&mut self, task: &Task) {
        let bytes = task.payload.bytes.len() + task.result.as_ref().map_or(0, |r| r.bytes.len());
        let worth = bytes <= MAX_BYTES && task.children.is_empty();
        self.put(task.id, worth.then(|| task.clone()));
    }

    /// Notes task `id` as looked at and not kept.
    pub fn pass(&mut self, id: u64) {
        self.put(id, None);
    }

    fn put(&mut self, id: u64, task: Option<Task>) {
        if self.tasks.len() >= MAX_TASKS {
            self.tasks.clear();
        }
        self.tasks.insert(id, task);
    }

    /// After a commit that wrote `task` (None: removed or moved to the
    /// history): a running task is kept (its completion reads it next),
    /// any other entry goes.
    pub fn written(&mut self, id: u64, live: Option<&Task>) {
        match live {
            Some(t) if t.status == Status::Running => self.keep(t),
            _ => self.forget(id),
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Blob;

    fn task(id: u64, status: Status, payload: usize) -> Task {
        let spec: crate::task::TaskSpec =
            serde_json::from_value(serde_json::json!({"queue": "main", "kind": "K", "name": "t"}))
                .expect("a spec");
        let mut t = spec.into_task(1, &Default::default()).expect("a task");
        t.id = id;
        t.status = status;
        t.payload = Blob {
            compressed: false,
            bytes: vec![b'1'; payload],
        };
        t
    }

    #[test]
    fn a_written_running_task_is_kept_and_any_other_write_drops_the_entry() {
        let mut w = Warm::default();
        w.written(1, Some(&task(1, Status::Running, 10)));
        assert_eq!(w.get(1).map(|t| t.status), Some(Status::Running));
        w.written(1, Some(&task(1, Status::Succeeded, 10)));
        assert!(w.get(1).is_none());
        w.keep(&task(2, Status::Queued, 10));
        w.written(2, None);
        assert!(!w.contains(2));
    }

    #[test]
    fn large_tasks_and_group_parents_are_passed_over_and_the_map_stays_bounded() {
        let mut w = Warm::default();
        w.keep(&task(1, Status::Queued, MAX_BYTES + 1));
        let mut parent = task(2, Status::Queued, 10);
        parent.children = vec![3, 4].into();
        w.keep(&parent);
        w.pass(5);
        for id in [1, 2, 5] {
            assert!(w.contains(id) && w.get(id).is_none(), "task {id}");
        }
        // Any write drops what was noted, kept or not.
        w.written(1, None);
        assert!(!w.contains(1));
        for id in 0..(MAX_TASKS as u64 * 3) {
            w.keep(&task(id, Status::Queued, 1));
            assert!(w.len() <= MAX_TASKS);
        }
        assert!(w.get(MAX_TASKS as u64 * 3 - 1).is_some());
    }
}
