//! Rebuilding state from the event log alone ([`replay`]) and checking it
//! against the store's state ([`verify`]). The replay keeps queues as plain
//! vectors, independent of the store's position keys, so it checks the order
//! logic too. Offline replay of an exported log uses the same [`replay`].
//! Attempt logs are replayed too (`AttemptLogged` adds one and drops the
//! oldest beyond the last `KEEP_ATTEMPTS`, `Removed` drops a task's) and
//! compared whole with the `o` keys.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::store::Store;
use crate::store::attempts::{self, AttemptLog};
use crate::store::counters::{self, Counts};
use crate::store::error::CorruptRecord;
use crate::store::event::{self, Event, EventKind};
use crate::store::order::Placement;
use crate::task::Task;

/// The state the log describes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Model {
    pub live: BTreeMap<u64, Task>,
    pub history: BTreeMap<u64, Task>,
    /// Non-empty queues, head first. (Change them only through events once
    /// one was applied: `index` follows them from then on.)
    pub queues: BTreeMap<String, VecDeque<u64>>,
    /// Attempt logs, by task id and attempt number (the last
    /// `KEEP_ATTEMPTS` of each task).
    pub attempts: BTreeMap<(u64, u32), AttemptLog>,
    /// The sequence number of the last event applied.
    pub last_seq: u64,
    /// The counters of the events from `count_from` on (see `counters`).
    pub counts: Counts,
    /// The first event counted (0 or 1: all).
    pub count_from: u64,
    /// Which queue each queued task is in (not part of the model's value).
    pub index: QueueIndex,
}

/// The model's index of `queues` by task id, built from them when the
/// first event is applied and kept by every change after, so that finding a
/// task's queue position costs O(1), not a look through every queue (a
/// replay of a million queued tasks would otherwise take hours). It is not
/// part of the model's value: two models are equal whatever their indexes.
#[derive(Clone, Default)]
pub struct QueueIndex {
    built: bool,
    of: HashMap<u64, String>,
}

impl PartialEq for QueueIndex {
    fn eq(&self, _: &QueueIndex) -> bool {
        true
    }
}

impl Eq for QueueIndex {}

impl std::fmt::Debug for QueueIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueueIndex({} queued)", self.of.len())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplayError {
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error(
        "the store's log starts at event {start}: the state before it comes from the checkpoint \
         of event {}, which is needed to replay it",
        start - 1
    )]
    NeedsCheckpoint { start: u64 },
    #[error("event {found} follows event {previous}; the log has a gap or is out of order")]
    Gap { previous: u64, found: u64 },
    #[error("event {seq} ({kind}) is about task {id}, which the log does not know at that point")]
    UnknownTask {
        seq: u64,
        kind: &'static str,
        id: u64,
    },
    #[error(
        "event {seq} places task {id} after or before task {anchor}, which is not in queue '{queue}'"
    )]
    BadAnchor {
        seq: u64,
        id: u64,
        anchor: u64,
        queue: String,
    },
    #[error("event {seq} ({kind}) adds task {id}, which the log already has")]
    Duplicate {
        seq: u64,
        kind: &'static str,
        id: u64,
    },
    #[error("event {seq} places task {id}, which is already in queue '{queue}'")]
    AlreadyQueued { seq: u64, id: u64, queue: String },
    #[error("event {seq} expires task {id}, which cannot expire: {why}")]
    NotExpirable { seq: u64, id: u64, why: String },
}

/// Where a placement puts a task in `queue`, or the anchor it lacks.
fn position(queue: Option<&VecDeque<u64>>, p: Placement) -> Result<usize, u64> {
    let find = |a: u64| queue.and_then(|q| q.iter().position(|x| *x == a)).ok_or(a);
    Ok(match p {
        Placement::Last => queue.map_or(0, VecDeque::len),
        Placement::First => 0,
        Placement::After(a) => find(a)? + 1,
        Placement::Before(b) => find(b)?,
    })
}

impl Model {
    fn queued(&self, id: u64) -> bool {
        self.index.of.contains_key(&id)
    }

    /// Builds the index from `queues` the first time.
    fn index_queues(&mut self) {
        if !self.index.built {
            self.index.of = self
                .queues
                .iter()
                .flat_map(|(q, ids)| ids.iter().map(move |id| (*id, q.clone())))
                .collect();
            self.index.built = true;
        }
    }

    /// Why live task `t` cannot expire at `at`, if it cannot: the rule of
    /// `ttl`, as the log shows it. A group child may expire only while it
    /// waits outside every queue (with its parent, which expires after
    /// it); a parent only while none of its children was placed, started or
    /// finished other than expired.
    fn why_not_expirable(&self, t: &Task, at: u64) -> Option<String> {
        if t.status != crate::task::Status::Queued || t.attempts > 0 {
            return Some(format!(
                "it is {} after {} attempt(s)",
                t.status.as_str(),
                t.attempts
            ));
        }
        match crate::ttl::deadline(t) {
            None => return Some("it has no TTL".into()),
            Some(d) if d > at => return Some(format!("its TTL runs out at {d}, after {at}")),
            Some(_) => {}
        }
        if t.parent.is_some() && self.queued(t.id) {
            return Some("it is a group child that was dispatched".into());
        }
        for c in t.children.iter() {
            let started = match (self.live.get(c), self.history.get(c)) {
                (Some(ct), _) => {
                    self.queued(*c) || ct.attempts > 0 || ct.status != crate::task::Status::Queued
                }
                (None, Some(ct)) => ct.status != crate::task::Status::Expired,
                (None, None) => true,
            };
            if started {
                return Some(format!("its group started (child {c})"));
            }
        }
        None
    }

    /// Takes `id` out of its queue (a head in O(1)).
    fn unqueue(&mut self, id: u64) {
        let Some(name) = self.index.of.remove(&id) else {
            return;
        };
        let Some(q) = self.queues.get_mut(&name) else {
            return;
        };
        let at = if q.front() == Some(&id) {
            Some(0)
        } else if q.back() == Some(&id) {
            Some(q.len() - 1)
        } else {
            q.iter().position(|x| *x == id)
        };
        if let Some(at) = at {
            q.remove(at);
        }
        if q.is_empty() {
            self.queues.remove(&name);
        }
    }

    fn insert(&mut self, queue: &str, id: u64, at: usize) {
        self.queues
            .entry(queue.to_string())
            .or_default()
            .insert(at, id);
        self.index.of.insert(id, queue.to_string());
    }

    /// Applies one event. An event the model refuses leaves it as it was,
    /// and one it takes leaves it consistent: no task both live and
    /// finished, every queued task live and in one position of its queue.
    /// The event is moved into the model (a task or attempt log it brings
    /// is kept as it is, not copied).
    pub fn apply(&mut self, ev: Event) -> Result<(), ReplayError> {
        if self.last_seq != 0 && self.last_seq.checked_add(1) != Some(ev.seq) {
            return Err(ReplayError::Gap {
                previous: self.last_seq,
                found: ev.seq,
            });
        }
        let seq = ev.seq;
        self.index_queues();
        self.apply_kind(ev)?;
        self.last_seq = seq;
        Ok(())
    }

    /// Checks everything before it changes anything.
    fn apply_kind(&mut self, ev: Event) -> Result<(), ReplayError> {
        let id = ev.kind.task_id();
        // The counters an event ticks are taken from the task as it was
        // before the event, and applied only once the event is accepted.
        let mut ticked = None;
        if ev.seq >= self.count_from {
            let before = match &ev.kind {
                EventKind::Enqueued { task, .. } => Some(&**task),
                _ => self.live.get(&id).or_else(|| self.history.get(&id)),
            };
            if let Some(task) = before {
                let ticks = counters::ticks(task, ev.at, &ev.kind);
                if !ticks.is_empty() {
                    ticked = Some((task.kind.clone(), ticks));
                }
            }
        }
        self.apply_change(ev)?;
        if let Some((kind, ticks)) = ticked {
            counters::apply(self.counts.entry(kind).or_default(), ticks);
        }
        Ok(())
    }

    /// Checks the event against the model and applies it, or changes nothing.
    fn apply_change(&mut self, ev: Event) -> Result<(), ReplayError> {
        let id = ev.kind.task_id();
        let unknown = || ReplayError::UnknownTask {
            seq: ev.seq,
            kind: ev.kind.name(),
            id,
        };
        let bad_anchor = |queue: &str, anchor| ReplayError::BadAnchor {
            seq: ev.seq,
            id,
            anchor,
            queue: queue.to_string(),
        };
        match &ev.kind {
            EventKind::Enqueued { task, placement } => {
                if self.live.contains_key(&id) || self.history.contains_key(&id) {
                    return Err(ReplayError::Duplicate {
                        seq: ev.seq,
                        kind: ev.kind.name(),
                        id,
                    });
                }
                if let Some(p) = placement {
                    let at = position(self.queues.get(&task.queue), *p)
                        .map_err(|a| bad_anchor(&task.queue, a))?;
                    self.insert(&task.queue, id, at);
                }
                if let EventKind::Enqueued { task, .. } = ev.kind {
                    self.live.insert(id, *task);
                }
            }
            EventKind::Placed {
                queue, placement, ..
            } => {
                if !self.live.contains_key(&id) {
                    return Err(unknown());
                }
                if let Some(q) = self.index.of.get(&id) {
                    return Err(ReplayError::AlreadyQueued {
                        seq: ev.seq,
                        id,
                        queue: q.clone(),
                    });
                }
                let at = position(self.queues.get(queue), *placement)
                    .map_err(|a| bad_anchor(queue, a))?;
                if let Some(task) = self.live.get_mut(&id) {
                    event::apply(task, ev.at, &ev.kind);
                }
                self.insert(queue, id, at);
            }
            EventKind::Removed { .. } => {
                if self.live.remove(&id).is_none() && self.history.remove(&id).is_none() {
                    return Err(unknown());
                }
                self.unqueue(id);
                self.attempts.retain(|(task, _), _| *task != id);
            }
            EventKind::AttemptLogged { log, .. } => {
                if !self.live.contains_key(&id) {
                    return Err(unknown());
                }
                let attempt = log.attempt;
                if let EventKind::AttemptLogged { log, .. } = ev.kind {
                    self.attempts.insert((id, attempt), *log);
                }
                let numbers = self
                    .attempts
                    .range((id, 0)..=(id, u32::MAX))
                    .map(|((_, n), _)| *n)
                    .collect();
                for old in attempts::to_drop(&numbers) {
                    self.attempts.remove(&(id, old));
                }
            }
            EventKind::Retried { placement, .. } | EventKind::RetriedAnew { placement, .. } => {
                let queue = &self.history.get(&id).ok_or_else(unknown)?.queue;
                let at = position(self.queues.get(queue), *placement)
                    .map_err(|a| bad_anchor(queue, a))?;
                let Some(mut task) = self.history.remove(&id) else {
                    return Err(unknown());
                };
                event::apply(&mut task, ev.at, &ev.kind);
                self.insert(&task.queue, id, at);
                self.live.insert(id, task);
            }
            EventKind::Expired { .. } => {
                let task = self.live.get(&id).ok_or_else(unknown)?;
                if let Some(why) = self.why_not_expirable(task, ev.at) {
                    return Err(ReplayError::NotExpirable {
                        seq: ev.seq,
                        id,
                        why,
                    });
                }
                if let Some(task) = self.live.get_mut(&id) {
                    event::apply(task, ev.at, &ev.kind);
                }
            }
            EventKind::MovedToHistory { .. } => {
                let mut task = self.live.remove(&id).ok_or_else(unknown)?;
                event::apply(&mut task, ev.at, &ev.kind);
                self.history.insert(id, task);
                self.unqueue(id);
            }
            other => {
                let task = self.live.get_mut(&id).ok_or_else(unknown)?;
                event::apply(task, ev.at, other);
            }
        }
        Ok(())
    }
}

/// Rebuilds the state from a sequence of events (counting them all).
pub fn replay(
    events: impl IntoIterator<Item = Result<Event, CorruptRecord>>,
) -> Result<Model, ReplayError> {
    replay_counting(events, 0)
}

/// Rebuilds the state from a sequence of events, counting those from event
/// `count_from` on.
pub fn replay_counting(
    events: impl IntoIterator<Item = Result<Event, CorruptRecord>>,
    count_from: u64,
) -> Result<Model, ReplayError> {
    let mut m = Model {
        count_from,
        ..Model::default()
    };
    for ev in events {
        m.apply(ev?)?;
    }
    Ok(m)
}

/// The state as the store holds it, in the model's shape.
pub fn current(store: &Store) -> Result<Model, CorruptRecord> {
    let counting = store.counting();
    let mut m = Model {
        last_seq: store.next_seq() - 1,
        counts: counting.counts,
        count_from: counting.since,
        ..Model::default()
    };
    for t in store.live_tasks() {
        let t = t?;
        m.live.insert(t.id, t);
    }
    for t in store.history() {
        let t = t?;
        m.history.insert(t.id, t);
    }
    for (q, _) in store.queues() {
        m.queues.insert(q.clone(), store.queue_ids(&q).into());
    }
    for a in store.all_attempts() {
        let (at, log) = a?;
        m.attempts.insert(at, log);
    }
    Ok(m)
}

/// Replays the store's whole log and lists where it disagrees with the state.
/// An empty list means they agree. A log that was cut needs its checkpoint:
/// see [`verify_from`].
pub fn verify(store: &Store) -> Result<Vec<String>, ReplayError> {
    verify_from(store, None, &mut |_, _| {})
}

/// [`verify`], replaying the log from `start`, the state at the event
/// before the log's first (a checkpoint's model; `None` for a log that
/// begins at event 1), and telling `progress` the event reached and the
/// last one every 4096 events.
pub fn verify_from(
    store: &Store,
    start: Option<Model>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<String>, ReplayError> {
    let log_start = store.log_start()?;
    let total = store.next_seq().saturating_sub(1);
    let events = store.events_from(log_start).inspect(|e| {
        if let Ok(e) = e
            && e.seq.is_multiple_of(4096)
        {
            progress(e.seq, total);
        }
    });
    let model = match start {
        None if log_start > 1 => return Err(ReplayError::NeedsCheckpoint { start: log_start }),
        None => replay_counting(events, store.counting().since)?,
        Some(mut m) => {
            if m.last_seq + 1 != log_start {
                return Err(ReplayError::Gap {
                    previous: m.last_seq,
                    found: log_start,
                });
            }
            for ev in events {
                m.apply(ev?)?;
            }
            m
        }
    };
    let state = current(store)?;
    let mut diffs = Vec::new();
    if model.last_seq != state.last_seq {
        diffs.push(format!(
            "the log ends at event {} but the store expects {}",
            model.last_seq, state.last_seq
        ));
    }
    diff_maps("live task", &model.live, &state.live, &mut diffs);
    diff_maps("finished task", &model.history, &state.history, &mut diffs);
    diff_attempts(&model.attempts, &state.attempts, &mut diffs);
    diffs.extend(counters::diff(&model.counts, &state.counts));
    let names: std::collections::BTreeSet<_> =
        model.queues.keys().chain(state.queues.keys()).collect();
    for q in names {
        let (a, b) = (model.queues.get(q), state.queues.get(q));
        if a != b {
            diffs.push(format!(
                "queue '{q}': the log says {:?}, the state has {:?}",
                a.cloned().unwrap_or_default(),
                b.cloned().unwrap_or_default()
            ));
        }
    }
    Ok(diffs)
}

/// Attempt logs are compared whole: every field, and both tails byte for
/// byte (as stored, compressed or not).
fn diff_attempts(
    log: &BTreeMap<(u64, u32), AttemptLog>,
    state: &BTreeMap<(u64, u32), AttemptLog>,
    diffs: &mut Vec<String>,
) {
    for ((id, n), l) in log {
        match state.get(&(*id, *n)) {
            None => diffs.push(format!(
                "attempt {n} of task {id} is logged in the log but not in the state"
            )),
            Some(s) if s != l => diffs.push(format!(
                "attempt {n} of task {id} differs: log {l:?}, state {s:?}"
            )),
            _ => {}
        }
    }
    for (id, n) in state.keys() {
        if !log.contains_key(&(*id, *n)) {
            diffs.push(format!(
                "attempt {n} of task {id} is logged in the state but not in the log"
            ));
        }
    }
}

fn diff_maps(
    what: &str,
    log: &BTreeMap<u64, Task>,
    state: &BTreeMap<u64, Task>,
    diffs: &mut Vec<String>,
) {
    for (id, t) in log {
        match state.get(id) {
            None => diffs.push(format!("{what} {id} is in the log but not in the state")),
            Some(s) if s != t => diffs.push(format!("{what} {id} differs: log {t:?}, state {s:?}")),
            _ => {}
        }
    }
    for id in state.keys() {
        if !log.contains_key(id) {
            diffs.push(format!("{what} {id} is in the state but not in the log"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{Status, TaskSpec};

    fn task(id: u64, queue: &str) -> Task {
        let spec = TaskSpec {
            queue: queue.into(),
            kind: "K".into(),
            name: format!("t{id}"),
            ..Default::default()
        };
        let mut t = spec
            .into_task(1, &crate::budget::Budget::default())
            .expect("task");
        t.id = id;
        t
    }

    fn ev(seq: u64, kind: EventKind) -> Event {
        Event { seq, at: 10, kind }
    }

    /// A model whose queues were filled by hand (as a checkpoint's are)
    /// indexes them at its first event: heads leave their queue, a task
    /// already queued cannot be placed again, and an emptied queue goes.
    #[test]
    fn queues_filled_by_hand_are_indexed_at_the_first_event() {
        let mut m = Model::default();
        for id in 1..=3 {
            m.live.insert(id, task(id, "a"));
        }
        m.live.insert(4, task(4, "b"));
        m.queues.insert("a".into(), VecDeque::from(vec![1, 2, 3]));
        m.queues.insert("b".into(), VecDeque::from(vec![4]));
        m.last_seq = 9;
        let placed_again = ev(
            10,
            EventKind::Placed {
                id: 3,
                queue: "b".into(),
                placement: Placement::Last,
            },
        );
        let before = m.clone();
        match m.apply(placed_again) {
            Err(ReplayError::AlreadyQueued { id: 3, queue, .. }) => assert_eq!(queue, "a"),
            other => panic!("placing a queued task again: {other:?}"),
        }
        assert_eq!(m, before, "a refused event changes nothing");
        let done = |seq, id| {
            ev(
                seq,
                EventKind::MovedToHistory {
                    id,
                    status: Status::Succeeded,
                },
            )
        };
        m.apply(done(10, 1)).expect("the head of a");
        m.apply(done(11, 3)).expect("the tail of a");
        m.apply(done(12, 4)).expect("the only task of b");
        assert_eq!(m.queues.get("a"), Some(&VecDeque::from(vec![2])));
        assert!(!m.queues.contains_key("b"), "an empty queue goes");
        // Task 4 is finished now: it can be neither placed nor found queued.
        assert!(!m.queued(4) && m.queued(2));
    }
}
