//! The commands other than `berth run`. Each turns its arguments into an
//! `ops::Request`, runs it through [`session::run`] (the daemon when one
//! answers, else the same operation on the data dir opened here), and prints
//! the answer. So a command's output and exit code do not depend on whether
//! a daemon runs.

use std::path::Path;

use berth::ops::{OpError, Request};
use berth::report;
use berth::store::{Options, Store};
use berth::submit;
use berth::task::TaskSpec;
use serde_json::Value;

use super::args::{Cli, Command, EnqueueArgs, Format, QueueCommand, TaskCommand};
use super::{CliError, out, read_file, session};

pub fn run(cli: Cli, data_dir_given: bool) -> Result<(), CliError> {
    session::set_timeout(cli.timeout);
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
        Command::Task(TaskCommand::Remove { id, history }) => task_remove(dir, id, history),
        Command::Task(TaskCommand::Retry { id }) => task_retry(dir, id),
        Command::Task(TaskCommand::Log {
            id,
            attempt,
            follow,
            output,
        }) => super::tasklog::run(dir, id, attempt, follow, output),
        Command::Task(TaskCommand::Cancel { id }) => task_cancel(dir, id),
        Command::Verify => verify(dir),
    }
}

/// Ids from an answer that is a list of ids.
fn ids_of(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn print_ids(ids: &[u64]) -> Result<(), CliError> {
    out(&ids.iter().map(|id| format!("{id}\n")).collect::<String>())
}

fn enqueue(dir: &Path, a: EnqueueArgs) -> Result<(), CliError> {
    if let Some(batch) = a.batch {
        let source = format!("batch file {}: ", batch.display());
        let text = read_file(&batch, "batch file")?;
        let tasks =
            submit::parse_batch(&text).map_err(|e| CliError::input(format!("{source}{e}")))?;
        let ids =
            session::run(dir, Request::EnqueueBatch { tasks }).map_err(|e| e.context(&source))?;
        return print_ids(&ids_of(&ids));
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
        spec: Box::new(spec),
        first: a.first,
        after: a.after,
        before: a.before,
    };
    print_ids(&ids_of(&session::run(dir, req)?))
}

fn queue_list(dir: &Path, output: Format, show_empty: bool, prefix: &str) -> Result<(), CliError> {
    let v = session::run(dir, Request::QueueList {})?;
    let queues = report::views_from_json(&v).map_err(CliError::runtime)?;
    let text = match output {
        Format::Text => report::render_text(&queues, show_empty),
        Format::Json => format!("{}\n", report::render_json(&queues)),
    };
    out(&format!("{prefix}{text}"))
}

fn task_show(dir: &Path, id: u64, output: Format) -> Result<(), CliError> {
    let j = report::task_from_wire(session::run(dir, Request::TaskShow { id })?);
    match output {
        Format::Text => out(&report::task_text(&j)),
        Format::Json => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&j).unwrap_or_default()
        )),
    }
}

fn task_remove(dir: &Path, id: u64, history: bool) -> Result<(), CliError> {
    let removed = ids_of(&session::run(dir, Request::TaskRemove { id, history })?);
    let list: Vec<String> = removed.iter().map(u64::to_string).collect();
    out(&format!("removed {}\n", list.join(" ")))
}

fn task_cancel(dir: &Path, id: u64) -> Result<(), CliError> {
    let cancelled = ids_of(&session::run(dir, Request::TaskCancel { id })?);
    let list: Vec<String> = cancelled.iter().map(u64::to_string).collect();
    out(&format!("cancelled {}\n", list.join(" ")))
}

fn task_retry(dir: &Path, id: u64) -> Result<(), CliError> {
    session::run(dir, Request::TaskRetry { id })?;
    out(&format!("retried {id}\n"))
}

/// `verify` opens the data dir itself (never through a daemon): it replays
/// the whole log against the state, which needs the store at rest.
fn verify(dir: &Path) -> Result<(), CliError> {
    let opts = Options {
        create: false,
        read_only: true,
        ..Options::default()
    };
    let store = Store::open(dir, opts, berth::clock::system()).map_err(OpError::from)?;
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
