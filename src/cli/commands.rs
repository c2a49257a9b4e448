//! The commands. Each talks to the daemon through its control socket when
//! one holds the data dir, and opens the data dir directly otherwise, with
//! the same output either way. Errors go back to `main` as [`CliError`]s.

use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use berth::clock;
use berth::control::{self, CallError, Request};
use berth::report::{self, QueueView};
use berth::store::{OpenError, Options, Placement, Role, Store, WriteError};
use berth::submit::{self, EnqueueError};
use berth::task::TaskSpec;

use super::args::{Cli, Command, EnqueueArgs, Format, QueueCommand, TaskCommand};
use super::{CliError, EXIT_INPUT, EXIT_RUNTIME};

/// How long a command waits for a daemon's answer (`--timeout`), set once
/// by [`run`] before any command talks to a daemon.
static DAEMON_TIMEOUT: OnceLock<Duration> = OnceLock::new();

pub fn run(cli: Cli, data_dir_given: bool) -> Result<(), CliError> {
    let _ = DAEMON_TIMEOUT.set(cli.timeout);
    let dir = cli.data_dir.as_path();
    match cli.command {
        Command::Run(a) => super::daemon::run(a, data_dir_given.then_some(dir)),
        Command::Enqueue(a) => enqueue(dir, *a),
        Command::Queue(QueueCommand::List {
            output,
            show_empty,
            watch,
            interval,
        }) => {
            if !watch {
                return queue_list(dir, output, show_empty, "");
            }
            loop {
                // Clear the screen and redraw.
                queue_list(dir, output, show_empty, "\x1b[H\x1b[2J")?;
                std::thread::sleep(interval);
            }
        }
        Command::Task(TaskCommand::Show { id, output }) => task_show(dir, id, output),
        Command::Task(TaskCommand::Remove { id }) => task_remove(dir, id),
        Command::Task(TaskCommand::Retry { id }) => task_retry(dir, id),
        Command::Verify => verify(dir),
    }
}

/// Prints to stdout; a closed pipe (`berth queue list | head`) is not an error.
pub fn out(text: &str) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(CliError::runtime(format!("writing to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

/// Asks the daemon, if one listens on the data dir's socket.
fn via_daemon(dir: &Path, req: &Request) -> Result<Option<serde_json::Value>, CliError> {
    if !control::socket_path(dir).exists() {
        return Ok(None);
    }
    match control::call(dir, req, daemon_timeout()) {
        Err(CallError::NoDaemon) => Ok(None),
        Err(e @ (CallError::TimedOut { .. } | CallError::Failed(_))) => {
            Err(CliError::runtime(e.to_string()))
        }
        Ok(resp) => match resp.error {
            Some(e) => Err(CliError {
                code: e.code,
                message: e.message,
            }),
            None => Ok(Some(resp.result)),
        },
    }
}

fn ids_of(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default()
}

/// Where a command's request went.
enum Route {
    /// A daemon answered it.
    Daemon(serde_json::Value),
    /// No daemon: the command opened the data dir itself (`None`: it does
    /// not exist and the command only reads).
    Direct(Option<Box<Store>>),
}

/// Sends `req` to the daemon when one answers on the data dir's socket, and
/// opens the data dir otherwise (creating it if `create`). A daemon that
/// holds the data dir but does not answer yet, or that waits for the lock
/// (right after a restart), is starting: the command waits for its socket,
/// up to `--timeout`, instead of failing.
fn route(dir: &Path, req: &Request, create: bool) -> Result<Route, CliError> {
    let start = Instant::now();
    let limit = daemon_timeout();
    loop {
        if let Some(v) = via_daemon(dir, req)? {
            return Ok(Route::Daemon(v));
        }
        let opts = Options {
            create,
            ..Options::default()
        };
        match Store::open(dir, opts, clock::system()) {
            Ok(s) => return Ok(Route::Direct(Some(Box::new(s)))),
            Err(OpenError::Missing { .. }) => return Ok(Route::Direct(None)),
            Err(OpenError::InUse { holder, .. })
                if holder.role == Some(Role::Daemon) && start.elapsed() < limit =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn daemon_timeout() -> Duration {
    DAEMON_TIMEOUT
        .get()
        .copied()
        .unwrap_or(control::DEFAULT_TIMEOUT)
}

fn missing(dir: &Path) -> CliError {
    CliError::runtime(format!("data dir {} does not exist", dir.display()))
}

fn enqueue_error(e: EnqueueError, source: &str) -> CliError {
    let code = if e.is_bad_input() {
        EXIT_INPUT
    } else {
        EXIT_RUNTIME
    };
    CliError {
        code,
        message: format!("{source}{e}"),
    }
}

pub fn read_file(path: &Path, what: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| CliError::input(format!("cannot read {what} {}: {e}", path.display())))
}

fn print_ids(ids: &[u64]) -> Result<(), CliError> {
    out(&ids.iter().map(|id| format!("{id}\n")).collect::<String>())
}

fn enqueue(dir: &Path, a: EnqueueArgs) -> Result<(), CliError> {
    if let Some(batch) = a.batch {
        let source = format!("batch file {}: ", batch.display());
        let text = read_file(&batch, "batch file")?;
        let specs =
            submit::parse_batch(&text).map_err(|e| CliError::input(format!("{source}{e}")))?;
        let req = Request::EnqueueBatch {
            tasks: specs.clone(),
        };
        let routed = route(dir, &req, true).map_err(|e| CliError {
            message: format!("{source}{}", e.message),
            ..e
        })?;
        let ids = match routed {
            Route::Daemon(v) => ids_of(&v),
            Route::Direct(store) => {
                let store = store.ok_or_else(|| missing(dir))?;
                submit::enqueue_batch(&store, specs).map_err(|e| enqueue_error(e, &source))?
            }
        };
        return print_ids(&ids);
    }
    let payload = match (&a.payload, &a.payload_file) {
        (Some(p), _) => serde_json::from_str(p)
            .map_err(|e| CliError::input(format!("--payload is not valid JSON: {e}")))?,
        (None, Some(f)) => {
            let text = read_file(f, "payload file")?;
            serde_json::from_str(&text).map_err(|e| {
                CliError::input(format!(
                    "payload file {} is not valid JSON: {e}",
                    f.display()
                ))
            })?
        }
        (None, None) => serde_json::Value::Null,
    };
    let spec = TaskSpec {
        queue: a.queue.unwrap_or_default(),
        kind: a.kind.unwrap_or_default(),
        name: a.name.unwrap_or_default(),
        description: a.description,
        weight: a.weight,
        payload,
        tags: a.tag,
        target: a.target,
        compaction_key: None,
    };
    // Check the spec before touching the data dir.
    spec.validate()
        .map_err(|e| CliError::input(format!("--{}: {}", e.field.replace('_', "-"), e.reason)))?;
    let req = Request::Enqueue {
        spec: Box::new(spec.clone()),
        first: a.first,
        after: a.after,
        before: a.before,
    };
    let store = match route(dir, &req, true)? {
        Route::Daemon(v) => return print_ids(&ids_of(&v)),
        Route::Direct(store) => store.ok_or_else(|| missing(dir))?,
    };
    let placement: Placement = control::placement(a.first, a.after, a.before);
    let id = submit::enqueue_one(&store, spec, placement).map_err(|e| enqueue_error(e, ""))?;
    print_ids(&[id])
}

fn empty_views() -> Vec<QueueView> {
    let mut v = vec![report::QueueView {
        name: report::MAIN.into(),
        status: String::new(),
        tasks: vec![],
    }];
    v.extend((0..10).map(|i| report::QueueView {
        name: report::parallel_queue(i),
        status: String::new(),
        tasks: vec![],
    }));
    v
}

fn queue_list(dir: &Path, output: Format, show_empty: bool, prefix: &str) -> Result<(), CliError> {
    let queues = match route(dir, &Request::QueueList {}, false)? {
        Route::Daemon(v) => control::views_from_json(&v).map_err(CliError::runtime)?,
        Route::Direct(Some(s)) => report::snapshot(&s, 10, &|_| String::new()),
        Route::Direct(None) => empty_views(),
    };
    let text = match output {
        Format::Text => report::render_text(&queues, show_empty),
        Format::Json => format!("{}\n", report::render_json(&queues)),
    };
    out(&format!("{prefix}{text}"))
}

fn task_show(dir: &Path, id: u64, output: Format) -> Result<(), CliError> {
    let j = match route(dir, &Request::TaskShow { id }, false)? {
        Route::Daemon(v) => report::task_from_wire(v),
        Route::Direct(store) => {
            let store = store.ok_or_else(|| CliError::runtime(format!("no task {id}")))?;
            let task = store
                .task(id)
                .map_err(|e| CliError::runtime(e.to_string()))?
                .ok_or_else(|| CliError::runtime(format!("no task {id}")))?;
            report::task_json(&task, store.budget())
        }
    };
    match output {
        Format::Text => out(&report::task_text(&j)),
        Format::Json => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&j).unwrap_or_default()
        )),
    }
}

fn store_error(id: u64, what: &str, e: WriteError) -> CliError {
    match e {
        WriteError::NoSuchTask(_) | WriteError::WrongState { .. } => {
            CliError::runtime(e.to_string())
        }
        other => CliError::runtime(format!("{what} task {id}: {other}")),
    }
}

fn task_remove(dir: &Path, id: u64) -> Result<(), CliError> {
    let removed = match route(dir, &Request::TaskRemove { id }, false)? {
        Route::Daemon(v) => ids_of(&v),
        Route::Direct(store) => {
            let store = store.ok_or_else(|| CliError::runtime(format!("no task {id}")))?;
            let mut w = store.write();
            let removed = w.remove(id).map_err(|e| store_error(id, "removing", e))?;
            w.commit().map_err(|e| store_error(id, "removing", e))?;
            removed
        }
    };
    let list: Vec<String> = removed.iter().map(u64::to_string).collect();
    out(&format!("removed {}\n", list.join(" ")))
}

fn task_retry(dir: &Path, id: u64) -> Result<(), CliError> {
    if let Route::Direct(store) = route(dir, &Request::TaskRetry { id }, false)? {
        let store = store.ok_or_else(|| CliError::runtime(format!("no task {id}")))?;
        let mut w = store.write();
        w.retry(id, Placement::Last)
            .map_err(|e| store_error(id, "retrying", e))?;
        w.commit().map_err(|e| store_error(id, "retrying", e))?;
    }
    out(&format!("retried {id}\n"))
}

fn verify(dir: &Path) -> Result<(), CliError> {
    let opts = Options {
        create: false,
        ..Options::default()
    };
    let store = match Store::open(dir, opts, clock::system()) {
        Ok(s) => s,
        Err(OpenError::Missing { .. }) => return out("no data dir; nothing to verify\n"),
        Err(e) => return Err(e.into()),
    };
    let diffs = berth::store::verify::verify(&store)
        .map_err(|e| CliError::runtime(format!("replaying the log: {e}")))?;
    let corrupt = store.corrupt_records();
    for c in corrupt {
        eprintln!("berth: {c}");
    }
    if diffs.is_empty() && corrupt.is_empty() {
        return out(&format!(
            "ok: {} events replayed; the log agrees with the state\n",
            store.next_seq() - 1
        ));
    }
    for d in &diffs {
        eprintln!("berth: {d}");
    }
    Err(CliError::runtime(format!(
        "{} disagreement(s) between the log and the state, {} corrupt record(s)",
        diffs.len(),
        corrupt.len()
    )))
}
