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
pub use open::{check_not_lost, may_become_data_dir};
pub use order::Placement;
pub use panics::catch as catch_panic;
pub use snapshot::{LogCut, LogRecord, Snapshot};
pub use wal::{SEGMENT_BYTES as WAL_SEGMENT_BYTES, TIGHT as WAL_TIGHT};
pub use write::{Cancellation, Published, WriteTxn};

/// Entry points for berth's fuzz targets (`fuzz/`, target `store_files`):
/// the decoders of the files the store keeps beside sled's, the
/// write-ahead log's segments and the high-water mark. Not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    /// A write-ahead log frame: first event, the event after its last, body.
    pub type Frame = (u64, u64, Vec<u8>);

    /// A segment's bytes read as opening reads them: its whole frames, and
    /// where reading stopped before the end and why.
    pub fn wal_segment(bytes: &[u8]) -> (Vec<Frame>, Option<(usize, String)>) {
        let mut frames = Vec::new();
        let stop = super::wal::read_segment(bytes, &mut frames);
        let frames = frames
            .into_iter()
            .map(|f| (f.first_seq, f.next_seq, f.body))
            .collect();
        (frames, stop.map(|(at, why, _)| (at, why)))
    }

    /// The bytes a segment holding `frames` begins with: its header, then
    /// each frame as the log writes it.
    pub fn wal_bytes(frames: &[Frame]) -> Vec<u8> {
        let mut out = super::wal::segment_header();
        for (first, next, body) in frames {
            super::wal::encode_frame(&mut out, *first, *next, body);
        }
        out
    }

    /// The log in `db/wal` under `db` read as opening reads it: its frames,
    /// and the damage or the torn last write it ends with.
    pub fn wal_read(
        db: &std::path::Path,
    ) -> std::io::Result<(Vec<Frame>, Option<String>, Option<String>)> {
        let r = super::wal::read(db)?;
        let frames = r
            .frames
            .into_iter()
            .map(|f| (f.first_seq, f.next_seq, f.body))
            .collect();
        Ok((frames, r.damage, r.torn))
    }

    /// A high-water mark's bytes read back: (next event, next id).
    pub fn high_mark(bytes: &[u8]) -> Result<(u64, u64), String> {
        super::high_mark::decode(bytes).map(|m| (m.next_event, m.next_id))
    }

    /// The bytes of the high-water mark (next event, next id).
    pub fn high_mark_bytes(next_event: u64, next_id: u64) -> String {
        super::high_mark::encode(&super::high_mark::Mark {
            next_event,
            next_id,
        })
    }
}
