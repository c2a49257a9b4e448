//! The scheduler: the one owner of "what runs where". Each step
//! (`Engine::step`, the single writer) applies the completions that came
//! back from the pool and starts every queue's head that is ready, all in
//! one store transaction, so several completions and starts share one
//! atomic write and one flush. Nothing is handed to the pool before the
//! write that records its start is durable.
//!
//! Invariants kept here: a queue runs at most its head task (its first task
//! for this node: tasks for other nodes keep their places and are passed
//! over, see `routing`); at most `workers` attempts run at once, an attempt
//! starting only for a free worker, and ready queues take free workers in
//! turn; a failed head stays at the head until its retry time; a repeating head starts at most
//! once per `REPEAT_INTERVAL`; a group parent's queue waits for
//! every child; a finished task leaves its queue in the same write that
//! records how it finished.
//!
//! This file holds what the scheduler keeps per queue and what it exchanges
//! with the engine and the workers. Its work is split by role:
//!
//! - `dispatch.rs`: the queue state machine: which heads start (and group
//!   dispatch), sleeps and wake-ups, live statuses;
//! - `complete.rs`: an attempt's outcome to store events (its log, then
//!   success, failure (backoff, dead letter), repeat, keep, follow-ups,
//!   group parent updates);
//! - `cancel.rs`: `berth task cancel`: what ends at once, what is stopped
//!   first, and the answers;
//! - `stop.rs`: a stop whose grace period ran out: the attempts still
//!   running stopped at once and recorded `interrupted`;
//! - `attempt.rs`: the worker side of one attempt;
//! - `live.rs`: the attempts running now (output so far, cancel signal).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Sender;

use crate::budget::Budget;
use crate::engine::EngineConfig;
use crate::engine::handler::{Handlers, Outcome};
use crate::engine::live::{Captured, LiveAttempts};
use crate::engine::status::QueueActivity;
use crate::routing::Node;
use crate::store::WriteError;

/// The target of every line the scheduler logs, whichever of its files logs
/// it (`berth::engine::scheduler`), so log lines and `RUST_LOG` filters do
/// not depend on the file layout.
pub(super) const LOG_TARGET: &str = module_path!();

/// How the engine's log lines name a task: `task 7 Sh build in main`.
pub(super) struct Named<'a>(pub &'a crate::task::Task);

impl std::fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.0;
        write!(f, "task {} {} {} in {}", t.id, t.kind, t.name, t.queue)
    }
}

/// A finished attempt, sent back from a worker.
#[derive(Debug)]
pub struct Completion {
    pub id: u64,
    pub queue: String,
    pub outcome: Outcome,
    /// When its handler began, on the store's clock (a worker took the
    /// job); None if it never ran (cancelled first).
    pub began_at: Option<u64>,
    pub duration_ms: u64,
    /// What the attempt printed, and how its last process ended.
    pub output: Box<Captured>,
}

/// What `berth task cancel` gets back: the ids cancelled (children first),
/// once that is durable.
pub type CancelReply = crossbeam_channel::Sender<Result<Vec<u64>, WriteError>>;

/// A request to cancel a task, answered on `reply`.
#[derive(Debug)]
pub struct CancelRequest {
    pub id: u64,
    pub reply: CancelReply,
}

/// Messages to the scheduler.
#[derive(Debug)]
pub enum Msg {
    Done(Completion),
    Wake,
    Cancel(CancelRequest),
}

/// Cancels under way: running tasks whose handlers were asked to stop, and
/// what waits for them.
#[derive(Debug, Default)]
pub(super) struct Cancels {
    /// Running tasks asked to stop: they end `cancelled` when they return.
    pub(super) stopping: BTreeSet<u64>,
    /// Group parents that end `cancelled` once no child is live.
    pub(super) groups: BTreeSet<u64>,
    /// Requests answered once their task has left the live tasks: (the
    /// task, the ids to report, the reply).
    pub(super) waiting: Vec<(u64, Vec<u64>, CancelReply)>,
}

/// A queue's head that started (or a group parent whose children run).
#[derive(Debug)]
pub(super) struct Running {
    pub(super) id: u64,
    pub(super) since: u64,
    /// Set by the worker when it picks the job up, or by a cancel that
    /// takes the job back before any worker did (`cancel.rs`).
    pub(super) picked: Arc<AtomicBool>,
    /// A group parent waiting for its children (no job in the pool).
    pub(super) group: bool,
    /// Started again because it asked to repeat.
    pub(super) repeat: bool,
    /// Asked to stop (`berth task cancel`); for a group parent, its group.
    pub(super) cancel: bool,
}

/// What the scheduler knows of one queue between steps.
#[derive(Debug, Default)]
pub(super) struct QueueState {
    pub(super) running: Option<Running>,
    /// Do not start anything before this time.
    pub(super) sleep_until: u64,
    /// The head the sleep is for (its backoff, a `keep`'s delay, a
    /// repeat's throttle), None for the queue's own (a handler's delay
    /// after a success): a task put ahead of that head does not wait.
    pub(super) sleep_for: Option<u64>,
    pub(super) activity_after: Option<QueueActivity>,
}

/// A queue's activity as of the last step, plus the pickup flag of a job
/// waiting for a worker.
#[derive(Debug, Clone)]
pub struct LiveActivity {
    pub activity: QueueActivity,
    pub picked: Option<Arc<AtomicBool>>,
}

impl LiveActivity {
    /// The activity now.
    pub fn current(&self) -> QueueActivity {
        match &self.picked {
            Some(p) if p.load(Ordering::SeqCst) => QueueActivity::Running,
            _ => self.activity.clone(),
        }
    }
}

/// Counts of how tasks ended, for `--until-idle` and metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub succeeded: u64,
    pub failed_attempts: u64,
    pub dead_letters: u64,
    /// Attempts a stop interrupted at the end of its grace period and
    /// recorded (`engine/stop.rs`).
    pub interrupted: u64,
}

pub struct Scheduler {
    pub(super) queues: BTreeMap<String, QueueState>,
    pub(super) in_flight: usize,
    pub tally: Tally,
    /// The attempts running now (shared with the engine's readers).
    pub(super) live: Arc<LiveAttempts>,
    pub(super) cancels: Cancels,
    /// This node (see `routing`).
    pub(super) node: Node,
    /// Tasks found not to be for this node: skipped without reading them
    /// again (a task's target and tags never change). Ids are never reused,
    /// so an id that left its queue is only a stale entry.
    pub(super) elsewhere: HashSet<u64>,
    /// Group parents whose children changed in this step, and how many of
    /// those changes were failed attempts: each parent is updated once per
    /// step (`settle_parents`), not once per child.
    pub(super) parents_due: BTreeMap<u64, u32>,
    /// Groups whose children are being placed, a chunk per step (see
    /// `dispatch::PLACE_PER_STEP`): parent id -> where in its children
    /// list the next step goes on. Put back when a step fails
    /// (`placing_after_failure`), so no child is passed over.
    pub(super) placing: BTreeMap<u64, usize>,
    /// Running tasks a stop whose grace period ran out asked to stop at
    /// once (`stop.rs`): they end `interrupted` when they return.
    pub(super) stopped_at_grace: BTreeSet<u64>,
    /// The queue that last started an attempt: the next step offers free
    /// workers to the queues after it first (`dispatch.rs` `in_turn`).
    pub(super) last_started: Option<String>,
}

/// What the scheduler needs from the engine for one step.
pub struct StepEnv<'a> {
    pub config: &'a EngineConfig,
    pub handlers: &'a Arc<Handlers>,
    pub budget: &'a Budget,
    pub tx: &'a Sender<Msg>,
    /// Where a job's completion is announced (by the launcher, and renewed
    /// by the worker as the job ends), so that a flush about to begin waits
    /// for the step that records it (`GroupCommit::coming`).
    pub commits: &'a Arc<crate::store::durability::GroupCommit>,
    /// The store's clock: a worker reads it when it takes a job.
    pub clock: &'a crate::clock::SharedClock,
}

impl Scheduler {
    /// A scheduler for a node without a name or tags: it runs only tasks
    /// without a target or tags.
    pub fn new() -> Self {
        Scheduler::for_node(Node::default())
    }

    /// A scheduler that runs the tasks meant for `node`.
    pub fn for_node(node: Node) -> Self {
        Scheduler {
            queues: BTreeMap::new(),
            in_flight: 0,
            tally: Tally::default(),
            live: Arc::new(LiveAttempts::default()),
            cancels: Cancels::default(),
            node,
            elsewhere: HashSet::new(),
            parents_due: BTreeMap::new(),
            placing: BTreeMap::new(),
            stopped_at_grace: BTreeSet::new(),
            last_started: None,
        }
    }

    /// The attempts running now, for readers outside the loop.
    pub fn live(&self) -> Arc<LiveAttempts> {
        self.live.clone()
    }

    /// The tasks found not to be for this node (some may have left their
    /// queues since).
    pub fn elsewhere(&self) -> &HashSet<u64> {
        &self.elsewhere
    }

    /// The tasks running now in a job of their own (not group parents).
    pub fn running_jobs(&self) -> impl Iterator<Item = u64> + '_ {
        self.queues
            .values()
            .filter_map(|q| q.running.as_ref())
            .filter(|r| !r.group)
            .map(|r| r.id)
    }

    /// Jobs handed to the pool and not yet back.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub(super) fn queue(&mut self, name: &str) -> &mut QueueState {
        self.queues.entry(name.to_string()).or_default()
    }
}

impl Default for Scheduler {
    fn default() -> Self {
        Self::new()
    }
}
