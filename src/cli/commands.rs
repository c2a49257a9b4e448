//! The commands other than `berth run`. Each turns its arguments into an
//! `ops::Request`, runs it through [`session::run`] (the daemon when one
//! answers, else the same operation on the data dir opened here), and prints
//! the answer. So a command's output and exit code do not depend on whether
//! a daemon runs.

use berth::ops::{Access, Ctx, OpError, Request, TaskFilter};
use berth::report;
use berth::report::TaskRow;
use berth::store::Store;
use berth::submit::{self, EnqueueError};
use berth::task::TaskSpec;
use berth::units;
use serde_json::Value;

use super::args::{
    Cli, Command, EnqueueArgs, ExportArgs, Format, ImportArgs, ListArgs, QueueCommand, TaskCommand,
};
use super::session::Session;
use super::{CliError, now_ms, out, read_file, terminal_width};

pub fn run(cli: Cli, data_dir_from: Option<&'static str>) -> Result<(), CliError> {
    super::check_now_env()?;
    let s = Session::from_args(&cli, data_dir_from)?;
    let s = &s;
    match cli.command {
        Command::Run(a) => super::daemon::run(a, s),
        Command::Enqueue(a) => enqueue(s, *a),
        Command::Queue(QueueCommand::List {
            output,
            show_empty,
            all,
            watch,
            interval,
        }) => {
            let shown = Shown { show_empty, all };
            if watch {
                return watch_queues(s, output, shown, interval);
            }
            out(&queue_list(s, output, shown)?)
        }
        Command::Task(TaskCommand::Show { id, output }) => task_show(s, id, output),
        Command::Task(TaskCommand::Remove { id, history }) => task_remove(s, id, history),
        Command::Task(TaskCommand::Retry { id }) => task_retry(s, id),
        Command::Task(TaskCommand::List(a)) => task_list(s, a),
        Command::Task(TaskCommand::Log {
            id,
            attempt,
            follow,
            output,
        }) => super::tasklog::run(s, id, attempt, follow, output),
        Command::Task(TaskCommand::Cancel { id }) => task_cancel(s, id),
        Command::Verify => verify(s),
        Command::Log(a) => super::replay::log(s, a),
        Command::Replay { at, seq, output } => super::replay::replay(s, at, seq, output),
        Command::Check => check(s),
        Command::Metrics { output } => metrics(s, output),
        Command::Export(a) => export(s, a),
        Command::Import(a) => import(s, a),
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

/// Reads a batch file and checks every entry (its spec, its payload
/// against `budget`, its kind against `kinds` when a config gives them), so
/// that a bad file is refused before anything is sent or opened.
pub(super) fn read_batch(
    file: &std::path::Path,
    budget: &berth::budget::Budget,
    kinds: Option<&[String]>,
) -> Result<Vec<TaskSpec>, CliError> {
    let source = format!("batch file {}: ", file.display());
    let text = read_file(file, "batch file", super::MAX_BATCH_FILE)?;
    let tasks = submit::parse_batch(&text).map_err(|e| CliError::input(format!("{source}{e}")))?;
    submit::check(&tasks, budget, true)
        .map_err(|e| CliError::from(OpError::from(e).context(&source)))?;
    Ctx::direct(None, kinds)
        .check_kinds(&tasks, true)
        .map_err(|e| e.context(&source))?;
    Ok(tasks)
}

fn enqueue(s: &Session, a: EnqueueArgs) -> Result<(), CliError> {
    if let Some(batch) = a.batch {
        let source = format!("batch file {}: ", batch.display());
        let tasks = read_batch(&batch, &s.budget, s.kinds().as_deref())?;
        if tasks.is_empty() {
            // Nothing to add: nothing to open, and no data dir to make.
            return Ok(());
        }
        let ids = s
            .run(Request::EnqueueBatch { tasks })
            .map_err(|e| e.context(&source))?;
        return print_ids(&ids_of(&ids));
    }
    let payload = match (&a.payload, &a.payload_file) {
        (Some(p), _) => serde_json::from_str(p)
            .map_err(|e| CliError::input(format!("--payload is not valid JSON: {e}")))?,
        (None, Some(f)) => {
            // Room for a payload's whitespace: its JSON is stored compact.
            let max = (s.budget.max_decompressed as u64).saturating_mul(4);
            let text = read_file(f, "payload file", max)?;
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
        target: (!a.target.is_empty()).then(|| a.target.join(",")),
        compaction_key: a.compaction_key,
        ttl: a.ttl,
    };
    // Check the spec (and its payload against the budget) before anything
    // is sent or opened: a refused enqueue changes nothing, with a daemon or
    // without.
    if let Err(EnqueueError::Invalid { field, reason, .. }) =
        submit::check(std::slice::from_ref(&spec), &s.budget, false)
    {
        // A record over the budget is no one flag's fault.
        if field == submit::RECORD {
            return Err(CliError::input(reason));
        }
        let flag = match flag_of(field) {
            f if f == "payload" && a.payload_file.is_some() => "payload-file".to_string(),
            f => f,
        };
        return Err(CliError::input(format!("--{flag}: {reason}")));
    }
    let kinds = s.kinds();
    if let Some(why) = Ctx::direct(None, kinds.as_deref()).no_handler(&spec.kind) {
        return Err(CliError::input(format!("--kind: {why}")));
    }
    let req = Request::Enqueue {
        spec: Box::new(spec),
        first: a.first,
        after: a.after,
        before: a.before,
    };
    // A daemon (which knows its handlers when this command has no config)
    // names the spec's field; here it is the flag.
    let ids = s
        .run(req)
        .map_err(|e| match e.message.strip_prefix(berth::ops::KIND_FIELD) {
            Some(why) if e.class == berth::ops::Class::Input => {
                OpError::input(format!("--kind: {why}"))
            }
            _ => e,
        })?;
    print_ids(&ids_of(&ids))
}

/// The `enqueue` flag that gives a spec's field.
fn flag_of(field: &str) -> String {
    match field {
        "tags" => "tag".into(),
        f => f.replace('_', "-"),
    }
}

/// What `queue list` shows: queues with no tasks too, every task.
#[derive(Debug, Clone, Copy)]
struct Shown {
    show_empty: bool,
    all: bool,
}

fn queue_list(s: &Session, output: Format, shown: Shown) -> Result<String, CliError> {
    let v = s.run(Request::QueueList { all: shown.all })?;
    render_queues(&v, output, shown.show_empty)
}

/// `queue list`'s output of its wire form (also `replay`'s).
pub(super) fn render_queues(
    v: &Value,
    output: Format,
    show_empty: bool,
) -> Result<String, CliError> {
    let queues = report::views_from_json(v).map_err(CliError::runtime)?;
    Ok(match output {
        Format::Text => report::render_text(&queues, show_empty),
        Format::Json => format!("{}\n", report::render_json(&queues)),
    })
}

/// A time flag (`--since`, `--until`, `--at`): RFC 3339 or a duration ago.
pub(super) fn time_flag(flag: &str, t: Option<&str>, now: u64) -> Result<Option<u64>, CliError> {
    t.map(|t| units::parse_time(t, now))
        .transpose()
        .map_err(|e| CliError::input(format!("--{flag}: {e}")))
}

/// `queue list --watch`: redraws every `interval` until interrupted, or
/// until the reader of its pipe has gone. On a
/// terminal it clears the screen first; into a pipe it writes plain frames
/// (text: each after a `# TIME` line; JSON: one line each). A daemon that
/// starts or stops meanwhile changes nothing but where the answer comes
/// from; an error is shown in its frame, and the watch goes on.
fn watch_queues(
    s: &Session,
    output: Format,
    shown: Shown,
    interval: std::time::Duration,
) -> Result<(), CliError> {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    loop {
        // With `-o json` an error is a JSON document too (`{"error": ...}`),
        // so that a reader of one document per line can read every line.
        let frame = queue_list(s, output, shown).unwrap_or_else(|e| match output {
            Format::Text => format!("berth: {e}\n"),
            Format::Json => format!("{}\n", serde_json::json!({ "error": e.to_string() })),
        });
        let text = match (tty, output) {
            (true, _) => format!("\x1b[H\x1b[2J{frame}"),
            (false, Format::Text) => format!("# {}\n{frame}\n", units::format_time(now_ms())),
            (false, Format::Json) => frame,
        };
        if !super::out_open(&text)? {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

fn task_show(s: &Session, id: u64, output: Format) -> Result<(), CliError> {
    let j = report::task_from_wire(s.run(Request::TaskShow { id })?);
    match output {
        Format::Text => out(&report::task_text(&j, now_ms())),
        Format::Json => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&j).unwrap_or_default()
        )),
    }
}

fn task_remove(s: &Session, id: u64, history: bool) -> Result<(), CliError> {
    let removed = ids_of(&s.run(Request::TaskRemove { id, history })?);
    let list: Vec<String> = removed.iter().map(u64::to_string).collect();
    out(&format!("removed {}\n", list.join(" ")))
}

fn task_cancel(s: &Session, id: u64) -> Result<(), CliError> {
    let cancelled = ids_of(&s.run(Request::TaskCancel { id })?);
    let list: Vec<String> = cancelled.iter().map(u64::to_string).collect();
    out(&format!("cancelled {}\n", list.join(" ")))
}

fn task_retry(s: &Session, id: u64) -> Result<(), CliError> {
    s.run(Request::TaskRetry { id })?;
    out(&format!("retried {id}\n"))
}

fn task_list(s: &Session, a: ListArgs) -> Result<(), CliError> {
    let now = now_ms();
    let time = |flag: &str, t: &Option<String>| time_flag(flag, t.as_deref(), now);
    let filter = TaskFilter {
        queues: a.queue,
        kinds: a.kind,
        statuses: a.status,
        since_ms: time("since", &a.since)?,
        until_ms: time("until", &a.until)?,
        name: a.name,
        targets: a.target,
    };
    filter.validate()?;
    let v = s.run(Request::TaskList { filter })?;
    let rows: Vec<TaskRow> = serde_json::from_value(v)
        .map_err(|e| CliError::runtime(format!("the task list is malformed: {e}")))?;
    match a.output {
        Format::Text => out(&report::render_task_table(&rows, now, terminal_width())),
        Format::Json => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        )),
    }
}

/// `berth metrics`: the Prometheus text format (or the families as JSON).
fn metrics(s: &Session, output: Format) -> Result<(), CliError> {
    let v = s.run(Request::Metrics {})?;
    let families: Vec<berth::metrics::Family> = serde_json::from_value(v)
        .map_err(|e| CliError::runtime(format!("the metrics are malformed: {e}")))?;
    match output {
        Format::Text => out(&berth::metrics::render(&families)),
        Format::Json => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&families).unwrap_or_default()
        )),
    }
}

/// `berth check`: the config was loaded (and so checked) with the session;
/// says what it found.
fn check(s: &Session) -> Result<(), CliError> {
    let mut c = s
        .config
        .clone()
        .ok_or_else(|| CliError::input("berth check needs --config FILE (or BERTH_CONFIG)"))?;
    // As `berth run` would: `--data-dir` or `BERTH_DATA_DIR` wins.
    c.data_dir = s.dir.clone();
    super::daemon::check_backup_folder(&c)?;
    super::daemon::check_data_dir(s, &c)?;
    let kinds: Vec<&str> = c.handlers.keys().map(String::as_str).collect();
    out(&format!(
        "ok: {}: data dir {}, node {}, {} parallel queues, {} handler(s): {}\n",
        c.path.display(),
        c.data_dir.display(),
        c.node.as_deref().unwrap_or("-"),
        c.engine.parallel_queues,
        kinds.len(),
        kinds.join(", ")
    ))
}

/// `verify` opens the data dir itself (never through a daemon): it replays
/// the whole log against the state, which needs the store at rest.
fn verify(s: &Session) -> Result<(), CliError> {
    let opts = s.options(Access::Read);
    let store = Store::open(s.dir(), opts, berth::clock::system()).map_err(OpError::from)?;
    let progress = super::progress::Progress::new("events replayed");
    let diffs =
        berth::retention::verify(&store, &mut |n, total| progress.set(n, total)).map_err(|e| {
            CliError::runtime(format!(
                "data dir {}: replaying the log: {e}",
                s.dir().display()
            ))
        })?;
    progress.finish();
    // The archive, which the replay above (from the log's start) does not read.
    let progress = super::progress::Progress::new("archived events read");
    let archive_end = store.log_start().unwrap_or(1);
    let archive = berth::replay::check_archive(&store, &mut |n| progress.set(n, archive_end));
    progress.finish();
    let corrupt = store.corrupt_records();
    for c in corrupt {
        eprintln!("berth: {c}");
    }
    if let Err(e) = &archive {
        eprintln!("berth: the archive: {e}");
    }
    if let (true, true, Ok(archive)) = (diffs.is_empty(), corrupt.is_empty(), &archive) {
        let (start, last) = (store.log_start().unwrap_or(1), store.next_seq() - 1);
        let from = if start > 1 {
            format!(
                " (events {start} to {last}, from the checkpoint of event {})",
                start - 1
            )
        } else {
            String::new()
        };
        let archived = match archive.events {
            Some((first, last)) => format!("; the archive's events {first} to {last} read whole"),
            None => String::new(),
        };
        let archived = match archive.checkpoints {
            0 => archived,
            1 => format!("{archived}; 1 checkpoint read whole"),
            n => format!("{archived}; {n} checkpoints read whole"),
        };
        return out(&format!(
            "ok: {} events replayed{from}; the log agrees with the state{archived}\n",
            last + 1 - start
        ));
    }
    for d in &diffs {
        eprintln!("berth: {d}");
    }
    Err(CliError::runtime(format!(
        "data dir {}: {} disagreement(s) between the log and the state, {} corrupt record(s){}",
        s.dir().display(),
        diffs.len(),
        corrupt.len(),
        match archive {
            Ok(_) => "",
            Err(_) => ", the archive cannot be read whole",
        }
    )))
}

/// A private temporary folder for a file that stands for standard input
/// or output (a daemon reads or writes it: same user, same machine).
fn private_tempdir() -> Result<tempfile::TempDir, CliError> {
    tempfile::Builder::new()
        .prefix("berth-transfer-")
        .tempdir()
        .map_err(|e| CliError::runtime(format!("creating a temporary folder: {e}")))
}

fn absolute(path: &std::path::Path) -> Result<std::path::PathBuf, CliError> {
    std::path::absolute(path).map_err(|e| CliError::input(format!("{}: {e}", path.display())))
}

/// `berth export`: the daemon (or this command, on the data dir opened to
/// read) writes the file; `-o -` goes through a private temporary file.
fn export(s: &Session, a: ExportArgs) -> Result<(), CliError> {
    use std::io::{IsTerminal, Write};
    let sel = berth::ops::Selection {
        queues: a.queue,
        statuses: a.status,
        history: a.history,
        targets: a.target,
    };
    sel.validate()?;
    let to_stdout = a.output.as_os_str() == "-";
    if to_stdout && std::io::stdout().is_terminal() {
        return Err(CliError::input(
            "-o -: standard output is a terminal; an export file is binary (redirect it, or \
             give a file)",
        ));
    }
    let tmp = if to_stdout {
        Some(private_tempdir()?)
    } else {
        None
    };
    let path = match &tmp {
        Some(t) => t.path().join("export.bex"),
        None => absolute(&a.output)?,
    };
    // The request names the file as text, to a daemon too.
    if path.to_str().is_none() {
        return Err(CliError::input(format!(
            "-o {}: the path is not valid UTF-8",
            a.output.display()
        )));
    }
    let v = s.run(Request::Export {
        path: path.clone(),
        queues: sel.queues,
        statuses: sel.statuses,
        history: sel.history,
        targets: sel.targets,
    })?;
    let to = if to_stdout {
        let bytes = std::fs::read(&path)
            .map_err(|e| CliError::runtime(format!("reading {}: {e}", path.display())))?;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(&bytes)
            .and_then(|()| stdout.flush())
            .map_err(|e| CliError::runtime(format!("writing to standard output: {e}")))?;
        "standard output".to_string()
    } else {
        a.output.display().to_string()
    };
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    eprintln!(
        "exported {} tasks ({} queues, {} groups) to {to}, {}",
        n("tasks"),
        n("queues"),
        n("groups"),
        units::format_size(n("bytes"))
    );
    Ok(())
}

/// `berth import`: the file is read and checked here first (format,
/// names, budget, kinds), so a bad one changes nothing and creates
/// nothing; then the daemon (or this command) reads it again and adds it.
/// What the daemon could not read again by its path (standard input, a
/// pipe such as `<(...)`, a device, a path that is not UTF-8, which a
/// request cannot carry) goes through a private temporary copy.
fn import(s: &Session, a: ImportArgs) -> Result<(), CliError> {
    let from_stdin = a.file.as_os_str() == "-";
    let by_path = !from_stdin
        && a.file.to_str().is_some()
        && std::fs::metadata(&a.file).map_or(true, |m| m.is_file());
    let tmp = if by_path {
        None
    } else {
        Some(private_tempdir()?)
    };
    let (path, label) = match &tmp {
        Some(t) => {
            let label = match from_stdin {
                true => "standard input".to_string(),
                false => a.file.display().to_string(),
            };
            // Its first bytes are checked before the rest is read.
            let bytes = match from_stdin {
                true => berth::ops::read_export_bytes(std::io::stdin(), None, &label)?,
                false => {
                    let f = std::fs::File::open(&a.file).map_err(|e| {
                        CliError::input(format!("cannot read export file {label}: {e}"))
                    })?;
                    let size = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
                    berth::ops::read_export_bytes(f, size, &label)?
                }
            };
            let path = t.path().join("import.bex");
            std::fs::write(&path, &bytes)
                .map_err(|e| CliError::runtime(format!("writing {}: {e}", path.display())))?;
            (path, label)
        }
        None => (absolute(&a.file)?, a.file.display().to_string()),
    };
    let export = berth::ops::read_export(&path, &label)?;
    let kinds = s.kinds();
    berth::ops::check_import(
        &export,
        &label,
        &s.budget,
        &Ctx::direct(None, kinds.as_deref()),
        now_ms(),
    )?;
    let v = s.run(Request::Import {
        path,
        label: Some(label),
    })?;
    match a.output {
        Format::Json => out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        )),
        Format::Text => {
            let n = v.get("tasks").and_then(Value::as_u64).unwrap_or(0);
            let (first, last) = (
                v.get("first").and_then(Value::as_u64),
                v.get("last").and_then(Value::as_u64),
            );
            match (first, last) {
                (Some(a), Some(b)) => out(&format!("imported {n} tasks: ids {a}..{b}\n")),
                _ => out(&format!("imported {n} tasks\n")),
            }
        }
    }
}
