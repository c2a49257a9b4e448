//! The in-memory index of TTL deadlines: for each live task that may expire
//! by itself (see `ttl::may_expire`: queued, never started, not a group
//! child), when its TTL runs out. The engine asks it what is due and when
//! the next deadline comes (so it neither scans every queued task in every
//! step nor sleeps past a deadline).
//!
//! It is built from the live tasks by the same pass over them that a
//! writable open makes to find interrupted tasks (`Store::recover`), so a
//! daemon's start reads them once; a read-only open builds it only when
//! asked (`Store::track_deadlines`). Once built, every commit keeps it up to date
//! from its events (`note`): a new task with a TTL comes in; a start, a
//! move to the history or a removal takes a task out. An entry may outlive
//! the task's chance to expire (a group parent whose group started): the
//! engine checks each due task again and drops what cannot expire (`forget`).

use std::collections::{BTreeSet, HashMap};

use crate::store::event::EventKind;
use crate::task::Task;
use crate::ttl;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Deadlines {
    /// (deadline, id), earliest first.
    by_time: BTreeSet<(u64, u64)>,
    /// id → deadline.
    of: HashMap<u64, u64>,
}

impl Deadlines {
    /// The index of these live tasks.
    pub fn of_tasks<'a>(tasks: impl IntoIterator<Item = &'a Task>) -> Deadlines {
        let mut d = Deadlines::default();
        for t in tasks {
            d.add(t);
        }
        d
    }

    /// Indexes `t` if it may expire by itself.
    pub fn add(&mut self, t: &Task) {
        if let Some(at) = ttl::deadline(t).filter(|_| ttl::may_expire(t)) {
            self.add_at(t.id, at);
        }
    }

    /// Indexes task `id` with its deadline `at` (from its summary, see
    /// `stored::Summary`).
    pub fn add_at(&mut self, id: u64, at: u64) {
        self.forget(id);
        self.by_time.insert((at, id));
        self.of.insert(id, at);
    }

    /// Takes in the entries of another index (of other tasks).
    pub fn merge(&mut self, other: Deadlines) {
        self.by_time.extend(other.by_time);
        self.of.extend(other.of);
    }

    /// Drops task `id`'s entry, if it has one.
    pub fn forget(&mut self, id: u64) {
        if let Some(at) = self.of.remove(&id) {
            self.by_time.remove(&(at, id));
        }
    }

    /// Follows one committed event.
    pub fn note(&mut self, kind: &EventKind) {
        match kind {
            EventKind::Enqueued { task, .. } => self.add(task),
            EventKind::Started { id }
            | EventKind::MovedToHistory { id, .. }
            | EventKind::Removed { id } => self.forget(*id),
            _ => {}
        }
    }

    /// The tasks whose deadline is at or before `now`, earliest first.
    pub fn due(&self, now: u64) -> Vec<u64> {
        self.by_time
            .range(..=(now, u64::MAX))
            .map(|(_, id)| *id)
            .collect()
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<u64> {
        self.by_time.first().map(|(at, _)| *at)
    }

    pub fn len(&self) -> usize {
        self.of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;
    use crate::task::TaskSpec;

    fn task(id: u64, ttl: Option<u64>, queued_at: u64) -> Task {
        let mut t = TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: format!("t{id}"),
            ttl: ttl.map(std::time::Duration::from_millis),
            ..Default::default()
        }
        .into_task(queued_at, &Budget::default())
        .unwrap();
        t.id = id;
        t
    }

    #[test]
    fn due_tasks_come_earliest_first_and_leave_when_they_start_or_finish() {
        let tasks = [
            task(1, Some(500), 1000),
            task(2, Some(100), 1000),
            task(3, None, 0),
        ];
        let mut d = Deadlines::of_tasks(&tasks);
        assert_eq!(d.len(), 2);
        assert_eq!(d.next(), Some(1100));
        assert_eq!(d.due(1099), Vec::<u64>::new());
        assert_eq!(d.due(1500), vec![2, 1]);
        d.note(&EventKind::Started { id: 2 });
        assert_eq!(d.due(1500), vec![1]);
        d.note(&EventKind::Enqueued {
            task: Box::new(task(4, Some(10), 1000)),
            placement: None,
        });
        assert_eq!(d.next(), Some(1010));
        d.note(&EventKind::Removed { id: 4 });
        d.forget(1);
        assert!(d.is_empty());
        assert_eq!(d.next(), None);
    }

    #[test]
    fn a_task_that_started_or_a_child_is_not_indexed() {
        let mut started = task(1, Some(10), 0);
        started.attempts = 1;
        let mut child = task(2, Some(10), 0);
        child.parent = Some(9);
        assert!(Deadlines::of_tasks(&[started, child]).is_empty());
    }
}
