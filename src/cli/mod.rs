//! The `berth` command: argument parsing, the commands, and exit codes. The
//! library knows nothing of this module. Exit codes come from the error's
//! class (`ops::Class`: 1 runtime, 2 bad input, 3 in use or busy), plus 0
//! for success and 4 for a daemon whose store failed.

pub mod args;
pub mod commands;
pub mod daemon;
pub mod notify;
pub mod progress;
mod replay;
pub mod session;
mod tasklog;

use std::fmt;
use std::io::Write;
use std::path::Path;

use berth::ops::{Class, OpError};

/// Exit codes, as documented in README.md.
pub const EXIT_OK: i32 = 0;
pub const EXIT_RUNTIME: i32 = Class::Runtime.code();
pub const EXIT_INPUT: i32 = Class::Input.code();
/// `berth run` only: the store failed to write (a disk error, or a full disk
/// that got past the space guard) and the daemon stopped at once so that a
/// supervisor restarts it.
pub const EXIT_STORE_FAILED: i32 = 4;

/// An error the command reports on stderr before exiting with `code`.
#[derive(Debug)]
pub struct CliError {
    pub code: i32,
    pub message: String,
}

impl CliError {
    pub fn input(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_INPUT,
            message: message.into(),
        }
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        CliError {
            code: EXIT_RUNTIME,
            message: message.into(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<OpError> for CliError {
    fn from(e: OpError) -> Self {
        CliError {
            code: e.class.code(),
            message: e.message,
        }
    }
}

impl From<berth::store::OpenError> for CliError {
    fn from(e: berth::store::OpenError) -> Self {
        OpError::from(e).into()
    }
}

/// Prints to stdout; a closed pipe (`berth queue list | head`) is not an error.
pub fn out(text: &str) -> Result<(), CliError> {
    out_open(text).map(|_| ())
}

/// Prints to stdout; false when its reader has gone (a closed pipe), so
/// that a command that would go on printing stops (`queue list --watch |
/// head -1`).
pub fn out_open(text: &str) -> Result<bool, CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|_| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(CliError::runtime(format!("writing to stdout: {e}"))),
        Ok(()) => Ok(true),
    }
}

/// Reads a text file named on the command line, of at most `max` bytes (a
/// bad one is bad input). `-` is standard input.
pub fn read_file(path: &Path, what: &str, max: u64) -> Result<String, CliError> {
    String::from_utf8(read_bytes(path, what, max)?).map_err(|_| {
        CliError::input(format!(
            "cannot read {what} {}: it is not UTF-8 text",
            path.display()
        ))
    })
}

/// [`read_file`]'s bytes, whatever they are.
pub fn read_bytes(path: &Path, what: &str, max: u64) -> Result<Vec<u8>, CliError> {
    let read = if path.as_os_str() == "-" {
        berth::frame::read_capped(std::io::stdin(), max)
    } else {
        std::fs::File::open(path).and_then(|f| berth::frame::read_file_capped(f, max))
    };
    read.map_err(|e| CliError::input(format!("cannot read {what} {}: {e}", path.display())))
}

/// The largest batch file a command reads.
pub const MAX_BATCH_FILE: u64 = 1 << 30;

/// Now, for showing ages: the system clock, or `BERTH_NOW` (RFC 3339 or
/// milliseconds since the epoch) for reproducible output in tests and docs.
///
/// A value that is not a time is refused by [`check_now_env`], which every
/// command runs first.
pub fn now_ms() -> u64 {
    let system = || berth::clock::system().now_ms();
    match std::env::var("BERTH_NOW") {
        Ok(t) => berth::units::parse_time(&t, system()).unwrap_or_else(|_| system()),
        Err(_) => system(),
    }
}

/// Refuses a `BERTH_NOW` that is set but is not a time (exit 2), instead
/// of counting ages from the clock without a word.
pub fn check_now_env() -> Result<(), CliError> {
    match std::env::var("BERTH_NOW") {
        Err(std::env::VarError::NotPresent) => Ok(()),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(CliError::input("BERTH_NOW is not valid UTF-8"))
        }
        Ok(t) => berth::units::parse_time(&t, berth::clock::system().now_ms())
            .map(|_| ())
            .map_err(|e| CliError::input(format!("BERTH_NOW: {e}"))),
    }
}

/// The width of the terminal on stdout (`COLUMNS` wins), or `None` when
/// stdout is not a terminal.
pub fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    if let Some(c) = std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()) {
        return Some(c);
    }
    let mut ws = std::mem::MaybeUninit::<libc::winsize>::zeroed();
    // SAFETY: TIOCGWINSZ fills a winsize; stdout is a terminal.
    let r = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, ws.as_mut_ptr()) };
    // SAFETY: zeroed is a valid winsize, and ioctl filled it when it returned 0.
    let ws = unsafe { ws.assume_init() };
    (r == 0 && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// A panic caught at the top: one in sled means the database is damaged
/// (exit 1, with what to do); anything else is a bug in berth (exit 101,
/// as an uncaught panic would).
pub fn panic_error(dir: &Path, panic: String) -> CliError {
    if panic.contains("/sled-") {
        let e = berth::store::OpenError::Damaged {
            dir: dir.to_path_buf(),
            detail: format!("sled panicked while reading it: {panic}"),
        };
        return CliError::runtime(e.to_string());
    }
    CliError {
        code: 101,
        message: format!("internal error (please report it): {panic}"),
    }
}
