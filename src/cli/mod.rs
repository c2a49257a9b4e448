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
