//! The `berth` command: argument parsing, the commands, and the mapping of
//! errors to exit codes (0 ok, 1 runtime error, 2 bad input or usage, 3 data
//! dir in use). The library knows nothing of this module.

pub mod args;
pub mod commands;
pub mod daemon;

use std::fmt;

/// Exit codes, as documented in README.md.
pub const EXIT_OK: i32 = 0;
pub const EXIT_RUNTIME: i32 = 1;
pub const EXIT_INPUT: i32 = 2;
pub const EXIT_IN_USE: i32 = 3;
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

impl From<berth::store::OpenError> for CliError {
    fn from(e: berth::store::OpenError) -> Self {
        use berth::store::OpenError;
        let code = match &e {
            OpenError::InUse { .. } => EXIT_IN_USE,
            OpenError::Options(_) => EXIT_INPUT,
            _ => EXIT_RUNTIME,
        };
        CliError {
            code,
            message: e.to_string(),
        }
    }
}

/// A panic caught at the top: one in sled means the database is damaged
/// (exit 1, with what to do); anything else is a bug in berth (exit 101,
/// as an uncaught panic would).
pub fn panic_error(dir: &std::path::Path, panic: String) -> CliError {
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
