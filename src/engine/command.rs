//! Command handlers: a task kind run by an external program.
//!
//! The argv runs as written (never through a shell unless the user writes
//! one), in its own process group, with the payload as JSON on stdin and
//! `BERTH_TASK_ID`, `BERTH_TASK_KIND`, `BERTH_TASK_NAME`, `BERTH_TASK_QUEUE`,
//! `BERTH_ATTEMPT` and `BERTH_NODE` in its environment. Exit 0 is success:
//! the result is the content of the file named by `BERTH_RESULT` (a fresh
//! private temp file per attempt) when the command wrote to it, else its
//! stdout. Exit 75 (EX_TEMPFAIL) asks to run again, anything else fails
//! with the last line of stderr. The timeout bounds the whole attempt (see
//! [`run_command`]): on timeout the whole process group is killed, and a
//! helper in another session that holds the pipes is not waited for. Files
//! berth opens are close-on-exec, so the handler does not inherit the
//! database or the socket.
//!
//! Everything each process prints goes to the attempt's live tails
//! (`live.rs`), which become its log. A cancel (`berth task cancel`) sends
//! SIGTERM to the process group, and SIGKILL after [`CANCEL_GRACE`] (or the
//! handler's timeout if that is shorter).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::budget;
use crate::engine::handler::{Handler, Outcome, RunResult, TaskContext};
use crate::engine::live::LiveAttempt;
use crate::units::{format_duration, format_size};

/// EX_TEMPFAIL: run the task again at once.
pub const EXIT_REPEAT: i32 = 75;
/// How much of stderr a failure message keeps.
const STDERR_KEEP: usize = 4096;
/// How long a cancelled handler's process group has between SIGTERM and
/// SIGKILL (less when the handler's timeout is shorter).
pub const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// The environment variable that names the file a command may write its
/// result to.
pub const RESULT_ENV: &str = "BERTH_RESULT";

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
    /// The most stdout read as a result (the budget's `max_decompressed`);
    /// more is cut, and the result is a `truncated` marker.
    pub max_output: usize,
}

/// How a process ended.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// stdout, at most `max_output` bytes; when more came, only its first
    /// [`budget::RESULT_HEAD`] bytes (all a truncated result keeps).
    pub stdout: Vec<u8>,
    /// More than `max_output` bytes came on stdout.
    pub stdout_cut: bool,
    pub stderr_tail: Vec<u8>,
    pub timed_out: bool,
    /// It was asked to stop (`berth task cancel`).
    pub cancelled: bool,
}

/// How long a pipe is still read after the direct child has exited, when a
/// process it left behind (even in another session) keeps the pipe open.
pub const DRAIN: Duration = Duration::from_millis(200);
/// How long to wait for a killed child to be reapable before leaving it to
/// a reaper thread (a process in uninterruptible sleep dies only later).
const KILL_WAIT: Duration = Duration::from_secs(2);
/// Without a pidfd (Linux before 5.3), how often the child is checked.
const TICK: Duration = Duration::from_millis(20);
/// The most bytes read from one pipe before the deadlines are checked again.
const READ_ROUND: usize = 1 << 20;

/// One of the child's output pipes (our end, non-blocking).
struct OutPipe {
    /// None once it reached EOF or failed.
    file: Option<File>,
    data: Vec<u8>,
    cap: usize,
    /// Keep the last `cap` bytes (stderr) instead of the first (stdout).
    tail: bool,
    /// What a head-kept pipe keeps once more than `cap` bytes came.
    keep_when_cut: usize,
    cut: bool,
}

impl OutPipe {
    fn new(file: Option<File>, cap: usize, tail: bool, keep_when_cut: usize) -> Self {
        OutPipe {
            file,
            data: Vec::new(),
            cap,
            tail,
            keep_when_cut,
            cut: false,
        }
    }

    fn keep(&mut self, chunk: &[u8]) {
        if self.tail {
            self.data.extend_from_slice(chunk);
            if self.data.len() > self.cap {
                let extra = self.data.len() - self.cap;
                self.data.drain(..extra);
            }
        } else if !self.cut {
            self.data.extend_from_slice(chunk);
            if self.data.len() > self.cap {
                self.cut = true;
                self.data.truncate(self.keep_when_cut.min(self.cap));
                self.data.shrink_to_fit();
            }
        }
        // A cut head-kept pipe is still drained, so the child never blocks on it.
    }

    /// Reads what is there now, up to [`READ_ROUND`] bytes, handing each
    /// chunk to `sink` too (the attempt's live tail).
    fn read_ready(&mut self, buf: &mut [u8], sink: &dyn Fn(&[u8])) {
        let mut read = 0;
        while let Some(f) = self.file.as_mut() {
            match f.read(buf) {
                Ok(0) => self.file = None,
                Ok(n) => {
                    sink(&buf[..n]);
                    self.keep(&buf[..n]);
                    read += n;
                    if read >= READ_ROUND {
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => self.file = None,
            }
        }
    }
}

/// The child's stdin (our end, non-blocking) and what is left to write.
struct InPipe {
    file: Option<File>,
    data: Vec<u8>,
    written: usize,
}

impl InPipe {
    /// Writes what the pipe takes now; closes it when all is written (or
    /// the child closed its end).
    fn write_ready(&mut self) {
        while let Some(f) = self.file.as_mut() {
            if self.written >= self.data.len() {
                self.file = None;
                return;
            }
            match f.write(&self.data[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => self.file = None,
            }
        }
    }
}

/// Our end of a child's pipe as a non-blocking file.
fn nonblocking(fd: impl Into<OwnedFd>) -> Option<File> {
    let fd: OwnedFd = fd.into();
    // SAFETY: fcntl(2) on a descriptor we own.
    let ok = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
    };
    ok.then(|| File::from(fd))
}

/// A pidfd for `pid` (readable once it exits), if the kernel has them.
fn pidfd(pid: i32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just returned to us and is owned by nobody else.
    Some(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether our child `pid` has exited, without reaping it: until it is
/// reaped its pid (and so its process group id) cannot be reused, so
/// killing the group stays safe.
fn has_exited(pid: i32) -> bool {
    // SAFETY: waitid(2) with WNOWAIT only looks; siginfo_t is plain data.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        // ECHILD: already reaped (not by us, but gone either way).
        (r == 0 && info.si_pid() == pid)
            || (r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
    }
}

/// Waits up to `limit` for `pid` to exit (polling its pidfd, else ticking).
fn wait_exit(pid: i32, pidfd: Option<&OwnedFd>, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        if has_exited(pid) {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        let mut wait = end - now;
        let mut fds = Vec::new();
        match pidfd {
            Some(fd) => fds.push(pollfd(fd.as_raw_fd(), libc::POLLIN)),
            None => wait = wait.min(TICK),
        }
        poll(&mut fds, wait);
    }
}

fn pollfd(fd: i32, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// poll(2) for at most `wait` (rounded up to whole milliseconds).
fn poll(fds: &mut [libc::pollfd], wait: Duration) {
    let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: fds is a valid, exclusively borrowed array of pollfd.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
        // Cannot happen with valid arguments; never spin if it does.
        std::thread::sleep(TICK);
    }
}

fn kill_group(pgid: i32) {
    signal_group(pgid, libc::SIGKILL);
}

fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: kill(2) on the process group of our own child, which we have
    // not reaped yet, so the id still names that group.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// How a process's turn ended (see [`pump`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The direct child exited (its output drained, or the drain ran out).
    Exited,
    /// The timeout passed first.
    TimedOut,
    /// It was cancelled and did not exit within its grace after SIGTERM.
    Stopped,
}

/// Runs `spec` for `ctx`, feeding `stdin`.
///
/// One loop polls stdin, stdout and stderr (non-blocking) and the child's
/// exit, so the timeout bounds the whole attempt whatever the handler's
/// descendants do with the pipes. The attempt ends
/// - when the direct child has exited and both output pipes reached EOF;
/// - or [`DRAIN`] after the direct child exited (at the latest at the
///   timeout), when something it left behind still holds a pipe: the exit
///   status counts, and the output read so far is the output;
/// - or at the timeout: the process group is killed and reading stops;
/// - or, after a cancel, when the process group had its grace after
///   SIGTERM ([`CANCEL_GRACE`], or the timeout if shorter) and the child
///   still runs.
///
/// Then whatever is left in the process group is killed and our pipe ends
/// are closed; no thread is left waiting on the handler's pipes. What the
/// process printed also went to `ctx.live`, which records how it ended.
/// `result_file`, if given, is named in `BERTH_RESULT`.
pub fn run_command(
    spec: &CommandSpec,
    ctx: &TaskContext,
    stdin: &[u8],
    max_output: usize,
    result_file: Option<&Path>,
) -> Result<Finished, String> {
    let Some(prog) = spec.argv.first() else {
        return Err("the command is empty".into());
    };
    if ctx.cancel_requested() {
        return Err("cancelled before it started".into());
    }
    let mut child = spawn(spec, ctx, result_file)?;
    let pid = child.id() as i32;
    let running = Running::new(pid);
    let deadline = Instant::now() + spec.timeout;
    let pidfd = pidfd(pid);
    let mut input = InPipe {
        file: child.stdin.take().and_then(nonblocking),
        data: stdin.to_vec(),
        written: 0,
    };
    let mut out = OutPipe::new(
        child.stdout.take().and_then(nonblocking),
        max_output,
        false,
        budget::RESULT_HEAD,
    );
    let mut err = OutPipe::new(
        child.stderr.take().and_then(nonblocking),
        STDERR_KEEP,
        true,
        0,
    );
    let live = &ctx.live;
    let grace = CANCEL_GRACE.min(spec.timeout);
    let pipes = Pipes {
        input: &mut input,
        out: &mut out,
        err: &mut err,
    };
    let ended = pump(pid, pidfd.as_ref(), deadline, pipes, live, grace);
    let (exited, timed_out) = (ended == Ended::Exited, ended == Ended::TimedOut);
    // Close our pipe ends: nothing more is read or written.
    drop(input);
    out.file = None;
    err.file = None;
    // Whatever is left in the group (it may hold the pipes) dies now, and on
    // a timeout the child with it. The child is not reaped yet, so the group
    // id cannot have been reused.
    kill_group(pid);
    let (code, signal) = reap(child, prog, pidfd.as_ref(), exited)?;
    drop(running);
    live.ended(code, signal, timed_out);
    Ok(Finished {
        code,
        signal,
        stdout: out.data,
        stdout_cut: out.cut,
        stderr_tail: err.data,
        timed_out,
        cancelled: live.cancel_requested(),
    })
}

/// Starts the handler process: argv without a shell, in `cwd`, in its own
/// process group, with berth's environment, `env` and the `BERTH_*`
/// variables (`BERTH_RESULT` when there is a result file), its three
/// standard streams piped, and the death signal set.
fn spawn(
    spec: &CommandSpec,
    ctx: &TaskContext,
    result_file: Option<&Path>,
) -> Result<std::process::Child, String> {
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
    match result_file {
        Some(f) => cmd.env(RESULT_ENV, f),
        None => cmd.env_remove(RESULT_ENV),
    };
    // SAFETY: prctl(2), close_range(2), getrlimit(2) and fcntl(2) are
    // async-signal-safe. The handler dies with berth (a crash, kill -9)
    // instead of running on beside its own re-run, and inherits no
    // descriptor but its three pipes.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            close_inherited_on_exec();
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| format!("cannot start {prog}: {e}"))
}

/// Marks every descriptor above stderr close-on-exec, in the child between
/// fork and exec. berth opens its own files close-on-exec, but a descriptor
/// berth itself inherited without the flag (from a shell, a supervisor)
/// would otherwise pass on to every handler. Marked, not closed: the pipe
/// on which the standard library reports a failed exec must stay open
/// until the exec. `close_range` with `CLOSE_RANGE_CLOEXEC` (Linux 5.11);
/// on an older kernel, `fcntl` on each descriptor below the open-files
/// limit (at most 65,536).
///
/// # Safety
/// Only between fork and exec (it calls async-signal-safe functions only).
unsafe fn close_inherited_on_exec() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: the syscall takes three integers and touches no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(65_536) as libc::c_int
    } else {
        65_536
    };
    for fd in 3..max {
        // SAFETY: fcntl on a descriptor that may not be open: EBADF, ignored.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// A process's three pipes, as [`pump`] moves data through them.
struct Pipes<'a> {
    input: &'a mut InPipe,
    out: &'a mut OutPipe,
    err: &'a mut OutPipe,
}

/// Moves data through the pipes until the attempt ends (see
/// [`run_command`]), copying the output to `live`; a cancel sends SIGTERM
/// to the group and gives it `grace` to exit.
fn pump(
    pid: i32,
    pidfd: Option<&OwnedFd>,
    deadline: Instant,
    pipes: Pipes<'_>,
    live: &LiveAttempt,
    grace: Duration,
) -> Ended {
    let Pipes { input, out, err } = pipes;
    let mut buf = vec![0u8; 64 * 1024];
    let mut exited_at: Option<Instant> = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        if live.stop_now_requested() {
            // SIGKILL now (`Ended::Stopped` below kills the group).
            let now = Instant::now();
            kill_at = Some(kill_at.map_or(now, |k| k.min(now)));
        } else if kill_at.is_none() && live.cancel_requested() {
            signal_group(pid, libc::SIGTERM);
            kill_at = Some(Instant::now() + grace);
        }
        input.write_ready();
        out.read_ready(&mut buf, &|c| live.stdout(c));
        err.read_ready(&mut buf, &|c| live.stderr(c));
        if exited_at.is_none() && has_exited(pid) {
            exited_at = Some(Instant::now());
        }
        let now = Instant::now();
        let until = match exited_at {
            Some(at) => {
                // The drain never outlasts the timeout.
                let end = (at + DRAIN).min(deadline.max(at));
                if (out.file.is_none() && err.file.is_none()) || now >= end {
                    return Ended::Exited;
                }
                end
            }
            None if now >= deadline => return Ended::TimedOut,
            None if kill_at.is_some_and(|k| now >= k) => return Ended::Stopped,
            None => kill_at.map_or(deadline, |k| k.min(deadline)),
        };
        let mut wait = until - now;
        let mut fds = Vec::with_capacity(4);
        if let Some(f) = &input.file {
            fds.push(pollfd(f.as_raw_fd(), libc::POLLOUT));
        }
        for p in [&*out, &*err] {
            if let Some(f) = &p.file {
                fds.push(pollfd(f.as_raw_fd(), libc::POLLIN));
            }
        }
        if exited_at.is_none() {
            match pidfd {
                Some(fd) => fds.push(pollfd(fd.as_raw_fd(), libc::POLLIN)),
                None => wait = wait.min(TICK),
            }
        }
        if kill_at.is_none() {
            match live.cancel_fd() {
                Some(fd) => fds.push(pollfd(fd, libc::POLLIN)),
                None => wait = wait.min(TICK),
            }
        } else {
            // The cancel's descriptor stays readable: look for a stop at
            // once (`LiveAttempt::stop_now`) on a tick instead.
            wait = wait.min(TICK);
        }
        poll(&mut fds, wait);
    }
}

/// Reaps the handler process (killed already unless it `exited`) and
/// returns its exit code and signal. One that does not die after SIGKILL
/// (uninterruptible sleep) is left to a reaper thread; the attempt ends now.
fn reap(
    mut child: std::process::Child,
    prog: &str,
    pidfd: Option<&OwnedFd>,
    exited: bool,
) -> Result<(Option<i32>, Option<i32>), String> {
    let pid = child.id() as i32;
    if exited || wait_exit(pid, pidfd, KILL_WAIT) {
        let status = child
            .wait()
            .map_err(|e| format!("waiting for {prog}: {e}"))?;
        return Ok((status.code(), status.signal()));
    }
    log::warn!("handler process {pid} ({prog}) did not die after SIGKILL; reaping it later");
    let reaper = std::thread::Builder::new().name("berth-reaper".into());
    if reaper
        .spawn(move || {
            let _ = child.wait();
        })
        .is_err()
    {
        log::error!("cannot start a reaper thread for process {pid}");
    }
    Ok((None, Some(libc::SIGKILL)))
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

/// The result file's content, if it is a regular file: at most
/// `max_output` bytes, or (when it is larger) its first
/// [`budget::RESULT_HEAD`] bytes and `true`. None if it is gone or cannot
/// be read. (Opened without blocking, so a FIFO put in its place cannot
/// hold the worker.)
fn read_result_file(path: &Path, max_output: usize) -> Option<(Vec<u8>, bool)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut data = Vec::new();
    file.take(max_output as u64 + 1)
        .read_to_end(&mut data)
        .ok()?;
    if data.len() > max_output {
        data.truncate(budget::RESULT_HEAD.min(max_output));
        return Some((data, true));
    }
    Some((data, false))
}

/// A successful attempt's outcome from its result bytes (`what`: stdout or
/// the result file): trimmed, JSON if it parses, else a JSON string, none
/// if empty. Bytes `cut` at the read limit become the head of a
/// `truncated` result.
fn result_outcome(bytes: &[u8], cut: bool, what: &str, max_output: usize) -> Outcome {
    if cut {
        // Only the head was kept; a character cut at its end is dropped.
        let head = match std::str::from_utf8(bytes) {
            Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
            _ => bytes,
        };
        return Outcome {
            output: Some(serde_json::Value::String(
                String::from_utf8_lossy(head).trim().to_string(),
            )),
            output_cut: Some(format!(
                "{what} is over the {} read limit",
                format_size(max_output as u64)
            )),
            ..Outcome::success()
        };
    }
    let text = String::from_utf8_lossy(bytes);
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

impl CommandHandler {
    fn check(&self, spec: &CommandSpec, ctx: &TaskContext) -> Result<(), String> {
        let stdin = serde_json::to_vec(&ctx.payload).unwrap_or_default();
        let f = run_command(spec, ctx, &stdin, 64 * 1024, None)?;
        if f.cancelled {
            return Err("cancelled".into());
        }
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
        // A fresh private file (0600, in the temp dir) per attempt, removed
        // when the attempt is over (see `result_file`); only its path is
        // kept. Without a usable temp dir the command runs without one.
        let result_file = match crate::engine::result_file::create() {
            Ok(f) => Some(f),
            Err(e) => {
                log::warn!(
                    "task {}: cannot create a result file ({e}); {RESULT_ENV} is not set",
                    ctx.task.id
                );
                None
            }
        };
        let f = match run_command(
            &self.run,
            ctx,
            &stdin,
            self.max_output,
            result_file.as_deref(),
        ) {
            Ok(f) => f,
            Err(e) => return Outcome::fail(e),
        };
        if f.cancelled {
            return Outcome::fail("cancelled");
        }
        if f.timed_out {
            return Outcome::fail(format!(
                "timed out after {}",
                format_duration(self.run.timeout)
            ));
        }
        match f.code {
            Some(0) => match result_file
                .as_deref()
                .and_then(|p| read_result_file(p, self.max_output))
            {
                Some((bytes, cut)) if !bytes.is_empty() => {
                    result_outcome(&bytes, cut, "the result file", self.max_output)
                }
                _ => result_outcome(&f.stdout, f.stdout_cut, "stdout", self.max_output),
            },
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
