//! The engine: runs the store's queues on a worker pool.
//!
//! One scheduler loop (the thread that calls [`Engine::run`]) owns queue
//! state; a [`Pool`] of workers runs handlers; workers report back over a
//! channel. Library users enqueue through the engine, which wakes the loop.
//! See `scheduler` for the per-step logic and its invariants.

mod attempt;
mod cancel;
pub mod command;
mod complete;
mod dispatch;
mod expire;
pub mod handler;
pub mod live;
pub mod pool;
pub mod result_file;
pub mod scheduler;
pub mod status;
pub mod stop;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::backoff::Backoff;
use crate::report::{self, QueueView};
use crate::store::{Placement, SpaceError, Store, WriteError};
use crate::submit::{self, EnqueueError};
use crate::task::TaskSpec;

pub use dispatch::PLACE_PER_STEP;
pub use handler::{
    FollowUp, FollowUpAt, Handler, Handlers, Outcome, REPEAT_INTERVAL, RunResult, TaskContext,
};
pub use live::{LiveAttempt, LiveAttempts};
pub use pool::Pool;
pub use scheduler::Tally;
use scheduler::{CancelRequest, Msg, Scheduler, StepEnv};
use status::QueueActivity;

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// `parallel_queue_0 .. parallel_queue_{N-1}`.
    pub parallel_queues: usize,
    /// Worker threads; 0 means `parallel_queues + 2`.
    pub workers: usize,
    pub backoff: Backoff,
    /// How long a `Keep` result waits when its handler gives no delay.
    pub keep_delay: Duration,
    /// How long a stop waits for running handlers.
    pub grace: Duration,
    /// This node's name, handed to handlers; with `tags`, it decides which
    /// tasks run here (see `routing`).
    pub node: Option<String>,
    /// This node's tags: a task runs here only if all of its tags are.
    pub tags: Vec<String>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            parallel_queues: crate::queues::DEFAULT_PARALLEL_QUEUES,
            workers: 0,
            backoff: Backoff::default(),
            keep_delay: Duration::from_secs(5),
            grace: Duration::from_secs(30),
            node: None,
            tags: Vec::new(),
        }
    }
}

impl EngineConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.parallel_queues == 0 || self.parallel_queues > 1000 {
            return Err("parallel_queues must be between 1 and 1000".into());
        }
        if self.workers > 4096 {
            return Err("workers must be at most 4096".into());
        }
        if self.backoff.initial > self.backoff.max {
            return Err("retry.initial must not be larger than retry.max".into());
        }
        Ok(())
    }

    /// This node as routing sees it.
    pub fn routing(&self) -> crate::routing::Node {
        crate::routing::Node {
            name: self.node.clone(),
            tags: self.tags.clone(),
        }
    }

    pub fn worker_count(&self) -> usize {
        if self.workers == 0 {
            self.parallel_queues + 2
        } else {
            self.workers
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    pub tally: Tally,
    /// Handlers still running when the grace period ran out.
    pub abandoned: usize,
    /// Tasks left in queues that cannot start (a corrupt head, say) when a
    /// run until idle gave up on them.
    pub stuck: usize,
}

/// A handle that asks a running engine to stop.
#[derive(Clone)]
pub struct StopHandle {
    flag: Arc<AtomicBool>,
    tx: Sender<Msg>,
}

impl StopHandle {
    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = self.tx.send(Msg::Wake);
    }
    /// The flag itself, for signal handlers (which cannot send).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }
}

pub struct Engine {
    store: Arc<Store>,
    handlers: Arc<Handlers>,
    config: EngineConfig,
    pool: Pool,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    /// The store's group commit, where workers announce their completions.
    commits: Arc<crate::store::durability::GroupCommit>,
    stop: Arc<AtomicBool>,
    sched: Mutex<Scheduler>,
    /// The latest queue activities, published by the loop for `queue list`.
    view: Mutex<View>,
    /// The attempts running now (the scheduler's registry).
    live: Arc<LiveAttempts>,
}

/// Why [`Engine::cancel`] has no answer.
#[derive(Debug, thiserror::Error)]
pub enum CancelError {
    #[error(transparent)]
    Store(#[from] WriteError),
    #[error("the daemon stopped before task {0} was cancelled")]
    Stopped(u64),
    #[error(
        "task {id} is being cancelled, but its handler has not returned within {}; it ends \
         cancelled when it does",
        crate::units::format_duration(*waited)
    )]
    TimedOut { id: u64, waited: Duration },
}

/// What the loop received since its last step.
#[derive(Debug, Default)]
struct Inbox {
    done: Vec<scheduler::Completion>,
    cancels: Vec<CancelRequest>,
}

/// The most output tails a step's commit carries before the step commits
/// what it has and goes on in a new transaction (a commit record must stay
/// under `MAX_RECORD_BYTES` however many attempts end at once).
const STEP_LOG_BYTES: usize = 16 << 20;

/// What a step hands out once its commit is durable: the jobs it started
/// and the answers to cancel requests (see [`Engine::launch`]).
struct Launch<'s> {
    published: crate::store::Published<'s>,
    jobs: Vec<pool::Job>,
    answers: Vec<cancel::Answer>,
}

/// How long a cancel waits for a running handler to return.
const CANCEL_WAIT: Duration = Duration::from_secs(20);

/// What the loop last published for `queue list` and the metrics.
#[derive(Debug, Default, Clone)]
struct View {
    activities: BTreeMap<String, scheduler::LiveActivity>,
    stopping: bool,
    /// Starts are paused because disk space is below the reserve.
    paused: Option<SpaceError>,
    live: Live,
}

/// What a running engine alone knows, for the metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    /// When the engine was made (ms since the epoch, from its clock).
    pub started_ms: u64,
    /// Steps written (each is one store commit, maybe of no events).
    pub steps: u64,
    /// When the last step was written.
    pub last_step_ms: Option<u64>,
    /// When the loop last went round (every 100 ms at most while it runs).
    pub heartbeat: Option<Instant>,
    /// Handler attempts running now.
    pub in_flight: usize,
    /// The loop is running (it has started and not ended).
    pub running: bool,
}

/// The longest the loop sleeps without looking at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Where each group's placement goes on after a step that failed: its
/// placements were dropped with its transaction, so every group goes on
/// from where it was before the step, and a group whose dispatch began in
/// it from its first child (going over placed children again is harmless:
/// `place_children` passes over them).
fn placing_after_failure(
    before: BTreeMap<u64, usize>,
    after: &BTreeMap<u64, usize>,
) -> BTreeMap<u64, usize> {
    let mut back = before;
    for &parent in after.keys() {
        back.entry(parent).or_insert(0);
    }
    back
}

impl Engine {
    pub fn new(
        store: Arc<Store>,
        handlers: Handlers,
        config: EngineConfig,
    ) -> Result<Engine, String> {
        config.validate()?;
        let pool = Pool::new(config.worker_count(), "berth-worker")
            .map_err(|e| format!("starting {} worker threads: {e}", config.worker_count()))?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let sched = Scheduler::for_node(config.routing());
        let live = sched.live();
        let started_ms = store.clock().now_ms();
        let commits = store.group_commit();
        Ok(Engine {
            store,
            commits,
            handlers: Arc::new(handlers),
            config,
            pool,
            tx,
            rx,
            stop: Arc::new(AtomicBool::new(false)),
            sched: Mutex::new(sched),
            view: Mutex::new(View {
                live: Live {
                    started_ms,
                    ..Live::default()
                },
                ..View::default()
            }),
            live,
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The kinds this engine has a handler for, sorted.
    pub fn kinds(&self) -> Vec<String> {
        self.handlers.kinds()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            flag: self.stop.clone(),
            tx: self.tx.clone(),
        }
    }

    /// Adds one task and wakes the loop.
    pub fn enqueue(&self, spec: TaskSpec, placement: Placement) -> Result<u64, EnqueueError> {
        let id = submit::enqueue_one(&self.store, spec, placement)?;
        let _ = self.tx.send(Msg::Wake);
        Ok(id)
    }

    /// Adds a batch (ordered by weight, same-weight runs grouped), all or nothing.
    pub fn enqueue_batch(&self, specs: Vec<TaskSpec>) -> Result<Vec<u64>, EnqueueError> {
        let ids = submit::enqueue_batch(&self.store, specs)?;
        let _ = self.tx.send(Msg::Wake);
        Ok(ids)
    }

    /// Wakes the loop (after a change made directly in the store).
    pub fn wake(&self) {
        let _ = self.tx.send(Msg::Wake);
    }

    /// Cancels task `id` (see `cancel.rs`): at once if nothing runs it,
    /// else once its handler (or, for a group, every running child's) has
    /// been stopped and has returned. Returns the ids cancelled, children
    /// first, once that is durable. Waits at most 20 s (`CANCEL_WAIT`).
    pub fn cancel(&self, id: u64) -> Result<Vec<u64>, CancelError> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.tx
            .send(Msg::Cancel(CancelRequest { id, reply }))
            .map_err(|_| CancelError::Stopped(id))?;
        match answer.recv_timeout(CANCEL_WAIT) {
            Ok(r) => Ok(r?),
            Err(RecvTimeoutError::Timeout) => Err(CancelError::TimedOut {
                id,
                waited: CANCEL_WAIT,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(CancelError::Stopped(id)),
        }
    }

    /// The attempt of task `id` running now, if one does.
    pub fn live_attempt(&self, id: u64) -> Option<Arc<LiveAttempt>> {
        self.live.get(id)
    }

    /// The queue set with live statuses, every task listed.
    pub fn queue_views(&self) -> Vec<QueueView> {
        self.queue_views_limited(usize::MAX)
    }

    /// The queue set with live statuses, each queue listing at most `limit` tasks.
    pub fn queue_views_limited(&self, limit: usize) -> Vec<QueueView> {
        let now = self.store.clock().now_ms();
        let view = self.view.lock().unwrap_or_else(|p| p.into_inner()).clone();
        report::snapshot(&self.store, self.config.parallel_queues, limit, &|q| {
            if self.store.queue_len(q) == 0 {
                return String::new();
            }
            if view.stopping {
                return status::render(&QueueActivity::Stop, now);
            }
            let current = view
                .activities
                .get(q)
                .map_or(QueueActivity::Idle, |a| a.current());
            match (&view.paused, current) {
                (Some(low), QueueActivity::Idle) => status::render(
                    &QueueActivity::Paused {
                        free: low.free,
                        reserve: low.reserve,
                    },
                    now,
                ),
                (_, current) => status::render(&current, now),
            }
        })
    }

    /// Publishes the queues' activities after a step written at `now`.
    fn publish(&self, sched: &Scheduler, stopping: bool, paused: Option<SpaceError>) {
        let now = self.store.clock().now_ms();
        let activities = sched.activities(now);
        let mut view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        let live = Live {
            steps: view.live.steps + 1,
            last_step_ms: Some(now),
            heartbeat: Some(Instant::now()),
            in_flight: sched.in_flight(),
            running: true,
            ..view.live
        };
        *view = View {
            activities,
            stopping,
            paused,
            live,
        };
    }

    /// What the running engine alone knows (for the metrics).
    pub fn live(&self) -> Live {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).live
    }

    fn ended(&self) {
        let mut view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        view.live.running = false;
        view.live.in_flight = 0;
    }

    fn env(&self) -> StepEnv<'_> {
        StepEnv {
            config: &self.config,
            handlers: &self.handlers,
            budget: self.store.budget(),
            tx: &self.tx,
            commits: &self.commits,
            clock: self.store.clock(),
        }
    }

    /// One step: apply completions and cancel requests, expire the tasks
    /// whose TTL ran out (see `expire.rs`), start ready heads, in one write (several when the attempts' logs are large: see
    /// [`STEP_LOG_BYTES`]). Cancel requests are answered once the write
    /// that ended their task is durable.
    fn step(
        &self,
        sched: &mut Scheduler,
        inbox: Inbox,
        dispatch: bool,
    ) -> Result<(usize, Launch<'_>), WriteError> {
        let env = self.env();
        // Left only by a step whose transaction failed: its changes were
        // dropped, so are the parents it was to update.
        sched.parents_due.clear();
        let mut progress = inbox.done.len() + inbox.cancels.len();
        let mut arriving = inbox.done.len();
        let mut done = inbox.done.into_iter().peekable();
        let mut answers = Vec::new();
        loop {
            let mut w = self.store.write();
            // The completions announced by their workers have begun their
            // transaction: this one.
            self.commits.arrived(std::mem::take(&mut arriving));
            // Completions (and the follow-ups they add) record work already
            // under way: they may use the disk reserve.
            w.use_reserve();
            let mut bytes = 0;
            while let Some(c) =
                done.next_if(|c| bytes == 0 || bytes + c.output.log_bytes() <= STEP_LOG_BYTES)
            {
                bytes += c.output.log_bytes();
                sched.complete(&mut w, &env, c)?;
            }
            sched.settle_parents(&mut w)?;
            if done.peek().is_some() {
                answers.extend(sched.answered_cancels(&mut w));
                w.commit()?;
                continue;
            }
            for r in inbox.cancels {
                answers.extend(sched.request_cancel(&mut w, &env, r)?);
            }
            // The parents of the children a cancel ended at once.
            sched.settle_parents(&mut w)?;
            // Before any head starts: a task past its TTL never starts.
            progress += sched.expire_due(&mut w)?;
            let jobs = if dispatch {
                sched.dispatch(&mut w, &env)?
            } else {
                Vec::new()
            };
            answers.extend(sched.answered_cancels(&mut w));
            let published = w.publish()?;
            progress += jobs.len();
            return Ok((
                progress,
                Launch {
                    published,
                    jobs,
                    answers,
                },
            ));
        }
    }

    /// The launcher's side of a step (on its own thread, in step order):
    /// once the step's commit is durable, its cancel requests are answered
    /// and its jobs go to the pool, so no handler runs before its start is
    /// durable. Meanwhile the loop stages the next step: its commit joins
    /// the next flush (pipelining). If the commit cannot be made durable the
    /// store has failed: nothing starts, and the loop ends with the failure.
    fn launch(&self, l: Launch<'_>) {
        match l.published.wait() {
            Ok(()) => {
                for (reply, answer) in l.answers {
                    let _ = reply.send(answer);
                }
                // Their completions are announced now: the flush this
                // thread leads next waits (briefly) for the quick ones, so
                // queues released together finish and start again in one
                // flush instead of alternating between two.
                self.commits.coming(l.jobs.len());
                self.pool.submit_all(l.jobs);
            }
            Err(e) => {
                log::error!(
                    "a step's commit did not reach the disk ({e}); its {} task(s) do not start",
                    l.jobs.len()
                );
                for (reply, _) in l.answers {
                    let _ = reply.send(Err(WriteError::Failed(e.to_string())));
                }
            }
        }
    }

    fn collect(&self, first: Msg, inbox: &mut Inbox) {
        let mut push = |m: Msg| match m {
            Msg::Done(c) => inbox.done.push(c),
            Msg::Cancel(r) => inbox.cancels.push(r),
            Msg::Wake => {}
        };
        push(first);
        while let Ok(m) = self.rx.try_recv() {
            push(m);
        }
    }

    /// Runs until every queue is empty and nothing runs. The loop runs on
    /// the calling thread, which keeps the short time slice the loop asks
    /// for (`threads::short_slice`), as does [`Engine::run`]'s.
    pub fn run_until_idle(&self) -> Result<RunSummary, WriteError> {
        self.run_loop(true)
    }

    /// Runs until stopped (see [`StopHandle`]); then waits up to the grace
    /// period for running handlers and returns.
    pub fn run(&self) -> Result<RunSummary, WriteError> {
        self.run_loop(false)
    }

    fn run_loop(&self, until_idle: bool) -> Result<RunSummary, WriteError> {
        let r = self.loop_steps(until_idle);
        // A step that met a sled error (a read, or a write outside the
        // store's commit path) leaves sled untrusted: the store stops, so
        // that the daemon exits 4 and nothing waits on sled again.
        if let Err(WriteError::Database(e)) = &r {
            self.store.sled_failed(e);
        }
        self.ended();
        r
    }

    fn loop_steps(&self, until_idle: bool) -> Result<RunSummary, WriteError> {
        let mut sched = self.sched.lock().unwrap_or_else(|p| p.into_inner());
        std::thread::scope(|scope| {
            let (launches, to_launch) = crossbeam_channel::unbounded::<Launch<'_>>();
            let launcher = std::thread::Builder::new()
                .name("berth-launcher".into())
                .spawn_scoped(scope, move || {
                    crate::threads::short_slice("the launcher");
                    for l in to_launch {
                        self.launch(l);
                    }
                })
                .map_err(|e| WriteError::Failed(format!("starting the launcher thread: {e}")))?;
            // The loop runs on the caller's thread, which keeps the slice.
            crate::threads::short_slice("the engine's loop");
            let r = self.steps(&mut sched, until_idle, &launches);
            drop(launches);
            // Every launch already sent is handed out before the loop ends.
            let _ = launcher.join();
            r
        })
    }

    fn steps<'a>(
        &'a self,
        sched: &mut Scheduler,
        until_idle: bool,
        launches: &Sender<Launch<'a>>,
    ) -> Result<RunSummary, WriteError> {
        let mut inbox = Inbox::default();
        let mut grace_end: Option<Instant> = None;
        let mut stop_wait_end: Option<Instant> = None;
        let mut stuck = 0;
        let ttls = self.store.track_deadlines();
        if ttls > 0 {
            log::info!("{ttls} queued task(s) have a TTL; they expire unless started by then");
        }
        let mut paused: Option<SpaceError> = None;
        loop {
            if let Some(why) = self.store.failure() {
                return Err(WriteError::Failed(why));
            }
            let stopping = self.stop.load(Ordering::SeqCst);
            paused = self.space_check(paused);
            if stopping && grace_end.is_none() {
                log::info!(
                    "stopping: no new tasks start; waiting up to {} for {} running",
                    crate::units::format_duration(self.config.grace),
                    sched.in_flight()
                );
                grace_end = Some(Instant::now() + self.config.grace);
            }
            let dispatch = !stopping && paused.is_none();
            let placing = sched.placing.clone();
            let (progress, launch) = self
                .step(sched, std::mem::take(&mut inbox), dispatch)
                .inspect_err(|_| sched.placing = placing_after_failure(placing, &sched.placing))?;
            if launches.send(launch).is_err() {
                return Err(WriteError::Failed("the launcher thread ended".into()));
            }
            // While that step is flushed: the next step starts the task
            // behind each running one; read them now.
            self.store.warm_next(sched.running_jobs());
            self.publish(sched, stopping, paused.clone());
            if stopping && sched.in_flight() == 0 {
                break;
            }
            // Tasks for other nodes wait for their node: not for this one.
            let elsewhere = self.store.placed_among(sched.elsewhere());
            let queued = self.store.queued_total().saturating_sub(elsewhere);
            if until_idle && sched.in_flight() == 0 && queued == 0 {
                if elsewhere > 0 {
                    log::info!("idle; {elsewhere} task(s) for other nodes are left waiting");
                }
                break;
            }
            let now = self.store.clock().now_ms();
            // The loop wakes for the next TTL deadline too.
            let wake = match (sched.next_wake(now), self.store.next_deadline()) {
                // A group's next children are placed at the next step.
                _ if dispatch && !sched.placing.is_empty() => Some(now),
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if until_idle
                && paused.is_none()
                && progress == 0
                && sched.in_flight() == 0
                && wake.is_none()
                && self.rx.is_empty()
            {
                // Tasks remain but none can start and nothing will change
                // by waiting: running until idle would never end.
                log::error!("{queued} task(s) cannot start (see the errors above); giving up");
                stuck = queued;
                break;
            }
            // The grace period over: what still runs is stopped at once and
            // given `STOP_WAIT` to return (see `stop.rs`); then the loop ends.
            let deadline = match (grace_end, stop_wait_end) {
                (_, Some(end)) if Instant::now() >= end => {
                    log::warn!(
                        "{} task(s) still running did not return; they are left to the recovery \
                         of the next start",
                        sched.in_flight()
                    );
                    break;
                }
                (Some(end), None) if Instant::now() >= end => {
                    let n = sched.stop_running();
                    log::warn!(
                        "grace period over; stopping the {n} task(s) still running at once \
                         (a command handler's process group gets SIGKILL)"
                    );
                    stop_wait_end = Some(Instant::now() + stop::STOP_WAIT);
                    stop_wait_end
                }
                (end, wait_end) => wait_end.or(end),
            };
            if !self.wait(sched, stopping, wake, deadline, &mut inbox) {
                break;
            }
        }
        // Completions the loop will not take announce nothing any more.
        self.commits.arrived(usize::MAX);
        if let Err(e) = self.store.flush() {
            log::error!("final flush failed: {e}");
        }
        Ok(RunSummary {
            tally: sched.tally,
            abandoned: sched.in_flight(),
            stuck,
        })
    }

    /// Whether less than the disk reserve is free now (logged when that
    /// changes): the loop then starts no task.
    fn space_check(&self, was: Option<SpaceError>) -> Option<SpaceError> {
        let now = self.store.below_reserve();
        match (&was, &now) {
            (None, Some(e)) => log::warn!("starting no task until space is freed: {e}"),
            (Some(_), None) => {
                log::info!("disk space is back above the reserve; starting tasks again")
            }
            _ => {}
        }
        now
    }

    /// Waits for something to do: a completion or a wake-up message, the
    /// next queue's wake time, or at most [`POLL`]. With nothing running,
    /// a fake clock skips to the wake time instead, or until `deadline`
    /// (the stop's). False when the loop must end: the channel is gone.
    fn wait(
        &self,
        sched: &Scheduler,
        stopping: bool,
        wake: Option<u64>,
        deadline: Option<Instant>,
        inbox: &mut Inbox,
    ) -> bool {
        let clock = self.store.clock();
        if sched.in_flight() == 0
            && !stopping
            && let Some(at) = wake
            && clock.skip_to(at)
        {
            return true;
        }
        let now = clock.now_ms();
        let mut timeout = wake.map_or(POLL, |at| {
            Duration::from_millis(at.saturating_sub(now)).min(POLL)
        });
        if let Some(end) = deadline {
            timeout = timeout.min(end.saturating_duration_since(Instant::now()));
        }
        match self.rx.recv_timeout(timeout) {
            Ok(m) => self.collect(m, inbox),
            Err(RecvTimeoutError::Timeout) => return true,
            Err(RecvTimeoutError::Disconnected) => return false,
        }
        self.gather(sched, inbox);
        true
    }

    /// Waits for the completions of the jobs still running, as long as a
    /// flush would wait for them (`GroupCommit::coming_until`: they are
    /// announced, and the last job ended less than its gathering time
    /// ago), so that one step records the jobs a flush released together:
    /// a second step for the late ones cost as much again, and the flush
    /// waited for it anyway.
    fn gather(&self, sched: &Scheduler, inbox: &mut Inbox) {
        while inbox.done.len() < sched.in_flight()
            && let Some(until) = self.commits.coming_until()
        {
            match self.rx.recv_deadline(until) {
                Ok(m) => self.collect(m, inbox),
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_failed_step_each_group_goes_on_from_before_it_or_from_its_start() {
        // Before the step: group 1 at child 1,000, group 2 at 3,000.
        let before = BTreeMap::from([(1, 1_000), (2, 3_000)]);
        // The step moved group 1 on, finished placing group 2 and began group 3.
        let after = BTreeMap::from([(1, 2_000), (3, 1_000)]);
        assert_eq!(
            placing_after_failure(before, &after),
            BTreeMap::from([(1, 1_000), (2, 3_000), (3, 0)])
        );
    }
}
