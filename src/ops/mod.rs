//! Operations: every user-facing operation, as one function over the store
//! (and, when a daemon runs, its engine), with one error type.
//!
//! The command line without a daemon and the daemon's control socket both
//! run a [`Request`] through [`execute`]: there is one body per operation,
//! and one mapping from an error's [`Class`] to an exit code and a socket
//! `code`. Adding a command means: its arguments (`cli/args.rs`), one
//! function here, one `Request` variant.
//!
//! The result of every operation is JSON (the socket's wire form), so the
//! command prints the same thing whichever way the request went.

mod attempts;
mod list;
mod metrics;
mod replay;
mod tasks;
mod transfer;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::engine::Engine;
use crate::report;
use crate::store::{OpenError, Placement, ReadError, Store, WriteError};
use crate::submit::EnqueueError;
use crate::task::TaskSpec;

pub use attempts::{task_cancel, task_log, task_output};
pub use list::{Naming, STATUS_WORDS, TaskFilter, glob, task_list};
pub use metrics::metrics;
pub use replay::{LOG_PAGE, log_page, replay};
pub use tasks::{enqueue, enqueue_batch, queue_list, task_remove, task_retry, task_show};
pub use transfer::{
    INTERRUPTED_BY_EXPORT, MAX_EXPORT_FILE, Selection, check_import, export, import, read_export,
    read_export_bytes,
};

/// What kind of failure an operation met; it decides the exit code and the
/// socket's `code` (README.md, "Exit codes").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The operation could not be done: no such task, a wrong state, a
    /// corrupt record, a disk or database failure, not enough space. Exit 1.
    Runtime,
    /// The request itself is wrong: an invalid spec, a payload over the
    /// budget, a bad placement. Nothing was written. Exit 2.
    Input,
    /// The data dir or the daemon is taken (another daemon, a daemon too
    /// busy to answer). Nothing was done. Exit 3.
    Busy,
}

impl Class {
    /// The exit code, which is also the socket's error `code`.
    pub const fn code(self) -> i32 {
        match self {
            Class::Runtime => 1,
            Class::Input => 2,
            Class::Busy => 3,
        }
    }

    /// The class of a socket error `code` (unknown codes are runtime errors).
    pub fn from_code(code: i32) -> Class {
        match code {
            2 => Class::Input,
            3 => Class::Busy,
            _ => Class::Runtime,
        }
    }
}

/// An operation's error: its class and the message for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OpError {
    pub class: Class,
    pub message: String,
    /// A write the store refused only because it was opened to read
    /// (`WriteError::ReadOnly`); set where that error is converted.
    read_only: bool,
}

impl OpError {
    pub fn new(class: Class, message: impl Into<String>) -> Self {
        OpError {
            class,
            message: message.into(),
            read_only: false,
        }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        OpError::new(Class::Runtime, message)
    }
    pub fn input(message: impl Into<String>) -> Self {
        OpError::new(Class::Input, message)
    }

    /// Whether this is a write refused only because the store was opened to
    /// read: what a request tried on a read-only open (see
    /// [`Request::refusable`]) answers when the data dir would take it.
    pub fn is_read_only_refusal(&self) -> bool {
        self.read_only
    }

    /// The same error with `context` before its message.
    pub fn context(self, context: &str) -> Self {
        OpError {
            message: format!("{context}{}", self.message),
            ..self
        }
    }
}

impl From<WriteError> for OpError {
    fn from(e: WriteError) -> Self {
        let class = match &e {
            WriteError::Order(_) | WriteError::Budget(_) | WriteError::Queue(_) => Class::Input,
            _ => Class::Runtime,
        };
        OpError {
            read_only: matches!(e, WriteError::ReadOnly),
            ..OpError::new(class, e.to_string())
        }
    }
}

impl From<EnqueueError> for OpError {
    fn from(e: EnqueueError) -> Self {
        match e {
            EnqueueError::Store(w) => w.into(),
            invalid => OpError::input(invalid.to_string()),
        }
    }
}

impl From<ReadError> for OpError {
    fn from(e: ReadError) -> Self {
        OpError::runtime(e.to_string())
    }
}

impl From<OpenError> for OpError {
    fn from(e: OpenError) -> Self {
        let class = match &e {
            OpenError::InUse { .. } => Class::Busy,
            OpenError::Options(_) => Class::Input,
            _ => Class::Runtime,
        };
        OpError::new(class, e.to_string())
    }
}

/// What an operation runs against.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    /// The data dir's store; `None` when it does not exist (and the
    /// operation only reads: it then sees nothing).
    pub store: Option<&'a Store>,
    /// The running engine, when a daemon runs the operation: live statuses,
    /// and a wake-up after a change.
    pub engine: Option<&'a Engine>,
    /// The kinds that can run (a daemon's handlers, or a command's
    /// `--config`); an enqueue of another kind is refused. `None`: not known.
    pub kinds: Option<&'a [String]>,
    /// Told how far a long read has come (`replay`): the event reached and
    /// the last there is. Only a command's own context has one (a daemon
    /// has no terminal to show it on).
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
    /// The parallel queue count of a command's `--config`: the queues a
    /// data dir shows before a daemon has recorded its own.
    pub parallel_queues: Option<usize>,
}

impl<'a> Ctx<'a> {
    /// The daemon's context; `kinds` are its handlers'.
    pub fn daemon(engine: &'a Engine, kinds: &'a [String]) -> Self {
        Ctx {
            store: Some(engine.store()),
            engine: Some(engine),
            kinds: Some(kinds),
            progress: None,
            parallel_queues: None,
        }
    }

    /// A command's own context, on a store it opened (or none), with the
    /// kinds its config has handlers for, if it has a config.
    pub fn direct(store: Option<&'a Store>, kinds: Option<&'a [String]>) -> Self {
        Ctx {
            store,
            engine: None,
            kinds,
            progress: None,
            parallel_queues: None,
        }
    }

    /// The parallel queues the data dir shows: the count its daemon
    /// recorded, else the command's config's, else the default.
    pub fn parallel_queues(&self, store: &Store) -> Result<usize, OpError> {
        Ok(store
            .recorded_parallel_queues()?
            .or(self.parallel_queues)
            .unwrap_or(crate::queues::DEFAULT_PARALLEL_QUEUES))
    }

    /// Why a task of `kind` cannot run here, if it cannot: the kinds are
    /// known and none of them is it.
    pub fn no_handler(&self, kind: &str) -> Option<String> {
        let kinds = self.kinds?;
        (!kinds.iter().any(|k| k == kind)).then(|| {
            format!(
                "no handler for kind '{kind}' here (the kinds with a handler: {})",
                kinds.join(", ")
            )
        })
    }

    /// Refuses specs whose kind cannot run here, naming the field `kind`
    /// (a batch also names its entry). The command line names its flag
    /// instead: [`KIND_FIELD`] is what it replaces.
    pub fn check_kinds(&self, specs: &[TaskSpec], batch: bool) -> Result<(), OpError> {
        for (i, spec) in specs.iter().enumerate() {
            if let Some(why) = self.no_handler(&spec.kind) {
                let entry = match batch {
                    false => String::new(),
                    true => format!("{}, ", crate::submit::Entry::at(i, specs.len())),
                };
                return Err(OpError::input(format!("{entry}{KIND_FIELD}{why}")));
            }
        }
        Ok(())
    }

    /// Tells the engine (if one runs) that the queues changed.
    fn changed(&self) {
        if let Some(e) = self.engine {
            e.wake();
        }
    }
}

/// How [`Ctx::check_kinds`] names a spec's kind in its error.
pub const KIND_FIELD: &str = "field kind: ";

/// One request, as the control socket carries it (one line of JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Enqueue {
        spec: Box<TaskSpec>,
        #[serde(default)]
        first: bool,
        #[serde(default)]
        after: Option<u64>,
        #[serde(default)]
        before: Option<u64>,
    },
    EnqueueBatch {
        tasks: Vec<TaskSpec>,
    },
    /// A struct variant, not a unit one: serde's `deny_unknown_fields`
    /// does not reach unit variants of an internally tagged enum, so
    /// `{"op":"queue_list","bogus":1}` would be accepted.
    QueueList {
        /// Every task (else each queue lists its first 1,000:
        /// `tasks::QUEUE_LIST_LIMIT`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        all: bool,
    },
    TaskShow {
        id: u64,
    },
    TaskRemove {
        id: u64,
        /// Also a finished task (its record and logs are deleted).
        #[serde(default)]
        history: bool,
    },
    TaskRetry {
        id: u64,
    },
    TaskList {
        #[serde(default)]
        filter: TaskFilter,
    },
    /// A task's recorded attempts (`task log`): all, or one.
    TaskLog {
        id: u64,
        #[serde(default)]
        attempt: Option<u32>,
    },
    /// What `task log --follow` polls: the running attempt's output after
    /// the offsets (for `attempt`; another attempt's from the start).
    TaskOutput {
        id: u64,
        #[serde(default)]
        attempt: Option<u32>,
        #[serde(default)]
        stdout_from: u64,
        #[serde(default)]
        stderr_from: u64,
    },
    TaskCancel {
        id: u64,
    },
    /// Every metric family (`berth metrics`); a struct variant for the
    /// reason `QueueList` is one.
    Metrics {},
    /// One page of the timeline (`berth log`): the events after event
    /// `after`, up to event `to` (the end when none), at most `limit`.
    Log {
        #[serde(default)]
        after: u64,
        #[serde(default)]
        to: Option<u64>,
        #[serde(default)]
        limit: Option<usize>,
        /// `berth log --queue`: a page that begins at a base checkpoint
        /// also names the tasks in that queue in its state (`seed`).
        #[serde(default)]
        queue: Option<String>,
    },
    /// The queues as they were after an event (`berth replay`): up to
    /// event `seq`, or the last event at or before `at_ms`; the end when
    /// neither is given.
    Replay {
        #[serde(default)]
        seq: Option<u64>,
        #[serde(default)]
        at_ms: Option<u64>,
    },
    /// `berth export`: the daemon (or the command) writes the selected
    /// tasks to `path`, an absolute path on this machine.
    Export {
        path: std::path::PathBuf,
        #[serde(default)]
        queues: Vec<String>,
        #[serde(default)]
        statuses: Vec<String>,
        #[serde(default)]
        history: bool,
        /// Only tasks targeted at one of these nodes (`task list`'s
        /// `targets`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        targets: Vec<String>,
    },
    /// `berth import`: adds the tasks of the export file at `path` (an
    /// absolute path on this machine); `label` names it in messages
    /// (`standard input`).
    Import {
        path: std::path::PathBuf,
        #[serde(default)]
        label: Option<String>,
    },
}

/// What a request does to the data dir, for a command that opens it itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Only reads: the data dir must exist; nothing in it changes.
    Read,
    /// Changes an existing data dir.
    Write,
    /// Adds to the data dir, creating it if it does not exist.
    Create,
}

impl Request {
    /// Whether what the data dir holds can refuse this change: a task that
    /// is not there, or not in the state the request needs, or an anchor
    /// that is in no queue. A command that opens the data dir itself tries
    /// such a request on a read-only open first, so that a refusal leaves
    /// every file as it was (a writable open writes even when its request is
    /// then refused: the lock's holder, sled's snapshot, the applied mark).
    pub fn refusable(&self) -> bool {
        match self {
            Request::TaskRemove { .. } | Request::TaskRetry { .. } | Request::TaskCancel { .. } => {
                true
            }
            Request::Enqueue { after, before, .. } => after.is_some() || before.is_some(),
            _ => false,
        }
    }

    /// Whether this change adds work (new tasks, or a task run again),
    /// which the disk reserve can refuse (`Store`'s space check): a command
    /// that opens the data dir itself rehearses it too when space is short.
    pub fn adds_work(&self) -> bool {
        matches!(
            self,
            Request::Enqueue { .. }
                | Request::EnqueueBatch { .. }
                | Request::Import { .. }
                | Request::TaskRetry { .. }
        )
    }

    /// The task an enqueue is placed after or before.
    pub fn anchor(&self) -> Option<u64> {
        match self {
            Request::Enqueue { after, before, .. } => after.or(*before),
            _ => None,
        }
    }

    pub fn access(&self) -> Access {
        match self {
            Request::Enqueue { .. } | Request::EnqueueBatch { .. } | Request::Import { .. } => {
                Access::Create
            }
            Request::TaskRemove { .. } | Request::TaskRetry { .. } | Request::TaskCancel { .. } => {
                Access::Write
            }
            Request::QueueList { .. }
            | Request::TaskShow { .. }
            | Request::TaskList { .. }
            | Request::TaskLog { .. }
            | Request::TaskOutput { .. }
            | Request::Metrics {}
            | Request::Log { .. }
            | Request::Replay { .. }
            | Request::Export { .. } => Access::Read,
        }
    }
}

/// Placement from the enqueue flags: at most one of them (the CLI's flags
/// conflict; a socket request that gives two is refused, not read as one).
pub fn placement(
    first: bool,
    after: Option<u64>,
    before: Option<u64>,
) -> Result<Placement, OpError> {
    match (first, after, before) {
        (false, None, None) => Ok(Placement::Last),
        (true, None, None) => Ok(Placement::First),
        (false, Some(id), None) => Ok(Placement::After(id)),
        (false, None, Some(id)) => Ok(Placement::Before(id)),
        _ => Err(OpError::input(
            "enqueue: give at most one of first, after and before",
        )),
    }
}

/// Runs one request; the result is its wire form (README.md, "The control
/// socket").
pub fn execute(ctx: &Ctx<'_>, req: Request) -> Result<Value, OpError> {
    match req {
        Request::Enqueue {
            spec,
            first,
            after,
            before,
        } => enqueue(ctx, *spec, placement(first, after, before)?).map(|id| json!([id])),
        Request::EnqueueBatch { tasks } => enqueue_batch(ctx, tasks).map(|ids| json!(ids)),
        Request::QueueList { all } => {
            queue_list(ctx, all).map(|views| report::views_to_json(&views))
        }
        Request::TaskShow { id } => task_show(ctx, id),
        Request::TaskRemove { id, history } => task_remove(ctx, id, history).map(|ids| json!(ids)),
        Request::TaskRetry { id } => task_retry(ctx, id).map(|()| json!([id])),
        Request::TaskList { filter } => task_list(ctx, &filter).map(|rows| json!(rows)),
        Request::TaskLog { id, attempt } => task_log(ctx, id, attempt),
        Request::TaskOutput {
            id,
            attempt,
            stdout_from,
            stderr_from,
        } => task_output(ctx, id, attempt, stdout_from, stderr_from),
        Request::TaskCancel { id } => task_cancel(ctx, id).map(|ids| json!(ids)),
        Request::Metrics {} => metrics(ctx).map(|families| json!(families)),
        Request::Log {
            after,
            to,
            limit,
            queue,
        } => log_page(ctx, after, to, limit, queue.as_deref()),
        Request::Replay { seq, at_ms } => replay(ctx, seq, at_ms),
        Request::Export {
            path,
            queues,
            statuses,
            history,
            targets,
        } => export(
            ctx,
            &path,
            &Selection {
                queues,
                statuses,
                history,
                targets,
            },
        ),
        Request::Import { path, label } => import(ctx, &path, label.as_deref()),
    }
}
