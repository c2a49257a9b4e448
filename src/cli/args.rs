//! The command line, as clap sees it.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The exit codes, as every command's `--help` ends.
const EXIT_CODES: &str = "Exit codes:
  0  success
  1  runtime error: no such task, a wrong state, not enough disk space, a damaged or
     lost data dir, a disk failure, a daemon that did not answer within --timeout,
     `verify` found disagreements, `berth run --until-idle` ended with a dead letter
  2  bad input: unknown flags, an invalid spec, payload or batch file, a config error
  3  the data dir is in use: another daemon, a daemon too busy, a command that
     waited too long for another
  4  `berth run` only: the store failed to write; the daemon stopped at once";

#[derive(Debug, Parser)]
#[command(
    name = "berth",
    version,
    about = "A durable, ordered task engine for edge nodes",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// The data dir (created on first write). It wins over the config's
    /// `data_dir`; without either, ./berth-data.
    #[arg(
        long,
        global = true,
        env = "BERTH_DATA_DIR",
        default_value = "berth-data",
        hide_default_value = true
    )]
    pub data_dir: PathBuf,
    /// How long a command waits for a running daemon to answer (connecting,
    /// sending and reading, all told; e.g. 30s, 500ms), before it gives up
    /// with exit code 1, and for a starting daemon's socket (exit code 3).
    #[arg(
        long,
        global = true,
        env = "BERTH_TIMEOUT",
        default_value = "30s",
        value_parser = parse_timeout
    )]
    pub timeout: std::time::Duration,
    /// The daemon's TOML config. `berth run` needs it; the other commands
    /// take from it the data dir (unless --data-dir says otherwise), the
    /// size budget, the disk reserve, write_ahead_log and the kinds that
    /// have a handler (an enqueue of another kind is refused).
    #[arg(long, global = true, env = "BERTH_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the engine as a daemon (until SIGTERM/SIGINT/SIGHUP, or until idle).
    Run(RunArgs),
    /// Add a task, or a batch of tasks from a JSON file.
    Enqueue(Box<EnqueueArgs>),
    /// Inspect queues.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Inspect or remove one task.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Replay the event log and check that it agrees with the stored state.
    Verify,
    /// Print the event log as a timeline: every event, in order, with its
    /// time, number, task and details.
    Log(LogArgs),
    /// Rebuild the queues as they were at a moment from the event log, and
    /// print them as `queue list` does.
    Replay {
        /// The moment: RFC 3339 (2026-11-30T12:00:00Z) or a duration ago
        /// (90m); the state after the last event at or before it.
        #[arg(long, conflicts_with = "seq")]
        at: Option<String>,
        /// The state right after this event.
        #[arg(long)]
        seq: Option<u64>,
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: Format,
    },
    /// Check a config (--config FILE) as `berth run` would, and also what it
    /// names on this machine (every handler's command and folder).
    Check,
    /// Print metrics in the Prometheus text format: queue lengths, tasks by
    /// kind and outcome, attempt durations, waits, disk use; through a
    /// running daemon also its own (steps, flushes).
    Metrics {
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: Format,
    },
    /// Write tasks to an export file, to move them to another data dir with
    /// `berth import`: every live task (a running one counts as queued),
    /// in queue order, or those the filters select; a group goes whole.
    Export(ExportArgs),
    /// Add the tasks of an export file, all or nothing, with new ids, at
    /// the end of their queues; a task that was running comes back queued.
    Import(ImportArgs),
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The export file to write (`-`: standard output). It is written to a
    /// temporary file beside it and renamed, never seen half written.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
    /// Only tasks of this queue (repeatable).
    #[arg(long)]
    pub queue: Vec<String>,
    /// Only tasks in this state (repeatable), as for `task list`: queued,
    /// running, waiting, live, elsewhere; with --history also succeeded,
    /// failed, cancelled, expired, dead, history.
    #[arg(long)]
    pub status: Vec<String>,
    /// Also take finished tasks (the history).
    #[arg(long)]
    pub history: bool,
    /// Only tasks targeted at this node (repeatable, or comma-separated),
    /// as `task list --target` selects them: what that node should take.
    #[arg(long, value_name = "NODE", value_delimiter = ',')]
    pub target: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// The export file (`-`: standard input).
    pub file: PathBuf,
    /// text: `imported N tasks: ids A..B`; json: also the old -> new id map.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Format,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Exit once nothing is left for this node to run (tasks for other nodes
    /// may stay queued): 0 if every task succeeded, 1 if any ended as a
    /// dead letter.
    #[arg(long)]
    pub until_idle: bool,
    /// A batch file to add at start (all or nothing).
    #[arg(long)]
    pub enqueue: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// A JSON file with an array of task specs (or {"tasks": [...]}), added
    /// all or nothing; `-` reads standard input.
    #[arg(long, conflicts_with_all = ["queue", "kind", "name", "description", "weight", "payload", "payload_file", "tag", "target", "compaction_key", "ttl", "first", "after", "before"])]
    pub batch: Option<PathBuf>,
    /// The queue to add the task to ([A-Za-z0-9_.-], at most 64).
    #[arg(long, required_unless_present = "batch")]
    pub queue: Option<String>,
    /// The task's kind: which handler runs it.
    #[arg(long, required_unless_present = "batch")]
    pub kind: Option<String>,
    /// The task's name, as `queue list` shows it.
    #[arg(long, required_unless_present = "batch")]
    pub name: Option<String>,
    /// Free text shown after the name.
    #[arg(long)]
    pub description: Option<String>,
    /// The task's weight (in a batch, equal weights form a group).
    #[arg(long, allow_hyphen_values = true)]
    pub weight: Option<i64>,
    /// The payload as JSON text.
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// A file holding the JSON payload; `-` reads standard input.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// A tag (repeatable).
    #[arg(long = "tag")]
    pub tag: Vec<String>,
    /// A node that may run the task (repeatable, or comma-separated: any of
    /// them). Without one, any node whose tags fit runs it.
    #[arg(long)]
    pub target: Vec<String>,
    /// Merge into the task of the same kind with this key that waits in the
    /// queue, if there is one (it takes this payload and keeps its place;
    /// its id is printed), instead of adding another.
    #[arg(long)]
    pub compaction_key: Option<String>,
    /// The time to live (e.g. 10m): a task not started within it, counted
    /// from now, expires (it goes to the history as `expired` and never runs).
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Option<std::time::Duration>,
    /// Add at the head of the queue instead of the tail.
    #[arg(long, conflicts_with_all = ["after", "before"])]
    pub first: bool,
    /// Add right after this task.
    #[arg(long, conflicts_with = "before")]
    pub after: Option<u64>,
    /// Add right before this task.
    #[arg(long)]
    pub before: Option<u64>,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Show every queue and its tasks, as addon-operator's `queue list` does.
    List {
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: Format,
        /// Also show queues with no tasks.
        #[arg(long)]
        show_empty: bool,
        /// List every task of every queue (by default a queue lists its
        /// first 1,000 and says how many more it holds).
        #[arg(long)]
        all: bool,
        /// Redraw the list until interrupted.
        #[arg(long)]
        watch: bool,
        /// How often --watch redraws (e.g. 1s, 500ms).
        #[arg(long, default_value = "1s", value_parser = parse_interval)]
        interval: std::time::Duration,
    },
}

#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Show a task (live or finished), payload decoded.
    Show {
        /// The task's id (`berth task list` shows them; `enqueue` prints them).
        id: u64,
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: Format,
    },
    /// Remove a task (a group parent takes its children with it).
    Remove {
        /// The task's id.
        id: u64,
        /// Also remove a finished task (its record and attempt logs are deleted).
        #[arg(long)]
        history: bool,
    },
    /// Put a dead letter (a task that used up its attempts) back into its queue.
    Retry {
        /// The dead letter's id (`berth task list --status dead` lists them).
        id: u64,
    },
    /// List tasks, live and finished, with their ids.
    List(ListArgs),
    /// Show a task's recorded attempts: how each ended, and its stdout and stderr tails.
    Log {
        /// The task's id.
        id: u64,
        /// Only this attempt.
        #[arg(long, conflicts_with = "follow")]
        attempt: Option<u32>,
        /// Keep printing the running attempt's output until the task finishes.
        #[arg(long)]
        follow: bool,
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: Format,
    },
    /// Cancel a task: a queued one at once, a running one by stopping its handler.
    Cancel {
        /// The task's id.
        id: u64,
    },
}

/// `task list`'s filters: each flag may repeat; a task must match every
/// kind of filter given, and any value of one.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only tasks of this queue (repeatable).
    #[arg(long)]
    pub queue: Vec<String>,
    /// Only tasks of this kind (repeatable).
    #[arg(long)]
    pub kind: Vec<String>,
    /// Only tasks in this state (repeatable): queued, running, succeeded,
    /// failed, cancelled, expired, dead (dead letters), waiting (group children not
    /// yet in a queue), live (not finished), history (finished) or
    /// elsewhere (waiting for another node: its target or tags).
    #[arg(long)]
    pub status: Vec<String>,
    /// Only tasks whose last change (finished, else started, else queued) is
    /// at or after this time: RFC 3339 (2026-11-30T12:00:00Z) or a duration
    /// ago (90m).
    #[arg(long)]
    pub since: Option<String>,
    /// Only tasks whose last change is at or before this time.
    #[arg(long)]
    pub until: Option<String>,
    /// Only tasks whose name matches this pattern (`*` any run, `?` one
    /// character).
    #[arg(long)]
    pub name: Option<String>,
    /// Only tasks targeted at this node (repeatable, or comma-separated):
    /// those `export --target` takes.
    #[arg(long, value_delimiter = ',')]
    pub target: Vec<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Format,
}

/// `berth log`'s filters: an event must match every one given.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Only events about this task.
    #[arg(long)]
    pub task: Option<u64>,
    /// Only events about tasks in this queue (a task's queue is the one
    /// its last `enqueued` or `placed` event named).
    #[arg(long)]
    pub queue: Option<String>,
    /// Only events at or after this time: RFC 3339 (2026-11-30T12:00:00Z)
    /// or a duration ago (90m).
    #[arg(long)]
    pub since: Option<String>,
    /// Only events at or before this time.
    #[arg(long)]
    pub until: Option<String>,
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Format,
}

fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let d = berth::units::parse_duration(s)?;
    if d < std::time::Duration::from_millis(50) {
        return Err("the interval must be at least 50ms".into());
    }
    Ok(d)
}

fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    berth::ttl::parse(s).map_err(|e| match e.starts_with('\'') {
        true => e,
        false => format!("'{s}' {e}"),
    })
}

fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    let d = berth::units::parse_duration(s)?;
    if d.is_zero() {
        return Err("the timeout must be more than 0".into());
    }
    Ok(d)
}

/// The options whose value may come from the environment: clap's id, the
/// flag, the variable.
const FROM_ENV: [(&str, &str, &str); 3] = [
    ("data_dir", "--data-dir", "BERTH_DATA_DIR"),
    ("timeout", "--timeout", "BERTH_TIMEOUT"),
    ("config", "--config", "BERTH_CONFIG"),
];

/// Whether the command line (`args`, the program's name first) seems to
/// give `flag`: an argument before any `--` that is the flag or begins
/// with `flag=` (a value spelled like the flag is told apart after parsing,
/// by where clap says the value came from).
fn gives(args: &[OsString], flag: &str) -> bool {
    args.iter()
        .skip(1)
        .take_while(|a| a.to_str() != Some("--"))
        .any(|a| {
            a.to_str().is_some_and(|a| {
                a == flag || a.strip_prefix(flag).is_some_and(|v| v.starts_with('='))
            })
        })
}

/// The option of FROM_ENV that `e` blames, if any.
fn blamed(e: &clap::Error) -> Option<(&'static str, &'static str, &'static str)> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split(' ').next().unwrap_or(arg);
    FROM_ENV.iter().copied().find(|(_, f, _)| *f == flag)
}

/// Parses the command line. An option given on it wins over its
/// environment variable, even when the variable's value is bad: clap
/// checks a global option's variable for the subcommand too when the
/// option was given before the subcommand (`--timeout 5s queue list` with
/// `BERTH_TIMEOUT=abc` was refused), so such an error is parsed again
/// without that variable.
pub fn parse(args: &[OsString]) -> Result<clap::ArgMatches, clap::Error> {
    use clap::CommandFactory;
    use clap::parser::ValueSource;
    let mut cmd = Cli::command();
    // The variables left out, each with the error it gave.
    let mut dropped: Vec<(&str, clap::Error)> = Vec::new();
    for _ in 0..=FROM_ENV.len() {
        match cmd.clone().try_get_matches_from(args) {
            Err(e) => match blamed(&e).filter(|(_, flag, _)| gives(args, flag)) {
                Some((id, _, _)) if !dropped.iter().any(|(d, _)| *d == id) => {
                    cmd = cmd.mut_arg(id, |a| a.env(clap::builder::Resettable::Reset));
                    dropped.push((id, e));
                }
                _ => return Err(e),
            },
            Ok(m) => {
                // An option that only looked given (a value spelled like
                // it): its variable's error stands.
                return match dropped
                    .into_iter()
                    .find(|(id, _)| m.value_source(id) != Some(ValueSource::CommandLine))
                {
                    Some((_, e)) => Err(e),
                    None => Ok(m),
                };
            }
        }
    }
    cmd.try_get_matches_from(args)
}

/// A clearer message than clap's for two argument errors, given the
/// command line (`args`, the program's name first) and the environment
/// (`env`):
///
/// - a bad value taken from an environment variable, which clap blames on
///   the flag the command line never gave: the message names the variable;
/// - an argument that is not UTF-8, which clap reports without saying which:
///   the message gives its position, the flag it belongs to, and its bytes.
///
/// None when clap's own message says it already.
pub fn explain(
    e: &clap::Error,
    args: &[OsString],
    env: impl Fn(&str) -> Option<OsString>,
) -> Option<String> {
    if e.kind() == clap::error::ErrorKind::InvalidUtf8 {
        // Paths take any bytes: the argument to blame is the one that,
        // alone not UTF-8 among the arguments, still makes clap refuse.
        let alone_refused = |i: usize| {
            let only: Vec<OsString> = args
                .iter()
                .enumerate()
                .map(|(j, a)| match j == i || a.to_str().is_some() {
                    true => a.clone(),
                    false => OsString::from("x"),
                })
                .collect();
            matches!(parse(&only), Err(e) if e.kind() == clap::error::ErrorKind::InvalidUtf8)
        };
        let mut bad_ones = args
            .iter()
            .enumerate()
            .skip(1)
            .filter(|(_, a)| a.to_str().is_none());
        let (at, bad) = bad_ones
            .clone()
            .find(|(i, _)| alone_refused(*i))
            .or_else(|| bad_ones.next())?;
        let text = bad.to_string_lossy();
        let flag = match text.split_once('=') {
            Some((flag, _)) if flag.starts_with("--") => Some(flag.to_string()),
            _ => args[at - 1]
                .to_str()
                .filter(|f| at > 1 && f.len() > 1 && f.starts_with('-'))
                .map(str::to_string),
        };
        let of = flag.map_or(String::new(), |f| format!(" (the value of {f})"));
        return Some(format!(
            "argument {at}{of} is not valid UTF-8: {bad:?}; berth takes text there"
        ));
    }
    let (_, flag, var) = blamed(e)?;
    let value = env(var).filter(|_| !gives(args, flag))?;
    let why = match std::error::Error::source(e) {
        Some(source) => source.to_string(),
        None if value.is_empty() => "it is empty".to_string(),
        None => "it is not a valid value".to_string(),
    };
    Some(format!(
        "invalid value {value:?} in the environment variable {var} (which stands for {flag}): \
         {why}"
    ))
}
