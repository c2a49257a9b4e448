//! Command handlers: a task kind run by an external program.
//!
//! The argv runs as written (never through a shell unless the user writes
//! one), in its own process group, with the payload as JSON on stdin and
//! `BERTH_TASK_ID`, `BERTH_TASK_KIND`, `BERTH_TASK_NAME`, `BERTH_TASK_QUEUE`,
//! `BERTH_ATTEMPT` and `BERTH_NODE` in its environment. Exit 0 is success
//! (stdout becomes the result), exit 75 (EX_TEMPFAIL) asks to run again,
//! anything else fails with the last line of stderr. On timeout the whole
//! process group is killed. Files berth opens are close-on-exec, so the
//! handler does not inherit the database or the socket.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::engine::handler::{Handler, Outcome, RunResult, TaskContext};
use crate::units::format_duration;

/// EX_TEMPFAIL: run the task again at once.
pub const EXIT_REPEAT: i32 = 75;
/// How much of stderr a failure message keeps.
const STDERR_KEEP: usize = 4096;

/// Process groups of handlers running now, so a stop can end them.
static RUNNING: std::sync::Mutex<std::collections::BTreeSet<i32>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Registers a running handler's process group for its lifetime.
struct Running(i32);

impl Running {
    fn new(pgid: i32) -> Self {
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pgid);
        Running(pgid)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.0);
    }
}

/// Kills the process group of every handler still running (after a stop
/// whose grace period ran out). Returns how many there were.
pub fn kill_running() -> usize {
    let groups = RUNNING.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for g in &groups {
        // SAFETY: kill(2) on process groups berth started.
        unsafe {
            libc::kill(-g, libc::SIGKILL);
        }
    }
    groups.len()
}

/// One argv with where and how to run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandHandler {
    pub run: CommandSpec,
    pub pre: Option<CommandSpec>,
    pub post: Option<CommandSpec>,
    /// The most stdout kept as a result.
    pub max_output: usize,
}

/// How a process ended.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr_tail: Vec<u8>,
    pub timed_out: bool,
}

fn read_capped(mut r: impl Read, cap: usize, keep_tail: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > cap {
                    if keep_tail {
                        let cut = out.len() - cap;
                        out.drain(..cut);
                    } else {
                        out.truncate(cap);
                        // Keep draining so the child never blocks on a full pipe.
                    }
                }
            }
        }
    }
}

/// Runs `spec` for `ctx`, feeding `stdin`.
pub fn run_command(
    spec: &CommandSpec,
    ctx: &TaskContext,
    stdin: &[u8],
    max_output: usize,
) -> Result<Finished, String> {
    let Some((prog, args)) = spec.argv.split_first() else {
        return Err("the command is empty".into());
    };
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .current_dir(&spec.cwd)
        .envs(&spec.env)
        .env("BERTH_TASK_ID", ctx.task.id.to_string())
        .env("BERTH_TASK_KIND", &ctx.task.kind)
        .env("BERTH_TASK_NAME", &ctx.task.name)
        .env("BERTH_TASK_QUEUE", &ctx.task.queue)
        .env("BERTH_ATTEMPT", ctx.attempt.to_string())
        .env("BERTH_NODE", ctx.node.clone().unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: prctl(2) is async-signal-safe; the handler dies with berth
    // (a crash, kill -9) instead of running on beside its own re-run.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {prog}: {e}"))?;
    let pid = child.id() as i32;
    let _running = Running::new(pid);
    let mut input = child.stdin.take();
    let body = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        if let Some(i) = input.as_mut() {
            let _ = i.write_all(&body);
        }
    });
    let out = child.stdout.take();
    let err = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        out.map(|o| read_capped(o, max_output, false))
            .unwrap_or_default()
    });
    let err_t = std::thread::spawn(move || {
        err.map(|e| read_capped(e, STDERR_KEEP, true))
            .unwrap_or_default()
    });
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let (status, timed_out) = match rx.recv_timeout(spec.timeout) {
        Ok(s) => (s, false),
        Err(_) => {
            // SAFETY: kill(2) on our own child's process group.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
            (
                rx.recv()
                    .unwrap_or_else(|_| Err(std::io::Error::other("lost the child"))),
                true,
            )
        }
    };
    let _ = waiter.join();
    // Grandchildren may hold the pipes open: kill the group before reading to the end.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
    let _ = writer.join();
    let stdout = out_t.join().unwrap_or_default();
    let stderr_tail = err_t.join().unwrap_or_default();
    let status = status.map_err(|e| format!("waiting for {prog}: {e}"))?;
    Ok(Finished {
        code: status.code(),
        signal: status.signal(),
        stdout,
        stderr_tail,
        timed_out,
    })
}

/// The failure message: the last non-empty line of stderr, else the exit.
fn failure_message(f: &Finished) -> String {
    let text = String::from_utf8_lossy(&f.stderr_tail);
    let line = text.lines().rev().map(str::trim).find(|l| !l.is_empty());
    match (line, f.code, f.signal) {
        (Some(l), _, _) => l.to_string(),
        (None, Some(c), _) => format!("exited with code {c}"),
        (None, None, Some(s)) => format!("killed by signal {s}"),
        _ => "exited abnormally".into(),
    }
}

impl CommandHandler {
    fn check(&self, spec: &CommandSpec, ctx: &TaskContext) -> Result<(), String> {
        let stdin = serde_json::to_vec(&ctx.payload).unwrap_or_default();
        let f = run_command(spec, ctx, &stdin, 64 * 1024)?;
        if f.timed_out {
            return Err(format!("timed out after {}", format_duration(spec.timeout)));
        }
        if f.code == Some(0) {
            Ok(())
        } else {
            Err(failure_message(&f))
        }
    }
}

impl Handler for CommandHandler {
    fn pre(&self, ctx: &TaskContext) -> Result<(), String> {
        match &self.pre {
            Some(p) => self.check(p, ctx),
            None => Ok(()),
        }
    }

    fn run(&self, ctx: &TaskContext) -> Outcome {
        let stdin = serde_json::to_vec(&ctx.payload).unwrap_or_default();
        let f = match run_command(&self.run, ctx, &stdin, self.max_output) {
            Ok(f) => f,
            Err(e) => return Outcome::fail(e),
        };
        if f.timed_out {
            return Outcome::fail(format!(
                "timed out after {}",
                format_duration(self.run.timeout)
            ));
        }
        match f.code {
            Some(0) => {
                let text = String::from_utf8_lossy(&f.stdout);
                let trimmed = text.trim();
                let output = if trimmed.is_empty() {
                    None
                } else {
                    Some(
                        serde_json::from_str(trimmed)
                            .unwrap_or_else(|_| serde_json::Value::String(trimmed.to_string())),
                    )
                };
                Outcome {
                    output,
                    ..Outcome::success()
                }
            }
            Some(EXIT_REPEAT) => Outcome::new(RunResult::Repeat),
            _ => Outcome::fail(failure_message(&f)),
        }
    }

    fn post(&self, ctx: &TaskContext, _outcome: &Outcome) -> Result<(), String> {
        match &self.post {
            Some(p) => self.check(p, ctx),
            None => Ok(()),
        }
    }
}
