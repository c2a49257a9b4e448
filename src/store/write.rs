//! Write transactions: the only way berth's state changes.
//!
//! A [`WriteTxn`] holds the store's write lock, stages task changes in its
//! slots (one per task it read or changed) and queue-order changes in the
//! index (with an undo log), and
//! records one [`Event`] per change. Every change to a task is made by
//! applying its event ([`event::apply`]), so the state cannot say what the
//! log does not. Dropping a transaction without committing discards it.
//!
//! `commit` hands one [`CommitRecord`] (the events and the exact key writes)
//! to `Store::append`, which appends it to the write-ahead log (without the
//! log: inserts it under `e` + first sequence number) and puts the key
//! writes (with the log, the record's `e` keys too) in the store's overlay
//! (which every read consults first), then waits for durability as the
//! store's mode says. A background applier writes the keys to the tree
//! later, then an applied mark; opening the store re-applies every record
//! after the mark (see `overlay`). So one frame (or one insert) and one
//! shared flush acknowledge a commit, and nothing on that path blocks
//! behind a flush in progress, so concurrent commits share flushes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::MutexGuard;

use crate::budget::Blob;
use crate::codec;
use crate::store::attempts::{self, AttemptLog};
use crate::store::children;
use crate::store::counters::{self, KindCounts};
use crate::store::db::{Inner, Store};
use crate::store::error::{CorruptRecord, WriteError};
use crate::store::event::{self, CommitRecord, Event, EventKind, FromEvent, KeyWrite};
use crate::store::keys::{self, HISTORY, TASK};
use crate::store::order::{Placement, Undo};
use crate::store::stored;
use crate::task::{Status, Task, check_name};

mod group_views;

/// Where a task's record lives (or lived when the transaction began).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    New,
    Live,
    History,
}

#[derive(Debug)]
struct Slot {
    origin: Home,
    /// None once removed.
    task: Option<Task>,
    home: Home,
    /// Changed by this transaction; commit writes only changed slots.
    dirty: bool,
    /// The task has children, and their list is under its `g` key already
    /// (see `children`): read so, or written once by this transaction.
    children_kept: bool,
    /// The task had children (a removed one's `g` key goes too).
    had_children: bool,
    /// The index of the `Enqueued` event that added it, for a task this
    /// transaction added (its key write may name the event: see
    /// `commit_record`).
    enqueued: Option<usize>,
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The sequence number of the last event written (0 if none).
    pub last_seq: u64,
    pub events: usize,
}

pub struct WriteTxn<'s> {
    store: &'s Store,
    inner: Option<MutexGuard<'s, Inner>>,
    now: u64,
    slots: BTreeMap<u64, Slot>,
    undo: Vec<Undo>,
    events: Vec<Event>,
    next_id: u64,
    next_seq: u64,
    first_new_id: u64,
    /// May write into the disk reserve (see `health`).
    reserve: bool,
    /// The attempt numbers each task this transaction logged or removed
    /// has logs for, as this transaction sees them.
    attempt_sets: BTreeMap<u64, BTreeSet<u32>>,
    /// Attempt-log key writes, by key (the last one for a key wins).
    attempt_writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The counts of the kinds this transaction's events touched (see
    /// `counters`), written with it.
    counts: BTreeMap<String, KindCounts>,
    /// Tasks found due that cannot expire: their deadlines are dropped from
    /// the index at commit (see `deadlines`).
    stale_deadlines: Vec<u64>,
    /// (group parent, child) for every event on a group's child (see
    /// `group_views`).
    group_touched: Vec<(u64, u64)>,
    /// The groups whose views this transaction read whole.
    groups_built: Vec<u64>,
}

/// What [`WriteTxn::cancel`] did, and what it waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancellation {
    /// Every task that ends cancelled: a group's live children first, then
    /// the task itself.
    pub ids: Vec<u64>,
    /// The running ones, not cancelled yet: their handlers must be stopped
    /// first. When they have returned, they (and then a group parent) are
    /// cancelled with [`WriteTxn::cancel_one`].
    pub running: Vec<u64>,
}

impl<'s> WriteTxn<'s> {
    pub(crate) fn new(store: &'s Store, inner: MutexGuard<'s, Inner>) -> Self {
        store.txn_begun();
        let (next_id, next_seq) = (inner.next_id, inner.next_seq);
        WriteTxn {
            store,
            now: store.clock().now_ms(),
            inner: Some(inner),
            slots: BTreeMap::new(),
            undo: Vec::new(),
            events: Vec::new(),
            next_id,
            next_seq,
            first_new_id: next_id,
            reserve: false,
            attempt_sets: BTreeMap::new(),
            attempt_writes: BTreeMap::new(),
            counts: BTreeMap::new(),
            stale_deadlines: Vec::new(),
            group_touched: Vec::new(),
            groups_built: Vec::new(),
        }
    }

    /// Lets this transaction add tasks while space is short: it records
    /// work already under way (the engine's step with its follow-ups).
    pub fn use_reserve(&mut self) {
        self.reserve = true;
    }

    fn inner(&mut self) -> &mut Inner {
        self.inner
            .as_mut()
            .expect("a live transaction holds the lock")
    }

    /// The time this transaction stamps on its events.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Reserves a task id (for a group parent whose children must name it).
    pub fn allocate_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn slot(&mut self, id: u64) -> Result<&mut Slot, WriteError> {
        if !self.slots.contains_key(&id) {
            let (home, (task, kept)) = match self.read(TASK, id)? {
                Some(t) => (Home::Live, t),
                None => match self.read(HISTORY, id)? {
                    Some(t) => (Home::History, t),
                    None => return Err(WriteError::NoSuchTask(id)),
                },
            };
            let had_children = !task.children.is_empty();
            self.slots.insert(
                id,
                Slot {
                    origin: home,
                    task: Some(task),
                    home,
                    dirty: false,
                    children_kept: kept,
                    enqueued: None,
                    had_children,
                },
            );
        }
        match self.slots.get_mut(&id) {
            Some(s) if s.task.is_some() => Ok(s),
            _ => Err(WriteError::NoSuchTask(id)),
        }
    }

    /// A stored task, its children list joined (from the store's cache of
    /// the lists, or its `g` key); and whether that list is under its `g` key.
    fn read(&mut self, prefix: u8, id: u64) -> Result<Option<(Task, bool)>, WriteError> {
        if prefix == TASK
            && let Some(t) = self.inner().warm.get(id)
        {
            return Ok(Some((t.clone(), false)));
        }
        let key = keys::id_key(prefix, id);
        let Some(v) = self.store.get_raw(&key)? else {
            return Ok(None);
        };
        let corrupt = |e: String| WriteError::Corrupt(CorruptRecord::new(&key, e));
        let mut t = stored::decode(prefix, &v).map_err(|e| corrupt(e.to_string()))?;
        if !children::is_apart(&t) {
            return Ok(Some((t, false)));
        }
        if let Some(list) = self.inner().children.get(&id) {
            t.children = list.clone();
            return Ok(Some((t, true)));
        }
        self.store.join_children(&mut t).map_err(corrupt)?;
        self.inner().children.insert(id, t.children.clone());
        Ok(Some((t, true)))
    }

    /// The task as this transaction sees it.
    pub fn task(&mut self, id: u64) -> Result<&Task, WriteError> {
        let slot = self.slot(id)?;
        Ok(slot
            .task
            .as_ref()
            .expect("slot() returns only present tasks"))
    }

    /// The head of a queue as this transaction sees it. (Calling the store's
    /// own readers while a transaction is open would wait for its lock.)
    pub fn head(&mut self, queue: &str) -> Option<u64> {
        self.inner().order.head(queue)
    }

    /// The ids in a queue, head first, as this transaction sees them.
    pub fn queue_ids(&mut self, queue: &str) -> Vec<u64> {
        self.inner().order.ids(queue)
    }

    /// Non-empty queues and their lengths, in name order, as this transaction sees them.
    pub fn queues(&mut self) -> Vec<(String, usize)> {
        self.inner().order.queues()
    }

    /// The queue a task is placed in, as this transaction sees it.
    pub fn queue_of(&mut self, id: u64) -> Option<String> {
        self.inner().order.queue_of(id).map(str::to_string)
    }

    /// The task right behind `id` in its queue, as this transaction sees it.
    pub fn next_in_queue(&mut self, id: u64) -> Option<u64> {
        self.inner().order.next_after(id)
    }

    /// The length of a queue, as this transaction sees it.
    pub fn queue_len(&mut self, queue: &str) -> usize {
        self.inner().order.len(queue)
    }

    /// Whether the task exists (live or finished) as this transaction sees it.
    pub fn exists(&mut self, id: u64) -> bool {
        self.slot(id).is_ok()
    }

    /// Whether the task is live (not in the history, not removed).
    pub fn is_live(&mut self, id: u64) -> Result<bool, WriteError> {
        Ok(self.slot(id)?.home != Home::History)
    }

    fn push_event(&mut self, kind: EventKind) -> Result<(), WriteError> {
        let seq = self.next_seq;
        let at = self.now;
        let id = kind.task_id();
        let (task_kind, ticks, parent) = match &kind {
            EventKind::Enqueued { task, .. } => (
                task.kind.clone(),
                counters::ticks(task, at, &kind),
                task.parent,
            ),
            _ => {
                let task = self.slot(id)?.task.as_ref().expect("present");
                (
                    task.kind.clone(),
                    counters::ticks(task, at, &kind),
                    task.parent,
                )
            }
        };
        if let Some(p) = parent {
            self.group_touched.push((p, id));
        }
        if !ticks.is_empty() {
            if !self.counts.contains_key(&task_kind) {
                let c = self.inner().counting.counts.get(&task_kind).cloned();
                self.counts.insert(task_kind.clone(), c.unwrap_or_default());
            }
            let c = self.counts.get_mut(&task_kind).expect("inserted above");
            counters::apply(c, ticks);
        }
        if matches!(kind, EventKind::AttemptLogged { .. }) {
            self.slot(id)?;
        } else if !matches!(kind, EventKind::Enqueued { .. } | EventKind::Removed { .. }) {
            let slot = self.slot(id)?;
            slot.dirty = true;
            let task = slot
                .task
                .as_mut()
                .expect("slot() returns only present tasks");
            event::apply(task, at, &kind);
        }
        self.next_seq += 1;
        self.events.push(Event { seq, at, kind });
        Ok(())
    }

    fn live(&mut self, id: u64, op: &'static str) -> Result<&Task, WriteError> {
        let slot = self.slot(id)?;
        if slot.home == Home::History {
            let state = slot.task.as_ref().map_or("gone", |t| t.status.as_str());
            return Err(WriteError::WrongState {
                id,
                state: format!("finished ({state})"),
                op,
            });
        }
        Ok(slot.task.as_ref().expect("present"))
    }

    /// Adds a new task. `placement` None keeps it out of every queue (a group
    /// child waiting for its parent). Returns its id.
    pub fn enqueue(
        &mut self,
        mut task: Task,
        placement: Option<Placement>,
    ) -> Result<u64, WriteError> {
        check_name("queue", &task.queue).map_err(WriteError::Queue)?;
        if task.id == 0 {
            task.id = self.allocate_id();
        } else if task.id < self.first_new_id
            || task.id >= self.next_id
            || self.slots.contains_key(&task.id)
        {
            return Err(WriteError::WrongState {
                id: task.id,
                state: "not an id reserved by this transaction".into(),
                op: "enqueue it",
            });
        }
        task.status = Status::Queued;
        crate::budget::check_record(
            self.store.budget(),
            codec::encoded_len(&task),
            task.payload.compressed,
            task.result.as_ref(),
        )
        .map_err(WriteError::Budget)?;
        let id = task.id;
        if let Some(p) = placement {
            self.place_in_order(&task.queue.clone(), id, p)?;
        }
        self.slots.insert(
            id,
            Slot {
                origin: Home::New,
                had_children: !task.children.is_empty(),
                task: Some(task.clone()),
                home: Home::Live,
                dirty: true,
                children_kept: false,
                enqueued: Some(self.events.len()),
            },
        );
        self.push_event(EventKind::Enqueued {
            task: Box::new(task),
            placement,
        })?;
        Ok(id)
    }

    /// Puts a live task that is in no queue into `queue`.
    pub fn place(&mut self, id: u64, queue: &str, placement: Placement) -> Result<(), WriteError> {
        check_name("queue", queue).map_err(WriteError::Queue)?;
        self.live(id, "place it")?;
        self.place_in_order(queue, id, placement)?;
        self.push_event(EventKind::Placed {
            id,
            queue: queue.to_string(),
            placement,
        })
    }

    /// Where a placement an operator asked for (`enqueue --first` or
    /// `--before`) puts a new task in `queue`, given what runs there: a
    /// running task keeps its place at the head (it is not taken back), so
    /// `First` means right behind the running tasks at the front, and a
    /// place before a running task is refused. Enqueue the task with the
    /// placement this returns: its event records it, so a replay agrees.
    /// (A handler's follow-up at the head goes before the task that made
    /// it, which leaves the queue in the same commit: not through here.)
    pub fn around_running(
        &mut self,
        queue: &str,
        placement: Placement,
    ) -> Result<Placement, WriteError> {
        // A group parent stays `queued` while its children run: once its
        // group has started, it holds its place as a running task does.
        let running = |txn: &mut Self, id: u64| -> Result<bool, WriteError> {
            let (status, children) = match txn.slot(id)?.task.as_ref() {
                Some(t) => (t.status, t.children.clone()),
                None => return Ok(false),
            };
            Ok(status == Status::Running
                || (status == Status::Queued
                    && !children.is_empty()
                    && txn.group_started(&children)?))
        };
        match placement {
            Placement::First => {
                let mut behind = None;
                let mut next = self.inner().order.head(queue);
                while let Some(id) = next {
                    if !running(self, id)? {
                        break;
                    }
                    behind = Some(id);
                    next = self.inner().order.next_after(id);
                }
                Ok(behind.map_or(Placement::First, Placement::After))
            }
            Placement::Before(b)
                if self.inner().order.queue_of(b) == Some(queue) && running(self, b)? =>
            {
                Err(WriteError::WrongState {
                    id: b,
                    state: "running".into(),
                    op: "place a task before it (a running task keeps its place at the head; \
                         --first puts a task right behind it)",
                })
            }
            p => Ok(p),
        }
    }

    /// Whether the group of these children has started (see
    /// `ttl::group_started`): one of them was placed in a queue, has
    /// started or has finished. Reads the children up to the first such.
    pub fn group_started(&mut self, children: &[u64]) -> Result<bool, WriteError> {
        for &c in children {
            let started = match self.peek(c)? {
                Some(t) if self.is_live(c)? => {
                    let placed = self.queue_of(c).is_some();
                    crate::ttl::group_started([Some((&t, placed))])
                }
                _ => true,
            };
            if started {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Gives `id` a position in `queue` (its record, written by the event
    /// that placed it, holds it). Should the queue be renumbered, every
    /// other task in it moved: their records are written again too. If one
    /// cannot be read, the placement is taken back and the error returned.
    fn place_in_order(
        &mut self,
        queue: &str,
        id: u64,
        placement: Placement,
    ) -> Result<(), WriteError> {
        let undone = self.undo.len();
        let undo = &mut self.undo;
        let moved = self
            .inner
            .as_mut()
            .expect("live txn")
            .order
            .place(queue, id, placement, undo)?;
        for other in moved {
            if let Err(e) = self.slot(other).map(|s| s.dirty = true) {
                let tail = self.undo.split_off(undone);
                self.inner().order.rollback(tail);
                return Err(e);
            }
        }
        Ok(())
    }

    fn expect_status(&mut self, id: u64, want: Status, op: &'static str) -> Result<(), WriteError> {
        let t = self.live(id, op)?;
        if t.status != want {
            return Err(WriteError::WrongState {
                id,
                state: t.status.as_str().into(),
                op,
            });
        }
        Ok(())
    }

    /// Marks a queued task running.
    pub fn start(&mut self, id: u64) -> Result<(), WriteError> {
        self.expect_status(id, Status::Queued, "start it")?;
        self.push_event(EventKind::Started { id })
    }

    /// Marks a running task succeeded (it stays live until moved to history).
    pub fn succeed(&mut self, id: u64, result: Option<Blob>) -> Result<(), WriteError> {
        self.expect_status(id, Status::Running, "mark it succeeded")?;
        self.push_event(EventKind::Succeeded { id, result })
    }

    /// Records a failed attempt: the task waits again, `delay_ms` at least.
    pub fn fail(
        &mut self,
        id: u64,
        message: String,
        delay_ms: Option<u64>,
    ) -> Result<(), WriteError> {
        self.live(id, "mark it failed")?;
        self.push_event(EventKind::Failed {
            id,
            message,
            delay_ms,
        })
    }

    /// Merges an enqueue into a waiting task (compaction, see `compaction`):
    /// the task takes `payload` and keeps everything else. The task must be
    /// live and queued (not running), and still fit the size budget.
    pub fn merge(&mut self, id: u64, payload: Blob) -> Result<(), WriteError> {
        self.expect_status(id, Status::Queued, "merge into it")?;
        let mut merged = self.task(id)?.clone();
        merged.payload = payload;
        let size = codec::encoded_len(&merged);
        let budget = self.store.budget().max_object;
        if size > budget {
            return Err(WriteError::Budget(crate::budget::BudgetError::TooLarge {
                what: "record",
                size,
                compressed: merged.payload.compressed,
                budget,
            }));
        }
        self.push_event(EventKind::Merged {
            id,
            payload: merged.payload,
        })
    }

    /// A copy of the task as this transaction sees it, read without keeping
    /// it in the transaction (for scans over many tasks); `None` if it does
    /// not exist.
    pub fn peek(&mut self, id: u64) -> Result<Option<Task>, WriteError> {
        if let Some(slot) = self.slots.get(&id) {
            return Ok(slot.task.clone());
        }
        match self.read(TASK, id)? {
            Some((t, _)) => Ok(Some(t)),
            None => Ok(self.read(HISTORY, id)?.map(|(t, _)| t)),
        }
    }

    /// Puts a task back to waiting without counting a failure.
    pub fn requeue(&mut self, id: u64, retry_at: Option<u64>) -> Result<(), WriteError> {
        self.live(id, "requeue it")?;
        self.push_event(EventKind::Requeued { id, retry_at })
    }

    /// Updates a group parent's name, failure count and message.
    pub fn update_group(
        &mut self,
        id: u64,
        name: String,
        failures: u32,
        message: Option<String>,
    ) -> Result<(), WriteError> {
        self.live(id, "update it")?;
        self.push_event(EventKind::GroupUpdated {
            id,
            name,
            failures,
            message,
        })
    }

    /// Moves a task out of its queue into the history with its final status.
    pub fn to_history(&mut self, id: u64, status: Status) -> Result<(), WriteError> {
        self.live(id, "move it to history")?;
        let undo = &mut self.undo;
        self.inner
            .as_mut()
            .expect("live txn")
            .order
            .unplace(id, undo);
        self.push_event(EventKind::MovedToHistory { id, status })?;
        let slot = self.slot(id)?;
        slot.home = Home::History;
        slot.dirty = true;
        Ok(())
    }

    /// Puts a dead letter (a failed task in the history) back into its queue
    /// with its failure count reset. Group members are retried as a group
    /// by enqueueing again, not one by one.
    pub fn retry(&mut self, id: u64, placement: Placement) -> Result<(), WriteError> {
        let slot = self.slot(id)?;
        let task = slot.task.as_ref().expect("present");
        if slot.home != Home::History || task.status != Status::Failed {
            let state = if slot.home == Home::History {
                format!("finished ({})", task.status.as_str())
            } else {
                task.status.as_str().to_string()
            };
            return Err(WriteError::WrongState {
                id,
                state,
                op: "retry it (only dead letters can be retried)",
            });
        }
        if task.parent.is_some() || !task.children.is_empty() {
            return Err(WriteError::WrongState {
                id,
                state: "part of a group".into(),
                op: "retry it alone",
            });
        }
        let queue = task.queue.clone();
        self.place_in_order(&queue, id, placement)?;
        self.push_event(EventKind::RetriedAnew { id, placement })?;
        self.slot(id)?.home = Home::Live;
        Ok(())
    }

    /// Refuses a group child (while its group is there): it cannot be
    /// removed on its own, whatever its state. (`task remove` asks this
    /// first, so that a running child is not told to be cancelled alone,
    /// which `task cancel` refuses too.)
    pub fn check_removable_alone(&mut self, id: u64) -> Result<(), WriteError> {
        if let Some(parent) = self.task(id)?.parent
            && self.slot(parent).is_ok()
        {
            return Err(WriteError::WrongState {
                id,
                state: format!("part of group {parent}"),
                op: "remove it alone (remove the group instead)",
            });
        }
        Ok(())
    }

    /// Deletes a task (and, for a group parent, its children). A group child
    /// cannot be removed on its own. Returns the ids removed.
    pub fn remove(&mut self, id: u64) -> Result<Vec<u64>, WriteError> {
        self.check_removable_alone(id)?;
        let task = self.task(id)?.clone();
        let mut removed = Vec::new();
        for child in task.children.iter().copied() {
            if self.slot(child).is_ok() {
                removed.extend(self.remove_one(child)?);
            }
        }
        removed.extend(self.remove_one(id)?);
        Ok(removed)
    }

    fn remove_one(&mut self, id: u64) -> Result<Vec<u64>, WriteError> {
        let undo = &mut self.undo;
        self.inner
            .as_mut()
            .expect("live txn")
            .order
            .unplace(id, undo);
        self.push_event(EventKind::Removed { id })?;
        let slot = self.slot(id)?;
        slot.task = None;
        slot.dirty = true;
        let logged = std::mem::take(self.attempt_set(id)?);
        for n in logged {
            self.attempt_writes
                .insert(keys::attempt_key(id, n).to_vec(), None);
        }
        Ok(vec![id])
    }

    /// The attempt numbers task `id` has logs for, as this transaction sees
    /// them: the stored ones, with this transaction's puts and deletes.
    fn attempt_set(&mut self, id: u64) -> Result<&mut BTreeSet<u32>, WriteError> {
        if !self.attempt_sets.contains_key(&id) {
            let mut set = self.store.attempt_numbers(id)?;
            let prefix = keys::attempt_prefix(id);
            for (k, v) in self.attempt_writes.range(prefix.to_vec()..) {
                if !k.starts_with(&prefix) {
                    break;
                }
                if let Some((_, n)) = keys::parse_attempt_key(k) {
                    if v.is_some() {
                        set.insert(n);
                    } else {
                        set.remove(&n);
                    }
                }
            }
            self.attempt_sets.insert(id, set);
        }
        Ok(self.attempt_sets.entry(id).or_default())
    }

    /// Records how the current attempt of a live task went (`AttemptLogged`):
    /// its log goes under `o` ‖ id ‖ attempt, and the task's logs beyond the
    /// last [`attempts::KEEP_ATTEMPTS`] are dropped. The log must be for the
    /// task's current attempt (`attempts`), so a task's logs are all for
    /// attempts up to the newest one.
    pub fn log_attempt(&mut self, id: u64, log: AttemptLog) -> Result<(), WriteError> {
        let current = self.live(id, "log an attempt of it")?.attempts;
        let n = log.attempt;
        if n != current {
            return Err(WriteError::WrongState {
                id,
                state: format!("at attempt {current}, not {n}"),
                op: "log that attempt",
            });
        }
        let value = codec::encode(&log);
        self.push_event(EventKind::AttemptLogged {
            id,
            log: Box::new(log),
        })?;
        self.attempt_writes
            .insert(keys::attempt_key(id, n).to_vec(), Some(value));
        // Every log of the task is for an attempt up to `n` (each was logged
        // at its own attempt, and attempts only grow), so up to attempt
        // KEEP_ATTEMPTS none can be dropped and the stored ones need not be
        // read (a range scan costs sled a copy of a leaf).
        if n as usize <= attempts::KEEP_ATTEMPTS && !self.attempt_sets.contains_key(&id) {
            return Ok(());
        }
        let set = self.attempt_set(id)?;
        set.insert(n);
        let drop = attempts::to_drop(set);
        for old in &drop {
            set.remove(old);
        }
        for old in drop {
            self.attempt_writes
                .insert(keys::attempt_key(id, old).to_vec(), None);
        }
        Ok(())
    }

    /// Ends one live task as `cancelled` (`Cancelled`, then
    /// `MovedToHistory(cancelled)`), whatever its status: the caller has
    /// made sure nothing runs it any more.
    pub fn cancel_one(&mut self, id: u64) -> Result<(), WriteError> {
        self.live(id, "cancel it")?;
        self.push_event(EventKind::Cancelled { id })?;
        self.to_history(id, Status::Cancelled)
    }

    /// Cancels a live task: a task that is not running ends at once; a
    /// group parent takes its live children with it, and ends at once when
    /// none of them runs. `running` says which tasks a handler runs now:
    /// those are only listed (see [`Cancellation`]). A group child cannot
    /// be cancelled on its own, nor can a finished task. Everything is read
    /// and checked before anything is written.
    pub fn cancel(
        &mut self,
        id: u64,
        running: &dyn Fn(u64) -> bool,
    ) -> Result<Cancellation, WriteError> {
        let task = self.live(id, "cancel it")?.clone();
        if let Some(parent) = task.parent
            && self.exists(parent)
            && self.is_live(parent)?
        {
            return Err(WriteError::WrongState {
                id,
                state: format!("part of group {parent}"),
                op: "cancel it alone (cancel its group instead)",
            });
        }
        let mut ids = Vec::new();
        for child in task.children.iter().copied() {
            if self.exists(child) && self.is_live(child)? {
                ids.push(child);
            }
        }
        let running: Vec<u64> = if task.children.is_empty() {
            [id].into_iter().filter(|i| running(*i)).collect()
        } else {
            ids.iter().copied().filter(|c| running(*c)).collect()
        };
        for child in ids.clone() {
            if !running.contains(&child) {
                self.cancel_one(child)?;
            }
        }
        if running.is_empty() {
            self.cancel_one(id)?;
        }
        ids.push(id);
        Ok(Cancellation { ids, running })
    }

    /// The tasks whose TTL ran out by this transaction's time, as the
    /// deadline index says (empty when nothing tracks deadlines: see
    /// `Store::track_deadlines`), earliest first.
    pub fn due_for_expiry(&mut self) -> Vec<u64> {
        let now = self.now;
        self.inner()
            .deadlines
            .as_ref()
            .map_or_else(Vec::new, |d| d.due(now))
    }

    /// Drops task `id` from the deadline index when this transaction
    /// commits (it was due but cannot expire).
    pub fn forget_deadline(&mut self, id: u64) {
        self.stale_deadlines.push(id);
    }

    /// Expires a task that was not started within its TTL (see `ttl`):
    /// `expired`, then `moved-to-history(expired)`; a group parent first
    /// takes its children (none of which may have been dispatched). Refused
    /// (`WrongState`) for a task that cannot expire: finished, started, a
    /// group child on its own, a group that started, no TTL, or not due
    /// yet at this transaction's time. Everything is checked before
    /// anything is written. Returns the ids expired, children first.
    pub fn expire(&mut self, id: u64) -> Result<Vec<u64>, WriteError> {
        let task = self.live(id, "expire it")?.clone();
        let wrong = |state: String| WriteError::WrongState {
            id,
            state,
            op: "expire it",
        };
        if let Some(p) = task.parent {
            return Err(wrong(format!("part of group {p}")));
        }
        if !crate::ttl::may_expire(&task) {
            return Err(wrong(match (task.ttl_ms, task.status, task.attempts) {
                (None, ..) => "without a TTL".into(),
                (_, Status::Queued, n) if n > 0 => "started before".into(),
                (_, status, _) => status.as_str().into(),
            }));
        }
        if let Some(at) = crate::ttl::deadline(&task).filter(|at| *at > self.now) {
            return Err(wrong(format!(
                "not due until {}",
                crate::units::format_time(at)
            )));
        }
        let mut children = Vec::new();
        for c in task.children.iter().copied() {
            let live = match self.peek(c)? {
                Some(t) if self.is_live(c)? => {
                    let placed = self.queue_of(c).is_some();
                    Some((t, placed))
                }
                _ => None,
            };
            children.push(live);
        }
        let started =
            crate::ttl::group_started(children.iter().map(|c| c.as_ref().map(|(t, p)| (t, *p))));
        if started {
            return Err(wrong("a group that has started".into()));
        }
        let mut ids: Vec<u64> = children.iter().flatten().map(|(t, _)| t.id).collect();
        for c in ids.clone() {
            self.push_event(EventKind::Expired { id: c })?;
            self.to_history(c, Status::Expired)?;
        }
        self.push_event(EventKind::Expired { id })?;
        self.to_history(id, Status::Expired)?;
        ids.push(id);
        Ok(ids)
    }

    /// Makes room for the events and order changes of `tasks` more tasks
    /// (a batch enqueue), so that they are not grown step by step.
    pub fn reserve(&mut self, tasks: usize) {
        self.events.reserve(tasks);
        self.undo.reserve(tasks);
    }

    /// Number of events staged.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The key writes this transaction makes: for each task it changed (a
    /// dirty slot; tasks it only read are not written), a delete of its old
    /// key if it moved or was removed, and a put of the encoded task under
    /// its new key (a live task with its queue position: see `stored`).
    fn key_writes(&self) -> Vec<KeyWrite> {
        let order = &self.inner.as_ref().expect("live txn").order;
        let mut writes = Vec::with_capacity(self.slots.len());
        for (id, slot) in self.slots.iter().filter(|(_, s)| s.dirty) {
            let key_of = |home| match home {
                Home::New => None,
                Home::Live => Some(keys::id_key(TASK, *id)),
                Home::History => Some(keys::id_key(HISTORY, *id)),
            };
            let origin_key = key_of(slot.origin);
            let target_key = slot.task.as_ref().and_then(|_| key_of(slot.home));
            if let Some(k) = origin_key
                && Some(k) != target_key
            {
                writes.push(KeyWrite::remove(k.to_vec()));
            }
            if let (Some(k), Some(task)) = (target_key, &slot.task) {
                let write = match slot.home {
                    Home::Live => {
                        let position = order.position(*id);
                        KeyWrite {
                            from_event: self.enqueued_as(slot, task, position),
                            ..KeyWrite::put(k.to_vec(), stored::live_bytes(task, position))
                        }
                    }
                    _ => KeyWrite::put(k.to_vec(), stored::history_bytes(task)),
                };
                writes.push(write);
                if !task.children.is_empty() && !slot.children_kept {
                    writes.push(KeyWrite::put(
                        children::key(*id).to_vec(),
                        children::list_bytes(task),
                    ));
                }
            }
            if slot.task.is_none() && slot.had_children && origin_key.is_some() {
                writes.push(KeyWrite::remove(children::key(*id).to_vec()));
            }
        }
        for (key, value) in &self.attempt_writes {
            writes.push(KeyWrite {
                key: key.clone(),
                value: value.clone(),
                from_event: None,
            });
        }
        for (kind, c) in &self.counts {
            writes.push(KeyWrite::put(keys::counter_key(kind), codec::encode(c)));
        }
        writes
    }

    /// The event a new task's key write can name instead of carrying its
    /// value (see `commit_record`): the `Enqueued` event that added it, if
    /// the task is still as that event has it (nothing else in this
    /// transaction changed it).
    fn enqueued_as(&self, slot: &Slot, task: &Task, position: Option<i64>) -> Option<FromEvent> {
        let i = slot.enqueued.filter(|_| slot.origin == Home::New)?;
        match &self.events.get(i)?.kind {
            EventKind::Enqueued { task: added, .. } if **added == *task => Some(FromEvent {
                event: u32::try_from(i).ok()?,
                position,
            }),
            _ => None,
        }
    }

    /// Writes the transaction (atomically, see the module doc) and waits as
    /// the durability mode says.
    pub fn commit(self) -> Result<Receipt, WriteError> {
        let published = self.publish()?;
        published.wait()?;
        Ok(published.receipt)
    }

    /// Writes the transaction (atomically, see the module doc) without
    /// waiting for the disk: its changes are visible to every later read
    /// and transaction at once, and [`Published::wait`] returns once they
    /// are durable as the mode says. Nothing may act on the commit as
    /// acknowledged before then (the engine hands out the jobs it started
    /// only after the wait, and stages its next step meanwhile).
    pub fn publish(mut self) -> Result<Published<'s>, WriteError> {
        let store = self.store;
        if self.events.is_empty() {
            // Nothing changed: the views read whole are the committed state's.
            self.groups_built.clear();
            let stale = std::mem::take(&mut self.stale_deadlines);
            if let Some(d) = self.inner().deadlines.as_mut() {
                for id in stale {
                    d.forget(id);
                }
            }
            return Ok(Published {
                store,
                ticket: None,
                receipt: Receipt {
                    last_seq: 0,
                    events: 0,
                },
            });
        }
        let first_seq = self.events[0].seq;
        let mut writes = self.key_writes();
        let counting_anew = !self.counts.is_empty();
        let counting = &self.inner().counting;
        let count_since = (counting_anew && !counting.stored).then_some(counting.since);
        if let Some(since) = count_since {
            writes.push(KeyWrite::put(
                keys::META_COUNTED.to_vec(),
                codec::encode(&since),
            ));
        }
        let record = CommitRecord {
            next_id: self.next_id,
            writes,
            events: std::mem::take(&mut self.events),
        };
        // The record carries the key writes and, in its events, about as
        // much again (a task's value that names its event is carried once,
        // by the event).
        let estimate: usize = record
            .writes
            .iter()
            .map(|w| {
                let value = w.value.as_ref().map_or(0, Vec::len);
                let carried = if w.from_event.is_some() { 0 } else { value };
                w.key.len() + 16 + carried + value
            })
            .sum::<usize>()
            + 64 * record.events.len();
        let bytes = codec::encode_sized_as(&record, codec::COMMIT_VERSION, estimate)
            .map_err(|e| WriteError::Encode(e.to_string()))?;
        if bytes.len() > codec::MAX_RECORD_BYTES {
            return Err(WriteError::Budget(crate::budget::BudgetError::TooLarge {
                what: "transaction",
                size: bytes.len(),
                compressed: false,
                budget: codec::MAX_RECORD_BYTES,
            }));
        }
        if !self.reserve && record.events.iter().any(|e| e.kind.is_new_work()) {
            self.store.check_space(bytes.len())?;
        }
        // After the checks above, which a read-only store makes too: a
        // command rehearses a change on one (`cli::session`) and gets the
        // refusal the writable store would give, without opening it.
        self.store.check_writable()?;
        let events = record.events.len();
        let ticket = self
            .store
            .append(first_seq, self.next_seq, bytes, record.writes)?;
        // The warm records follow what was just written (see `warm`).
        let inner = self
            .inner
            .as_mut()
            .expect("a live transaction holds the lock");
        for (id, slot) in self.slots.iter().filter(|(_, s)| s.dirty) {
            let live = slot.task.as_ref().filter(|_| slot.home == Home::Live);
            inner.warm.written(*id, live);
        }
        self.settle_groups(record.events.iter().map(|e| e.kind.task_id()));
        // A parent that left the live tasks is not read at every step any more.
        let gone: Vec<u64> = self
            .slots
            .iter()
            .filter(|(_, s)| s.had_children && (s.task.is_none() || s.home == Home::History))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.inner().children.remove(&id);
        }
        let receipt = Receipt {
            last_seq: self.next_seq - 1,
            events,
        };
        let (next_id, next_seq) = (self.next_id, self.next_seq);
        let counts = std::mem::take(&mut self.counts);
        let stale = std::mem::take(&mut self.stale_deadlines);
        let inner = self.inner();
        inner.next_id = next_id;
        inner.next_seq = next_seq;
        inner.counting.stored |= count_since.is_some();
        inner.counting.counts.extend(counts);
        if let Some(d) = inner.deadlines.as_mut() {
            for e in &record.events {
                d.note(&e.kind);
            }
            for id in stale {
                d.forget(id);
            }
        }
        self.undo.clear();
        self.inner = None; // release the write lock before waiting for the disk
        Ok(Published {
            store,
            ticket: Some(ticket),
            receipt,
        })
    }
}

/// A transaction written but perhaps not yet durable (see [`WriteTxn::publish`]).
#[must_use = "a published commit is acknowledged only once `wait` returns"]
pub struct Published<'s> {
    store: &'s Store,
    /// The group-commit ticket (None: nothing was written).
    ticket: Option<u64>,
    pub receipt: Receipt,
}

impl Published<'_> {
    /// Returns once the commit is durable as the store's mode says.
    pub fn wait(&self) -> Result<(), WriteError> {
        match self.ticket {
            Some(t) => self.store.wait_durable(t),
            None => Ok(()),
        }
    }
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        self.forget_groups();
        if let Some(inner) = self.inner.as_mut() {
            let undo = std::mem::take(&mut self.undo);
            inner.order.rollback(undo);
            self.store.txn_dropped();
        }
    }
}
