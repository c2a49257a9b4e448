//! The store: berth's state in one sled tree, changed only through atomic
//! write transactions that append to the event log in the same batch.
//! It knows nothing of handlers or the engine.

pub mod attempts;
mod children;
pub mod commit_record;
pub mod counters;
mod db;
pub mod deadlines;
mod dirwatch;
pub mod durability;
mod error;
pub mod event;
mod files;
/// For the folders beside the store (`archive/`, `checkpoints/`).
pub(crate) use files::private_dir;
mod health;
mod high_mark;
pub mod keys;
pub mod lock;
mod open;
pub mod order;
mod overlay;
mod panics;
mod records;
mod snapshot;
pub mod stored;
pub mod verify;
pub(crate) mod wal;
mod warm;
mod write;

pub use attempts::{AttemptLog, AttemptOutcome, OutputTail};
pub use db::{AtRest, Discard, Options, Store};
pub use durability::Durability;
pub use error::{CorruptRecord, OpenError, ReadError, WriteError};
pub use event::{Event, EventKind, INTERRUPTED};
pub use health::{
    DEFAULT_RESERVE as DEFAULT_DISK_RESERVE, SpaceError, free_bytes, space_may_refuse,
};
pub use lock::Role;
pub use open::may_become_data_dir;
pub use order::Placement;
pub use panics::catch as catch_panic;
pub use snapshot::{LogCut, LogRecord, Snapshot};
pub use wal::{SEGMENT_BYTES as WAL_SEGMENT_BYTES, TIGHT as WAL_TIGHT};
pub use write::{Cancellation, Published, WriteTxn};
