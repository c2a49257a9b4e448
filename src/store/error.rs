//! The store's errors, one enum per operation: opening, reading, writing.
//! Messages name the data dir, task or key involved and, where there is one,
//! what to do about it.

use std::path::PathBuf;

use crate::budget::BudgetError;
use crate::store::lock::Holder;
use crate::store::order::OrderError;

/// A record that failed its checks, with the key it was stored under.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("record {key} is corrupt: {reason}")]
pub struct CorruptRecord {
    pub key: String,
    pub reason: String,
}

impl CorruptRecord {
    /// The record stored under `key` (raw bytes, shown readably) is corrupt.
    pub fn new(key: &[u8], reason: impl std::fmt::Display) -> Self {
        CorruptRecord {
            key: crate::store::keys::key_display(key),
            reason: reason.to_string(),
        }
    }
}

fn holder_text(h: &Holder) -> String {
    match h.pid {
        Some(_) => format!(" ({h})"),
        None => String::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("data dir {} is in use by another berth process{}", dir.display(), holder_text(holder))]
    InUse { dir: PathBuf, holder: Holder },
    #[error("data dir {} does not exist", dir.display())]
    Missing { dir: PathBuf },
    #[error(
        "{} is not a berth data dir (it has no berth.dir and no db/); nothing was read or changed",
        dir.display()
    )]
    NotADataDir { dir: PathBuf },
    #[error(
        "{} is {what}, not a folder: a data dir is a folder; nothing was read or changed",
        dir.display()
    )]
    NotAFolder { dir: PathBuf, what: &'static str },
    #[error("cannot use data dir {}: {op}: {source}", dir.display())]
    Io {
        dir: PathBuf,
        /// What the open was doing, as "reading the write-ahead log".
        op: &'static str,
        source: std::io::Error,
    },
    #[error("cannot open the database in {}: {source}", dir.display())]
    Database { dir: PathBuf, source: sled::Error },
    #[error("data dir {} has store format {found}; this build reads format {expected} (use a matching berth)", dir.display())]
    Format {
        dir: PathBuf,
        found: String,
        expected: u64,
    },
    #[error("recovering data dir {}: {source}", dir.display())]
    Recover {
        dir: PathBuf,
        source: Box<WriteError>,
    },
    #[error("invalid store options: {0}")]
    Options(String),
    #[error(
        "data dir {} held a berth store, but {what}: its data was lost (a power cut before it \
         reached the disk, or files deleted). berth will not start a new, empty store over it: \
         restore the data dir from a backup or an export, or move it away to start afresh",
        dir.display()
    )]
    Lost { dir: PathBuf, what: String },
    #[error(
        "the database in {}/db is damaged and cannot be read ({detail}). berth will not guess \
         at its contents: restore the data dir from a backup or an export, or move it away to \
         start afresh",
        dir.display()
    )]
    Damaged { dir: PathBuf, detail: String },
    #[error(
        "cannot open the database in {}: the disk is full ({source}); free some space and try again",
        dir.display()
    )]
    NoSpace {
        dir: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error("reading the database failed: {0}")]
    Database(#[from] sled::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("no task {0}")]
    NoSuchTask(u64),
    #[error("task {id} is {state}; cannot {op}")]
    WrongState {
        id: u64,
        state: String,
        op: &'static str,
    },
    #[error(transparent)]
    Order(#[from] OrderError),
    #[error("{0}")]
    Budget(#[from] BudgetError),
    #[error("invalid queue name: {0}")]
    Queue(String),
    #[error(transparent)]
    Corrupt(#[from] CorruptRecord),
    #[error("writing to the database failed: {0}")]
    Database(#[from] sled::Error),
    #[error(
        "the change was applied but flushing it to disk failed (it may or may not survive a crash): {0}"
    )]
    Flush(std::io::Error),
    #[error(
        "the store stopped writing after an earlier failure ({0}); restart berth (reopen the data \
         dir) to repair it"
    )]
    Failed(String),
    #[error(transparent)]
    NoSpace(#[from] crate::store::health::SpaceError),
    #[error("the data dir was opened only to read")]
    ReadOnly,
    #[error("encoding the commit record failed: {0}")]
    Encode(String),
}

impl From<ReadError> for WriteError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Corrupt(c) => WriteError::Corrupt(c),
            ReadError::Database(d) => WriteError::Database(d),
        }
    }
}
