//! The commands. Each opens the data dir, does one thing, and prints its
//! result on stdout; errors go back to `main` as [`CliError`]s.

use std::io::Write;
use std::path::Path;

use berth::clock;
use berth::report;
use berth::store::{OpenError, Options, Placement, Store, WriteError};
use berth::submit::{self, EnqueueError};
use berth::task::TaskSpec;

use super::args::{Cli, Command, EnqueueArgs, Format, QueueCommand, TaskCommand};
use super::{CliError, EXIT_INPUT, EXIT_RUNTIME};

pub fn run(cli: Cli) -> Result<(), CliError> {
    let dir = cli.data_dir.as_path();
    match cli.command {
        Command::Run(a) => super::daemon::run(a),
        Command::Enqueue(a) => enqueue(dir, *a),
        Command::Queue(QueueCommand::List { output, show_empty }) => {
            queue_list(dir, output, show_empty)
        }
        Command::Task(TaskCommand::Show { id, output }) => task_show(dir, id, output),
        Command::Task(TaskCommand::Remove { id }) => task_remove(dir, id),
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

fn open(dir: &Path, create: bool) -> Result<Store, OpenError> {
    let opts = Options {
        create,
        ..Options::default()
    };
    Store::open(dir, opts, clock::system())
}

/// Opens for reading: a data dir that does not exist yet reads as empty.
fn open_for_read(dir: &Path) -> Result<Option<Store>, CliError> {
    match open(dir, false) {
        Ok(s) => Ok(Some(s)),
        Err(OpenError::Missing { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
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

fn enqueue(dir: &Path, a: EnqueueArgs) -> Result<(), CliError> {
    if let Some(batch) = a.batch {
        let text = read_file(&batch, "batch file")?;
        let specs = submit::parse_batch(&text)
            .map_err(|e| CliError::input(format!("batch file {}: {e}", batch.display())))?;
        let store = open(dir, true)?;
        let ids = submit::enqueue_batch(&store, specs)
            .map_err(|e| enqueue_error(e, &format!("batch file {}: ", batch.display())))?;
        let text: String = ids.iter().map(|id| format!("{id}\n")).collect();
        return out(&text);
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
    let placement = match (a.first, a.after, a.before) {
        (true, _, _) => Placement::First,
        (_, Some(id), _) => Placement::After(id),
        (_, _, Some(id)) => Placement::Before(id),
        _ => Placement::Last,
    };
    let store = open(dir, true)?;
    let id = submit::enqueue_one(&store, spec, placement).map_err(|e| enqueue_error(e, ""))?;
    out(&format!("{id}\n"))
}

fn queue_list(dir: &Path, output: Format, show_empty: bool) -> Result<(), CliError> {
    let store = open_for_read(dir)?;
    let queues = match &store {
        Some(s) => report::snapshot(s, 10, &|_| String::new()),
        None => {
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
    };
    match output {
        Format::Text => out(&report::render_text(&queues, show_empty)),
        Format::Json => out(&format!("{}\n", report::render_json(&queues))),
    }
}

fn task_show(dir: &Path, id: u64, output: Format) -> Result<(), CliError> {
    let store = open_for_read(dir)?.ok_or_else(|| CliError::runtime(format!("no task {id}")))?;
    let task = store
        .task(id)
        .map_err(|e| CliError::runtime(e.to_string()))?
        .ok_or_else(|| CliError::runtime(format!("no task {id}")))?;
    match output {
        Format::Text => out(&report::task_text(&task, store.budget())),
        Format::Json => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report::task_json(&task, store.budget()))
                .unwrap_or_default()
        )),
    }
}

fn task_remove(dir: &Path, id: u64) -> Result<(), CliError> {
    let store = open_for_read(dir)?.ok_or_else(|| CliError::runtime(format!("no task {id}")))?;
    let mut w = store.write();
    let removed = w.remove(id).map_err(|e| match e {
        WriteError::NoSuchTask(_) | WriteError::WrongState { .. } => {
            CliError::runtime(e.to_string())
        }
        other => CliError::runtime(format!("removing task {id}: {other}")),
    })?;
    w.commit()
        .map_err(|e| CliError::runtime(format!("removing task {id}: {e}")))?;
    let list: Vec<String> = removed.iter().map(u64::to_string).collect();
    out(&format!("removed {}\n", list.join(" ")))
}

fn verify(dir: &Path) -> Result<(), CliError> {
    let store = open_for_read(dir)?;
    let Some(store) = store else {
        return out("no data dir; nothing to verify\n");
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
