//! Handlers: what runs a task, looked up by its kind. A handler has an
//! optional `pre` step (Tendrl's pre atoms: a failure skips `run` and fails
//! the attempt with `pre-check failed: ...`), `run`, and an optional `post`
//! step after a successful run (a failure fails the attempt). A panic anywhere becomes
//! `Fail("handler panicked: ...")`.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::live::LiveAttempt;
use crate::task::{Task, TaskSpec};

/// What a handler sees of a task.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The task as stored (payload still encoded; use `payload`).
    pub task: Task,
    pub payload: serde_json::Value,
    /// 1 on the first run.
    pub attempt: u32,
    /// This engine's node name, if configured.
    pub node: Option<String>,
    /// This attempt as it runs: a command handler appends its output here
    /// and records how its processes ended; `berth task cancel` raises its
    /// cancel signal.
    pub live: Arc<LiveAttempt>,
}

impl TaskContext {
    /// Whether this attempt was asked to stop: by `berth task cancel`, or
    /// by a daemon's stop whose grace period ran out. A library handler
    /// that runs long may look at it and return early; whatever it returns,
    /// the task then ends as `cancelled` (a cancel), or the attempt is
    /// recorded `interrupted` and the task stays at the head of its queue,
    /// to run again at the next start (a stop: see `engine::stop`).
    pub fn cancel_requested(&self) -> bool {
        self.live.cancel_requested()
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunResult {
    Success,
    Fail(String),
    /// Run again; not counted as a failure. At once if the attempt ran for
    /// at least [`REPEAT_INTERVAL`], else that long after it started.
    Repeat,
    /// Stay at the head and run again after a delay; not a failure.
    Keep,
}

/// A task that repeats starts at most once per this interval, so a handler
/// that always asks to repeat cannot grow the log faster than that.
pub const REPEAT_INTERVAL: Duration = Duration::from_secs(1);

/// Where a follow-up task goes in the current task's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowUpAt {
    Head,
    Tail,
    AfterCurrent,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FollowUp {
    pub spec: TaskSpec,
    pub at: FollowUpAt,
}

/// A run's full outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub result: RunResult,
    /// Stored as the task's result (JSON), within the object size budget
    /// (see [`crate::budget::Budget::result_blob`]).
    pub output: Option<serde_json::Value>,
    /// Set when the handler could keep only the start of its output (for a
    /// command, stdout over its read limit): why. `output` is then that
    /// start, and the stored result is a `truncated` marker.
    pub output_cut: Option<String>,
    /// Tasks to add (applied unless the run failed).
    pub follow_ups: Vec<FollowUp>,
    /// The queue sleeps this long before its next task (or, with Keep, before
    /// running this one again).
    pub delay: Option<Duration>,
}

impl Outcome {
    pub fn new(result: RunResult) -> Self {
        Outcome {
            result,
            output: None,
            output_cut: None,
            follow_ups: Vec::new(),
            delay: None,
        }
    }
    pub fn success() -> Self {
        Self::new(RunResult::Success)
    }
    pub fn fail(message: impl Into<String>) -> Self {
        Self::new(RunResult::Fail(message.into()))
    }
    pub fn with_output(mut self, v: serde_json::Value) -> Self {
        self.output = Some(v);
        self
    }
    pub fn with_delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }
    pub fn with_follow_up(mut self, spec: TaskSpec, at: FollowUpAt) -> Self {
        self.follow_ups.push(FollowUp { spec, at });
        self
    }
}

/// Runs tasks of one or more kinds. Implementations must be thread-safe:
/// several tasks of one kind can run at once in different queues.
pub trait Handler: Send + Sync {
    fn pre(&self, _ctx: &TaskContext) -> Result<(), String> {
        Ok(())
    }
    fn run(&self, ctx: &TaskContext) -> Outcome;
    fn post(&self, _ctx: &TaskContext, _outcome: &Outcome) -> Result<(), String> {
        Ok(())
    }
}

/// Any `Fn(&TaskContext) -> Outcome` is a handler with no pre or post step.
impl<F> Handler for F
where
    F: Fn(&TaskContext) -> Outcome + Send + Sync,
{
    fn run(&self, ctx: &TaskContext) -> Outcome {
        self(ctx)
    }
}

/// Handlers by task kind.
#[derive(Clone, Default)]
pub struct Handlers {
    by_kind: HashMap<String, Arc<dyn Handler>>,
}

impl Handlers {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn register(&mut self, kind: impl Into<String>, h: impl Handler + 'static) -> &mut Self {
        self.by_kind.insert(kind.into(), Arc::new(h));
        self
    }
    pub fn register_arc(&mut self, kind: impl Into<String>, h: Arc<dyn Handler>) -> &mut Self {
        self.by_kind.insert(kind.into(), h);
        self
    }
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn Handler>> {
        self.by_kind.get(kind)
    }
    /// The kinds with a handler, sorted.
    pub fn kinds(&self) -> Vec<String> {
        let mut k: Vec<String> = self.by_kind.keys().cloned().collect();
        k.sort();
        k
    }
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-text panic".into()
    }
}

/// Runs one attempt through pre, run and post, turning panics into failures.
pub fn run_attempt(handlers: &Handlers, ctx: &TaskContext) -> Outcome {
    let Some(h) = handlers.get(&ctx.task.kind) else {
        return Outcome::fail(format!("no handler for kind {}", ctx.task.kind));
    };
    let guarded = catch_unwind(AssertUnwindSafe(|| {
        if let Err(e) = h.pre(ctx) {
            return Outcome::fail(format!("pre-check failed: {e}"));
        }
        let outcome = h.run(ctx);
        if outcome.result != RunResult::Success {
            return outcome;
        }
        match h.post(ctx, &outcome) {
            Ok(()) => outcome,
            Err(e) => Outcome {
                result: RunResult::Fail(format!("post-check failed: {e}")),
                ..outcome
            },
        }
    }));
    guarded.unwrap_or_else(|p| Outcome::fail(format!("handler panicked: {}", panic_text(p))))
}
