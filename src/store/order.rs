//! The order of every queue, held in memory; each position is stored in its
//! task's live record (see `stored`), and the index is rebuilt from them at
//! open.
//!
//! A queue is a map from position (i64) to task id. Adding last or first
//! takes a position a gap beyond the ends; adding after or before a task takes
//! the midpoint with its neighbour; when no integer is left between two
//! neighbours the queue is renumbered. Every change records how to undo it,
//! so a failed commit leaves the index as it was; a renumber names the other
//! tasks it moved, whose records the commit must write again.

use std::collections::BTreeMap;
use std::sync::Arc;

use bincode::{Decode, Encode};

/// Where to add a task in its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
pub enum Placement {
    Last,
    First,
    After(u64),
    Before(u64),
}

const GAP: i64 = 1 << 32;

/// How to take one change back.
#[derive(Debug)]
pub enum Undo {
    Placed(u64),
    Unplaced {
        id: u64,
        queue: String,
        pos: i64,
    },
    Renumbered {
        queue: String,
        old: BTreeMap<i64, u64>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OrderError {
    #[error("task {0} is not in any queue")]
    NotQueued(u64),
    #[error("task {anchor} is in queue '{actual}', not in '{queue}'")]
    OtherQueue {
        anchor: u64,
        queue: String,
        actual: String,
    },
    #[error("task {0} is already in a queue")]
    AlreadyQueued(u64),
}

/// A queue's name, shared by every entry of that queue (a million tasks
/// in one queue hold one copy of its name, not a million).
pub type Name = Arc<str>;

#[derive(Debug, Default)]
pub struct Order {
    queues: BTreeMap<Name, BTreeMap<i64, u64>>,
    /// Each queued task's queue and position. A B-tree, not a hash map: a
    /// hash map doubles its table when it fills and moves every entry at
    /// once (the insert of the 917,505th task took 71-80 ms here, inside
    /// the last 100,000 of a million-task enqueue), while new ids come in
    /// ascending order, which a B-tree takes at its right edge (a million
    /// of them: 0.22-0.26 s in all against 0.36-0.45 s, no insert over 4 ms).
    at: BTreeMap<u64, (Name, i64)>,
}

impl Order {
    /// The shared name of `queue` (its map is created if missing).
    fn name(&mut self, queue: &str) -> Name {
        if let Some((k, _)) = self.queues.get_key_value(queue) {
            return k.clone();
        }
        let k: Name = Arc::from(queue);
        self.queues.insert(k.clone(), BTreeMap::new());
        k
    }

    /// Puts `id` at `pos` in `queue` (both maps).
    fn put(&mut self, queue: &str, pos: i64, id: u64) {
        let name = self.name(queue);
        if let Some(q) = self.queues.get_mut(queue) {
            q.insert(pos, id);
        }
        self.at.insert(id, (name, pos));
    }

    /// Builds the index from the entries read from disk (the positions in
    /// the live records; any order works, by queue then by position is the
    /// fastest). An entry whose task already has a position (an earlier
    /// one) is left out and returned, as (queue, position, id).
    ///
    /// In bulk, because at a million entries adding them one at a time
    /// cost most of an open: each queue's map is built at once from its
    /// sorted entries, the id map at once from the entries sorted by id (a
    /// stable sort, so the first entry of an id is the one kept; they come
    /// in id order from disk, which the sort finds in one pass), and a
    /// queue's name is looked up once per queue, not per entry.
    pub fn load(
        entries: impl IntoIterator<Item = (Name, i64, u64)>,
    ) -> (Order, Vec<(Name, i64, u64)>) {
        let entries: Vec<(Name, i64, u64)> = entries.into_iter().collect();
        // Which entries are an id's second (or later) one.
        let mut by_id: Vec<(u64, usize)> = entries
            .iter()
            .enumerate()
            .map(|(i, (_, _, id))| (*id, i))
            .collect();
        by_id.sort_by_key(|(id, _)| *id);
        let mut twice = vec![false; entries.len()];
        for w in by_id.windows(2) {
            if w[0].0 == w[1].0 {
                twice[w[1].1] = true;
            }
        }
        by_id.dedup_by_key(|(id, _)| *id);
        let at: BTreeMap<u64, (Name, i64)> = by_id
            .iter()
            .map(|(id, i)| (*id, (entries[*i].0.clone(), entries[*i].1)))
            .collect();
        drop(by_id);
        let mut dup = Vec::new();
        // Runs of entries of one queue, as they come.
        let mut runs: Vec<(Name, Vec<(i64, u64)>)> = Vec::new();
        for (i, (name, pos, id)) in entries.into_iter().enumerate() {
            if twice[i] {
                dup.push((name, pos, id));
                continue;
            }
            match runs.last_mut() {
                Some((n, run)) if *n == name => run.push((pos, id)),
                _ => runs.push((name, vec![(pos, id)])),
            }
        }
        let mut by_queue: BTreeMap<Name, Vec<(i64, u64)>> = BTreeMap::new();
        for (n, run) in runs {
            by_queue.entry(n).or_default().extend(run);
        }
        let queues = by_queue
            .into_iter()
            .map(|(n, v)| (n, v.into_iter().collect::<BTreeMap<i64, u64>>()))
            .collect();
        (Order { queues, at }, dup)
    }

    pub fn head(&self, queue: &str) -> Option<u64> {
        self.queues.get(queue)?.values().next().copied()
    }

    pub fn len(&self, queue: &str) -> usize {
        self.queues.get(queue).map_or(0, BTreeMap::len)
    }

    /// Ids of a queue, head first.
    pub fn ids(&self, queue: &str) -> Vec<u64> {
        self.queues
            .get(queue)
            .map(|q| q.values().copied().collect())
            .unwrap_or_default()
    }

    /// Non-empty queues and their lengths, in name order.
    pub fn queues(&self) -> Vec<(String, usize)> {
        self.queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(n, q)| (n.to_string(), q.len()))
            .collect()
    }

    /// The position of a task in its queue.
    pub fn position(&self, id: u64) -> Option<i64> {
        self.at.get(&id).map(|(_, pos)| *pos)
    }

    /// The queue a task is in.
    pub fn queue_of(&self, id: u64) -> Option<&str> {
        self.at.get(&id).map(|(q, _)| &**q)
    }

    pub fn total(&self) -> usize {
        self.at.len()
    }

    /// The task right behind `id` in its queue (None at the tail, or when
    /// `id` is in no queue): walks a queue without copying it.
    pub fn next_after(&self, id: u64) -> Option<u64> {
        use std::ops::Bound::{Excluded, Unbounded};
        let (queue, pos) = self.at.get(&id)?;
        let q = self.queues.get(&**queue)?;
        q.range((Excluded(*pos), Unbounded))
            .next()
            .map(|(_, id)| *id)
    }

    /// Adds `id` to `queue` at `placement`. Returns the other tasks whose
    /// positions changed (all of the queue's when it had to be renumbered,
    /// else none).
    pub fn place(
        &mut self,
        queue: &str,
        id: u64,
        placement: Placement,
        undo: &mut Vec<Undo>,
    ) -> Result<Vec<u64>, OrderError> {
        if self.at.contains_key(&id) {
            return Err(OrderError::AlreadyQueued(id));
        }
        let mut moved = Vec::new();
        let pos = match self.free_position(queue, placement)? {
            Some(p) => p,
            None => {
                moved = self.renumber(queue, undo);
                self.free_position(queue, placement)?
                    .expect("a renumbered queue has room everywhere")
            }
        };
        self.put(queue, pos, id);
        undo.push(Undo::Placed(id));
        Ok(moved)
    }

    /// Takes `id` out of its queue. Returns the queue it was in.
    pub fn unplace(&mut self, id: u64, undo: &mut Vec<Undo>) -> Option<String> {
        let (name, pos) = self.at.remove(&id)?;
        if let Some(q) = self.queues.get_mut(&name) {
            q.remove(&pos);
        }
        let queue = name.to_string();
        undo.push(Undo::Unplaced {
            id,
            queue: queue.clone(),
            pos,
        });
        Some(queue)
    }

    /// Takes back changes, newest first.
    pub fn rollback(&mut self, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            match u {
                Undo::Placed(id) => {
                    if let Some((q, pos)) = self.at.remove(&id)
                        && let Some(m) = self.queues.get_mut(&q)
                    {
                        m.remove(&pos);
                    }
                }
                Undo::Unplaced { id, queue, pos } => self.put(&queue, pos, id),
                Undo::Renumbered { queue, old } => {
                    let name = self.name(&queue);
                    for (pos, id) in &old {
                        self.at.insert(*id, (name.clone(), *pos));
                    }
                    self.queues.insert(name, old);
                }
            }
        }
    }

    /// A free position for the placement, or None when the queue needs renumbering.
    fn free_position(&self, queue: &str, placement: Placement) -> Result<Option<i64>, OrderError> {
        let q = self.queues.get(queue);
        let first = q.and_then(|q| q.keys().next().copied());
        let last = q.and_then(|q| q.keys().next_back().copied());
        let anchor = |id: u64| -> Result<i64, OrderError> {
            match self.at.get(&id) {
                None => Err(OrderError::NotQueued(id)),
                Some((aq, pos)) if &**aq == queue => Ok(*pos),
                Some((aq, _)) => Err(OrderError::OtherQueue {
                    anchor: id,
                    queue: queue.to_string(),
                    actual: aq.to_string(),
                }),
            }
        };
        Ok(match placement {
            Placement::Last => match last {
                None => Some(0),
                Some(l) => l.checked_add(GAP),
            },
            Placement::First => match first {
                None => Some(0),
                Some(f) => f.checked_sub(GAP),
            },
            Placement::After(a) => {
                let p = anchor(a)?;
                let next = q.and_then(|q| q.range(p + 1..).next().map(|(k, _)| *k));
                match next {
                    None => p.checked_add(GAP),
                    Some(n) => midpoint(p, n),
                }
            }
            Placement::Before(b) => {
                let p = anchor(b)?;
                let prev = q.and_then(|q| q.range(..p).next_back().map(|(k, _)| *k));
                match prev {
                    None => p.checked_sub(GAP),
                    Some(pr) => midpoint(pr, p),
                }
            }
        })
    }

    /// Spreads a queue's positions a gap apart again; returns its tasks.
    fn renumber(&mut self, queue: &str, undo: &mut Vec<Undo>) -> Vec<u64> {
        let name = self.name(queue);
        let old = self.queues.remove(queue).unwrap_or_default();
        let n = old.len() as i64;
        let mut fresh = BTreeMap::new();
        for (i, id) in old.values().enumerate() {
            let pos = (i as i64 - n / 2) * GAP;
            fresh.insert(pos, *id);
            self.at.insert(*id, (name.clone(), pos));
        }
        let moved = old.values().copied().collect();
        self.queues.insert(name, fresh);
        undo.push(Undo::Renumbered {
            queue: queue.to_string(),
            old,
        });
        moved
    }
}

fn midpoint(a: i64, b: i64) -> Option<i64> {
    let m = a + (b - a) / 2;
    (m != a && m != b).then_some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(o: &mut Order, q: &str, id: u64, p: Placement) {
        o.place(q, id, p, &mut Vec::new()).unwrap();
    }

    #[test]
    fn placements_give_the_expected_order() {
        let mut o = Order::default();
        place(&mut o, "main", 1, Placement::Last);
        place(&mut o, "main", 2, Placement::Last);
        place(&mut o, "main", 3, Placement::First);
        place(&mut o, "main", 4, Placement::After(3));
        place(&mut o, "main", 5, Placement::Before(2));
        assert_eq!(o.ids("main"), vec![3, 4, 1, 5, 2]);
        assert_eq!(o.head("main"), Some(3));
        assert_eq!(o.len("main"), 5);
        // Walking from the head gives the same order.
        let walk: Vec<u64> =
            std::iter::successors(o.head("main"), |id| o.next_after(*id)).collect();
        assert_eq!(walk, vec![3, 4, 1, 5, 2]);
        assert_eq!(o.next_after(99), None);
    }

    /// Loading the positions placing gave (as the live records hold them)
    /// gives the order placing built; a task found at a second position
    /// keeps its first one, and the second is returned; entries in another
    /// order load the same.
    #[test]
    fn loading_entries_gives_the_queues_they_describe() {
        let mut built = Order::default();
        for (q, id, p) in [
            ("b", 1, Placement::Last),
            ("a", 2, Placement::Last),
            ("b", 3, Placement::First),
            ("b", 4, Placement::After(3)),
            ("a", 5, Placement::Before(2)),
            ("ab", 6, Placement::Last),
        ] {
            built.place(q, id, p, &mut Vec::new()).unwrap();
        }
        let mut entries: Vec<(Name, i64, u64)> = (1..=6)
            .map(|id| {
                let q = built.queue_of(id).unwrap();
                (Name::from(q), built.position(id).unwrap(), id)
            })
            .collect();
        // By queue name, then by position.
        entries.sort_by(|x, y| (x.0.as_bytes(), x.1).cmp(&(y.0.as_bytes(), y.1)));
        let twice = (Name::from("a"), i64::MAX, 3);
        entries.push(twice.clone());
        let (loaded, dup) = Order::load(entries.clone());
        assert_eq!(dup, vec![twice]);
        assert_eq!(loaded.queues(), built.queues());
        for q in ["a", "ab", "b"] {
            assert_eq!(loaded.ids(q), built.ids(q), "queue {q}");
        }
        assert_eq!(loaded.ids("b"), vec![3, 4, 1]);
        assert_eq!(loaded.next_after(3), Some(4));
        assert_eq!(loaded.total(), 6);
        entries.reverse();
        // Now task 3's second position is read first: it keeps that one.
        let (reversed, dup) = Order::load(entries);
        assert_eq!(dup, vec![(Name::from("b"), built.at[&3].1, 3)]);
        assert_eq!(reversed.total(), 6);
        assert_eq!(reversed.ids("a"), vec![5, 2, 3]);
        assert_eq!(reversed.ids("b"), vec![4, 1]);
        assert_eq!(reversed.ids("ab"), built.ids("ab"));
    }

    #[test]
    fn repeated_midpoints_force_a_renumber_that_keeps_order() {
        let mut o = Order::default();
        place(&mut o, "q", 1, Placement::Last);
        place(&mut o, "q", 2, Placement::Last);
        // Always insert right after 1: halves the gap every time, so the
        // queue is renumbered every 32 insertions.
        let mut moved = Vec::new();
        for id in 3..100 {
            let m = o
                .place("q", id, Placement::After(1), &mut Vec::new())
                .unwrap();
            if !m.is_empty() {
                moved.push((id, m));
            }
        }
        let mut expected = vec![1];
        expected.extend((3..100).rev());
        expected.push(2);
        assert_eq!(o.ids("q"), expected);
        assert_eq!(moved.len(), 3, "{moved:?}");
        // A renumber names every task queued before it.
        for (at, ids) in moved {
            let mut named = ids.clone();
            named.sort_unstable();
            assert_eq!(
                named,
                (1..at).collect::<Vec<u64>>(),
                "renumbered before {at}"
            );
        }
    }

    #[test]
    fn rollback_restores_everything() {
        let mut o = Order::default();
        place(&mut o, "q", 1, Placement::Last);
        place(&mut o, "q", 2, Placement::Last);
        let before = o.ids("q");
        let mut undo = Vec::new();
        for id in 3..80 {
            o.place("q", id, Placement::After(1), &mut undo).unwrap();
        }
        o.unplace(2, &mut undo);
        o.rollback(undo);
        assert_eq!(o.ids("q"), before);
        assert_eq!(o.total(), 2);
    }

    #[test]
    fn anchors_must_be_in_the_same_queue() {
        let mut o = Order::default();
        place(&mut o, "a", 1, Placement::Last);
        let e = o
            .place("b", 2, Placement::After(1), &mut Vec::new())
            .unwrap_err();
        assert!(matches!(e, OrderError::OtherQueue { .. }));
        let e = o
            .place("b", 2, Placement::Before(9), &mut Vec::new())
            .unwrap_err();
        assert_eq!(e, OrderError::NotQueued(9));
        let e = o
            .place("b", 1, Placement::Last, &mut Vec::new())
            .unwrap_err();
        assert_eq!(e, OrderError::AlreadyQueued(1));
    }
}
