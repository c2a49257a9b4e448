//! The store itself, differentially: `arbitrary` sequences of up to 64
//! operations against a fresh data dir and against a simple in-memory
//! model of what they should do.
//!
//! Operations: enqueue with every placement (also into an invalid queue
//! name), start, succeed (with or without a result), fail (with or without
//! a delay), requeue, update a group parent, move to the history, place a
//! waiting task (a group child being dispatched), remove (a group parent
//! takes its children), retry a dead letter, expire (every task has a TTL
//! that `Advance` runs out; a parent takes its waiting children), several of these in one
//! transaction that is committed or dropped, batches whose entries of equal
//! weight become groups, moving the clock, and reopening the data dir (which
//! recovers tasks left running; at most 3 times an input, as it is slow). Payloads and results come in every size
//! class, so some are stored compressed.
//!
//! Asserts, after every operation:
//! - the store accepts exactly what the model accepts, and refuses the rest
//!   with the error the model names (no such task, wrong state, the order's
//!   anchor errors, a bad queue name, the batch entry and field);
//! - ids are new: every id the store hands out is above every id it handed
//!   out in a committed transaction before;
//! - the store holds exactly the model's tasks, field for field, live and
//!   finished, and the model's queues in the model's order;
//! - the next event number counts every event the model expects;
//! - `verify` replays the store's log into exactly the store's state;
//! - and at the end, after reopening, all of it again.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use berth::budget::{Blob, Budget};
use berth::clock::FakeClock;
use berth::groups;
use berth::store::order::OrderError;
use berth::store::{
    Durability, INTERRUPTED, Options, Placement, Role, Store, WriteError, WriteTxn, verify,
};
use berth::submit::{self, EnqueueError};
use berth::task::{Status, Task, TaskSpec};
use serde_json::{Value, json};

const T0: u64 = 1_800_000_000_000;
const MAX_OPS: usize = 64;
const MAX_TXN_OPS: usize = 8;
/// Reopening costs most of an input's time (sled's open, the applier's
/// drain at close): past this many, a `Reopen` does nothing.
const MAX_REOPENS: usize = 3;
const MAX_BATCH: usize = 8;
const QUEUES: [&str; 3] = ["main", "parallel_queue_0", "q.x-1"];
const BAD_QUEUE: &str = "bad queue";
/// Every task's TTL: a few `Advance`s run it out.
const TTL_MS: u64 = 50_000;

fn budget() -> Budget {
    Budget {
        compress_over: 512,
        ..Budget::default()
    }
}

/// A queue name: almost always one of three valid ones.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct Q(u8);

impl Q {
    fn get(self) -> &'static str {
        if self.0 == u8::MAX {
            BAD_QUEUE
        } else {
            QUEUES[usize::from(self.0) % QUEUES.len()]
        }
    }
}

/// A task: one of those seen so far, or (one time in n + 1) an id that
/// never existed.
#[derive(Arbitrary, Debug, Clone, Copy)]
struct T(u8);

impl T {
    fn get(self, m: &Model) -> u64 {
        let i = usize::from(self.0) % (m.known.len() + 1);
        m.known
            .get(i)
            .copied()
            .unwrap_or(u64::MAX - u64::from(self.0))
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum P {
    Last,
    First,
    After(T),
    Before(T),
}

impl P {
    fn get(self, m: &Model) -> Placement {
        match self {
            P::Last => Placement::Last,
            P::First => Placement::First,
            P::After(t) => Placement::After(t.get(m)),
            P::Before(t) => Placement::Before(t.get(m)),
        }
    }
}

/// A JSON document of some size class: the large ones are compressed.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Payload {
    Null,
    Number(u16),
    Text(u8),
    Large(u8),
}

impl Payload {
    fn json(self) -> Value {
        match self {
            Payload::Null => Value::Null,
            Payload::Number(n) => json!({ "replicas": n }),
            Payload::Text(n) => json!("x".repeat(usize::from(n))),
            Payload::Large(n) => json!({
                "modules": (0..=usize::from(n) % 64 * 4)
                    .map(|i| json!({"name": format!("module-{i}"), "ok": i % 3 == 0}))
                    .collect::<Vec<_>>()
            }),
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Finish {
    Succeeded,
    Failed,
}

/// An operation inside a transaction.
#[derive(Arbitrary, Debug, Clone)]
enum TxOp {
    Enqueue {
        queue: Q,
        placement: P,
        payload: Payload,
    },
    Start(T),
    Succeed(T, Option<Payload>),
    Fail(T, Option<u16>),
    Requeue(T, Option<u16>),
    UpdateGroup(T, u8),
    ToHistory(T, Finish),
    Place(T, Q, P),
    Remove(T),
    Retry(T, P),
    /// Last, so that older seeds read as before where they can.
    Expire(T),
}

#[derive(Arbitrary, Debug, Clone)]
struct Entry {
    queue: Q,
    other_kind: bool,
    weight: Option<u8>,
    payload: Payload,
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    One(TxOp),
    Txn { ops: Vec<TxOp>, commit: bool },
    Batch(Vec<Entry>),
    Advance(u16),
    Reopen,
}

/// What the model expects a refused operation to be refused with.
#[derive(Debug, PartialEq)]
enum Want {
    NoSuchTask(u64),
    WrongState(u64),
    Order(OrderError),
    Queue,
}

fn same_error(want: &Want, got: &WriteError) -> bool {
    match (want, got) {
        (Want::NoSuchTask(a), WriteError::NoSuchTask(b)) => a == b,
        (Want::WrongState(a), WriteError::WrongState { id, .. }) => a == id,
        (Want::Order(a), WriteError::Order(b)) => a == b,
        (Want::Queue, WriteError::Queue(_)) => true,
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Home {
    Live,
    History,
}

/// What the store should hold.
#[derive(Debug, Clone)]
struct Model {
    tasks: BTreeMap<u64, (Task, Home)>,
    queues: BTreeMap<String, Vec<u64>>,
    /// Every id handed out, removed ones too, in order.
    known: Vec<u64>,
    /// The highest id handed out (in a committed transaction, outside one).
    max_id: u64,
    next_seq: u64,
    now: u64,
    /// Names tasks and messages uniquely.
    counter: u64,
}

impl Model {
    fn new() -> Self {
        Model {
            tasks: BTreeMap::new(),
            queues: BTreeMap::new(),
            known: Vec::new(),
            max_id: 0,
            next_seq: 1,
            now: T0,
            counter: 0,
        }
    }

    fn next_name(&mut self, what: &str) -> String {
        self.counter += 1;
        format!("{what}{}", self.counter)
    }

    fn queue_of(&self, id: u64) -> Option<(&str, usize)> {
        self.queues
            .iter()
            .find_map(|(q, ids)| ids.iter().position(|x| *x == id).map(|i| (q.as_str(), i)))
    }

    /// Where `id` would go in `queue`, or why it cannot (as `Order::place`).
    fn slot_for(&self, queue: &str, id: u64, p: Placement) -> Result<usize, Want> {
        if self.queue_of(id).is_some() {
            return Err(Want::Order(OrderError::AlreadyQueued(id)));
        }
        let anchor = |a: u64| match self.queue_of(a) {
            None => Err(Want::Order(OrderError::NotQueued(a))),
            Some((q, i)) if q == queue => Ok(i),
            Some((q, _)) => Err(Want::Order(OrderError::OtherQueue {
                anchor: a,
                queue: queue.to_string(),
                actual: q.to_string(),
            })),
        };
        Ok(match p {
            Placement::Last => self.queues.get(queue).map_or(0, Vec::len),
            Placement::First => 0,
            Placement::After(a) => anchor(a)? + 1,
            Placement::Before(b) => anchor(b)?,
        })
    }

    fn insert(&mut self, queue: &str, id: u64, at: usize) {
        self.queues
            .entry(queue.to_string())
            .or_default()
            .insert(at, id);
    }

    fn unqueue(&mut self, id: u64) {
        self.queues.retain(|_, ids| {
            ids.retain(|x| *x != id);
            !ids.is_empty()
        });
    }

    fn exists(&self, id: u64) -> Result<&(Task, Home), Want> {
        self.tasks.get(&id).ok_or(Want::NoSuchTask(id))
    }

    fn live(&self, id: u64) -> Result<&Task, Want> {
        match self.exists(id)? {
            (t, Home::Live) => Ok(t),
            (_, Home::History) => Err(Want::WrongState(id)),
        }
    }

    fn task_mut(&mut self, id: u64) -> &mut Task {
        &mut self.tasks.get_mut(&id).expect("checked").0
    }

    /// A new id from the store: it must be above every id before it.
    fn take_id(&mut self, id: u64) {
        assert!(
            id > self.max_id,
            "the store handed out id {id}, but {} was handed out before",
            self.max_id
        );
        self.max_id = id;
        self.known.push(id);
    }

    /// Tasks that were running when the data dir was closed, as reopening
    /// recovers them: one failure more, back to waiting, no delay; two
    /// events each (the attempt's log, `interrupted`, and the failure).
    fn recover(&mut self) -> Vec<u64> {
        let running: Vec<u64> = self
            .tasks
            .iter()
            .filter(|(_, (t, h))| *h == Home::Live && t.status == Status::Running)
            .map(|(id, _)| *id)
            .collect();
        for id in &running {
            let t = self.task_mut(*id);
            t.status = Status::Queued;
            t.failures = t.failures.saturating_add(1);
            t.last_failure = Some(INTERRUPTED.to_string());
            t.retry_at = None;
        }
        self.next_seq += 2 * running.len() as u64;
        running
    }
}

fn spec(queue: &str, kind: &str, name: String, weight: Option<i64>, payload: Payload) -> TaskSpec {
    TaskSpec {
        queue: queue.into(),
        kind: kind.into(),
        name,
        description: Some("doStartup".into()),
        weight,
        payload: payload.json(),
        tags: vec!["edge".into()],
        target: None,
        compaction_key: None,
        // Every task has the same TTL (so batches group as before), which
        // `Advance` can run out.
        ttl: Some(Duration::from_millis(TTL_MS)),
    }
}

/// Compares what the store did with what the model expects; on success
/// applies `ok` to the model. Returns the events the operation wrote.
fn expect<G: Debug>(
    what: impl Debug,
    want: Result<(), Want>,
    got: Result<G, WriteError>,
    m: &mut Model,
    events: usize,
    ok: impl FnOnce(&mut Model, G),
) -> usize {
    match (want, got) {
        (Ok(()), Ok(g)) => {
            ok(m, g);
            m.next_seq += events as u64;
            events
        }
        (Err(w), Err(e)) => {
            assert!(
                same_error(&w, &e),
                "{what:?}: the model refuses it with {w:?}, the store with {e:?} ({e})"
            );
            0
        }
        (w, g) => panic!("{what:?}: the model says {w:?}, the store {g:?}"),
    }
}

/// Runs one operation in `w` and in the model; returns the events written.
fn run_one(w: &mut WriteTxn<'_>, m: &mut Model, op: &TxOp) -> usize {
    let now = m.now;
    let b = budget();
    match *op {
        TxOp::Enqueue {
            queue,
            placement,
            payload,
        } => {
            let q = queue.get();
            let p = placement.get(m);
            let name = m.next_name("t");
            let valid = if q == BAD_QUEUE { "main" } else { q };
            let mut task = spec(valid, "ModuleRun", name, None, payload)
                .into_task(now, &b)
                .expect("a valid spec");
            task.queue = q.to_string();
            let want = if q == BAD_QUEUE {
                Err(Want::Queue)
            } else {
                m.slot_for(q, u64::MAX, p).map(|_| ())
            };
            let got = w.enqueue(task.clone(), Some(p));
            expect((op, p), want, got, m, 1, |m, id| {
                m.take_id(id);
                let at = m.slot_for(q, id, p).expect("checked");
                m.insert(q, id, at);
                task.id = id;
                m.tasks.insert(id, (task, Home::Live));
            })
        }
        TxOp::Start(t) => {
            let id = t.get(m);
            let want = m.live(id).and_then(|t| {
                (t.status == Status::Queued)
                    .then_some(())
                    .ok_or(Want::WrongState(id))
            });
            let got = w.start(id);
            expect((op, id), want, got, m, 1, |m, ()| {
                let t = m.task_mut(id);
                t.status = Status::Running;
                t.started_at = Some(now);
                t.attempts = t.attempts.saturating_add(1);
                t.retry_at = None;
            })
        }
        TxOp::Succeed(t, result) => {
            let id = t.get(m);
            let want = m.live(id).and_then(|t| {
                (t.status == Status::Running)
                    .then_some(())
                    .ok_or(Want::WrongState(id))
            });
            let blob = result.map(|r| Blob::from_json("result", &r.json(), &b).expect("fits"));
            let got = w.succeed(id, blob.clone());
            expect((op, id), want, got, m, 1, |m, ()| {
                let t = m.task_mut(id);
                t.status = Status::Succeeded;
                t.finished_at = Some(now);
                if blob.is_some() {
                    t.result = blob;
                }
            })
        }
        TxOp::Fail(t, delay) => {
            let id = t.get(m);
            let want = m.live(id).map(|_| ());
            let message = m.next_name("boom ");
            let delay = delay.map(u64::from);
            let got = w.fail(id, message.clone(), delay);
            expect((op, id), want, got, m, 1, |m, ()| {
                let t = m.task_mut(id);
                t.status = Status::Queued;
                t.failures = t.failures.saturating_add(1);
                t.last_failure = Some(message);
                t.retry_at = delay.map(|d| now + d);
            })
        }
        TxOp::Requeue(t, retry_at) => {
            let id = t.get(m);
            let want = m.live(id).map(|_| ());
            let retry_at = retry_at.map(|d| now + u64::from(d));
            let got = w.requeue(id, retry_at);
            expect((op, id), want, got, m, 1, |m, ()| {
                let t = m.task_mut(id);
                t.status = Status::Queued;
                t.retry_at = retry_at;
            })
        }
        TxOp::UpdateGroup(t, failures) => {
            let id = t.get(m);
            let want = m.live(id).map(|_| ());
            let name = m.next_name("Parallel run for g");
            let message = (failures > 0).then(|| format!("Errors:\n- a: boom {failures}"));
            let failures = u32::from(failures);
            let got = w.update_group(id, name.clone(), failures, message.clone());
            expect((op, id), want, got, m, 1, |m, ()| {
                let t = m.task_mut(id);
                t.name = name;
                t.failures = failures;
                t.last_failure = message;
            })
        }
        TxOp::ToHistory(t, finish) => {
            let id = t.get(m);
            let want = m.live(id).map(|_| ());
            let status = match finish {
                Finish::Succeeded => Status::Succeeded,
                Finish::Failed => Status::Failed,
            };
            let got = w.to_history(id, status);
            expect((op, id), want, got, m, 1, |m, ()| {
                m.unqueue(id);
                let (t, home) = m.tasks.get_mut(&id).expect("checked");
                t.status = status;
                t.retry_at = None;
                t.finished_at.get_or_insert(now);
                *home = Home::History;
            })
        }
        TxOp::Place(t, queue, placement) => {
            let id = t.get(m);
            let q = queue.get();
            let p = placement.get(m);
            let want = if q == BAD_QUEUE {
                Err(Want::Queue)
            } else {
                m.live(id).and_then(|_| m.slot_for(q, id, p)).map(|_| ())
            };
            let got = w.place(id, q, p);
            expect((op, id, p), want, got, m, 1, |m, ()| {
                let at = m.slot_for(q, id, p).expect("checked");
                m.insert(q, id, at);
                m.task_mut(id).queue = q.to_string();
            })
        }
        TxOp::Remove(t) => {
            let id = t.get(m);
            let want = m.exists(id).and_then(|(t, _)| match t.parent {
                Some(p) if m.tasks.contains_key(&p) => Err(Want::WrongState(id)),
                _ => Ok(()),
            });
            let removed: Vec<u64> = match m.tasks.get(&id) {
                Some((t, _)) => t
                    .children
                    .iter()
                    .copied()
                    .filter(|c| m.tasks.contains_key(c))
                    .chain([id])
                    .collect(),
                None => Vec::new(),
            };
            let got = w.remove(id);
            let events = removed.len();
            expect((op, id), want, got, m, events, |m, got| {
                assert_eq!(got, removed, "remove({id}) removed other tasks");
                for r in removed {
                    m.unqueue(r);
                    m.tasks.remove(&r);
                }
            })
        }
        TxOp::Expire(t) => {
            let id = t.get(m);
            // The rule of `ttl`: live, queued, never started, not a group
            // child, due; a parent takes its live children, none of which
            // may have been placed, started or finished.
            let want = m.live(id).and_then(|t| {
                let due = t.ttl_ms.is_some_and(|ttl| t.queued_at + ttl <= now);
                let fresh = t.status == Status::Queued && t.attempts == 0;
                if t.parent.is_some() || !fresh || !due {
                    return Err(Want::WrongState(id));
                }
                let started = t.children.iter().any(|c| match m.tasks.get(c) {
                    Some((ct, Home::Live)) => {
                        m.queue_of(*c).is_some() || ct.attempts > 0 || ct.status != Status::Queued
                    }
                    _ => true,
                });
                if started {
                    return Err(Want::WrongState(id));
                }
                Ok(())
            });
            let expired: Vec<u64> = match m.tasks.get(&id) {
                Some((t, _)) => t
                    .children
                    .iter()
                    .copied()
                    .filter(|c| matches!(m.tasks.get(c), Some((_, Home::Live))))
                    .chain([id])
                    .collect(),
                None => Vec::new(),
            };
            let got = w.expire(id);
            let events = 2 * expired.len();
            expect((op, id), want, got, m, events, |m, got| {
                assert_eq!(got, expired, "expire({id}) expired other tasks");
                for e in expired {
                    m.unqueue(e);
                    let (t, home) = m.tasks.get_mut(&e).expect("checked");
                    t.status = Status::Expired;
                    t.retry_at = None;
                    t.finished_at = Some(now);
                    *home = Home::History;
                }
            })
        }
        TxOp::Retry(t, placement) => {
            let id = t.get(m);
            let p = placement.get(m);
            let want = m.exists(id).and_then(|(t, home)| {
                if *home != Home::History
                    || t.status != Status::Failed
                    || t.parent.is_some()
                    || !t.children.is_empty()
                {
                    return Err(Want::WrongState(id));
                }
                m.slot_for(&t.queue, id, p).map(|_| ())
            });
            let got = w.retry(id, p);
            expect((op, id, p), want, got, m, 1, |m, ()| {
                let queue = m.tasks[&id].0.queue.clone();
                let at = m.slot_for(&queue, id, p).expect("checked");
                m.insert(&queue, id, at);
                let (t, home) = m.tasks.get_mut(&id).expect("checked");
                t.status = Status::Queued;
                t.failures = 0;
                t.retry_at = None;
                t.finished_at = None;
                // Queued anew (`RetriedAnew`).
                t.queued_at = now;
                t.started_at = None;
                *home = Home::Live;
            })
        }
    }
}

/// A batch through `submit::enqueue_batch`, and what the model expects of
/// it: sorted by weight, runs of equal weight in one queue become a parent
/// with its children waiting, all in one commit or not at all.
fn run_batch(store: &Store, m: &mut Model, entries: &[Entry]) {
    let b = budget();
    let specs: Vec<TaskSpec> = entries
        .iter()
        .take(MAX_BATCH)
        .map(|e| {
            let name = m.next_name("b");
            let kind = if e.other_kind { "HookRun" } else { "ModuleRun" };
            spec(
                e.queue.get(),
                kind,
                name,
                e.weight.map(|w| i64::from(w % 3)),
                e.payload,
            )
        })
        .collect();
    let got = submit::enqueue_batch(store, specs.clone());
    if let Some(bad) = specs.iter().position(|s| s.queue == BAD_QUEUE) {
        match got {
            Err(EnqueueError::Invalid {
                entry: Some(i),
                field: "queue",
                ..
            }) if i.index == bad => return,
            other => panic!("a batch whose entry {bad} has a bad queue: {other:?}"),
        }
    }
    let ids = match got {
        Ok(ids) => ids,
        Err(e) => panic!("a valid batch was refused: {e}"),
    };
    // The plan: a stable sort by weight, then runs of equal weight and queue.
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].weight.unwrap_or(0));
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for i in order {
        let joins = runs.last().is_some_and(|run| {
            let last = &specs[*run.last().expect("runs are not empty")];
            specs[i].weight.is_some()
                && last.weight == specs[i].weight
                && last.queue == specs[i].queue
        });
        match runs.last_mut() {
            Some(run) if joins => run.push(i),
            _ => runs.push(vec![i]),
        }
    }
    assert_eq!(ids.len(), runs.len(), "one id per single task and group");
    let Some(&base) = ids.first() else {
        return;
    };
    let now = m.now;
    let mut next = base;
    let mut expected = Vec::new();
    for run in &runs {
        expected.push(next);
        let build = |s: &TaskSpec| s.clone().into_task(now, &b).expect("a valid spec");
        if let [single] = run[..] {
            let mut t = build(&specs[single]);
            t.id = next;
            m.take_id(next);
            m.insert(
                &t.queue.clone(),
                next,
                m.queues.get(&t.queue).map_or(0, Vec::len),
            );
            m.tasks.insert(next, (t, Home::Live));
            next += 1;
            m.next_seq += 1;
            continue;
        }
        let children: Vec<TaskSpec> = run.iter().map(|&i| specs[i].clone()).collect();
        let mut parent = build(&groups::parent_spec(&children));
        parent.id = next;
        m.take_id(next);
        let mut child_ids = Vec::with_capacity(children.len());
        for (k, c) in children.iter().enumerate() {
            let mut t = build(c);
            t.id = next + 1 + k as u64;
            t.parent = Some(parent.id);
            child_ids.push(t.id);
            m.take_id(t.id);
            m.tasks.insert(t.id, (t, Home::Live));
        }
        parent.children = child_ids.into();
        let q = parent.queue.clone();
        m.insert(&q, parent.id, m.queues.get(&q).map_or(0, Vec::len));
        m.tasks.insert(parent.id, (parent, Home::Live));
        m.next_seq += children.len() as u64 + 1;
        next += children.len() as u64 + 1;
    }
    assert_eq!(ids, expected, "the batch's ids, in queue order");
}

/// The store holds exactly the model, and its log agrees with its state.
fn check(store: &Store, m: &Model, step: &str) {
    let read = |v: Vec<Result<Task, berth::store::CorruptRecord>>| -> Vec<Task> {
        v.into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("{step}: a corrupt record: {e}")))
            .collect()
    };
    let want = |home: Home| -> Vec<Task> {
        m.tasks
            .values()
            .filter(|(_, h)| *h == home)
            .map(|(t, _)| t.clone())
            .collect()
    };
    assert_eq!(
        read(store.live_tasks()),
        want(Home::Live),
        "{step}: live tasks"
    );
    assert_eq!(
        read(store.history()),
        want(Home::History),
        "{step}: finished tasks"
    );
    for id in &m.known {
        let got = store.task(*id).expect("readable");
        let expected = m.tasks.get(id);
        assert_eq!(got.as_ref(), expected.map(|(t, _)| t), "{step}: task {id}");
        let live = store.live_task(*id).expect("readable").is_some();
        assert_eq!(
            live,
            matches!(expected, Some((_, Home::Live))),
            "{step}: task {id} live"
        );
        let queued = m.queue_of(*id).map(|(q, _)| q.to_string());
        assert_eq!(
            store.queue_of(*id),
            queued,
            "{step}: the queue of task {id}"
        );
    }
    let queues: Vec<(String, usize)> = m.queues.iter().map(|(q, v)| (q.clone(), v.len())).collect();
    assert_eq!(store.queues(), queues, "{step}: queues");
    for (q, ids) in &m.queues {
        assert_eq!(store.queue_ids(q), *ids, "{step}: queue '{q}'");
        assert_eq!(store.head(q), ids.first().copied(), "{step}: head of '{q}'");
    }
    assert_eq!(
        store.queued_total(),
        m.queues.values().map(Vec::len).sum::<usize>(),
        "{step}: tasks in queues"
    );
    assert_eq!(store.next_seq(), m.next_seq, "{step}: next event number");
    let diffs =
        verify::verify(store).unwrap_or_else(|e| panic!("{step}: the log does not replay: {e}"));
    assert!(
        diffs.is_empty(),
        "{step}: the log and the state disagree: {diffs:#?}"
    );
    assert!(
        store.corrupt_records().is_empty(),
        "{step}: corrupt records"
    );
}

fn open(dir: &Path, clock: &FakeClock) -> Store {
    let opts = Options {
        // Batched with a long interval: no flush per commit. Closing
        // flushes, so reopening sees everything.
        durability: Durability::Batched {
            interval: Duration::from_secs(3600),
        },
        budget: budget(),
        role: Role::Command,
        wait_for_lock: Duration::ZERO,
        create: true,
        cache_bytes: 1 << 20,
        power_safe: false,
        write_ahead_log: false,
        sled_flush_every: Duration::from_secs(3600),
        read_only: false,
        disk_reserve: 0,
    };
    Store::open(dir, opts, Arc::new(clock.clone())).unwrap_or_else(|e| panic!("open: {e}"))
}

pub fn store_ops(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut ops: Vec<Op> = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        match Op::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    if ops.is_empty() {
        return;
    }
    let dir = super::temp_dir("berth-fuzz-store-");
    let clock = FakeClock::new(T0);
    let mut store = open(dir.path(), &clock);
    let mut m = Model::new();
    check(&store, &m, "open");
    let mut reopens = 0;
    for (n, op) in ops.iter().enumerate() {
        let step = format!("step {n} ({op:?})");
        match op {
            Op::One(op) => {
                let mut w = store.write();
                let mut mt = m.clone();
                let events = run_one(&mut w, &mut mt, op);
                let receipt = w.commit().unwrap_or_else(|e| panic!("{step}: commit: {e}"));
                assert_eq!(receipt.events, events, "{step}: events committed");
                m = mt;
            }
            Op::Txn { ops, commit } => {
                let mut w = store.write();
                let mut mt = m.clone();
                let mut events = 0;
                for op in ops.iter().take(MAX_TXN_OPS) {
                    events += run_one(&mut w, &mut mt, op);
                }
                if *commit {
                    let receipt = w.commit().unwrap_or_else(|e| panic!("{step}: commit: {e}"));
                    assert_eq!(receipt.events, events, "{step}: events committed");
                    m = mt;
                } else {
                    // Dropped: nothing of it happened (its ids may come again).
                    drop(w);
                    m.counter = mt.counter;
                }
            }
            Op::Batch(entries) => run_batch(&store, &mut m, entries),
            Op::Advance(ms) => {
                clock.advance_ms(u64::from(*ms));
                m.now += u64::from(*ms);
            }
            Op::Reopen if reopens == MAX_REOPENS => {}
            Op::Reopen => {
                reopens += 1;
                drop(store);
                store = open(dir.path(), &clock);
                let recovered = m.recover();
                assert_eq!(store.recovered(), &recovered[..], "{step}: recovered tasks");
            }
        }
        check(&store, &m, &step);
    }
    drop(store);
    let store = open(dir.path(), &clock);
    let recovered = m.recover();
    assert_eq!(
        store.recovered(),
        &recovered[..],
        "the final reopen: recovered tasks"
    );
    check(&store, &m, "the final reopen");
}
