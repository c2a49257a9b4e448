//! The key layout of berth's one sled tree. Every key starts with a byte that
//! names its record type. Integers are big-endian so sled's byte order is
//! numeric order. (A commit is atomic because it is one `e` record that
//! carries its key writes; see `write` and `overlay`.)
//!
//! | key                                   | value (codec record)  |
//! |---------------------------------------|-----------------------|
//! | `m` name                              | meta: format, applied, parallel queues |
//! | `t` id:u64                            | live task and its queue position (`stored`) |
//! | `h` id:u64                            | finished task         |
//! | `e` seq:u64                           | commit record         |
//! | `e` seq:u64 piece:u32                 | a piece of a large one (`records`) |
//! | `q` queue-name 0x00 position:i64(*)   | task id:u64 (format 6 and older; folded at open) |
//! | `o` id:u64 attempt:u32                | attempt log           |
//! | `c` kind (tree `counters`)            | that kind's counters  |
//! | `g` parent id:u64                     | its children's ids (`children`) |
//!
//! (*) positions are stored with the sign bit flipped so that negative
//! positions sort before positive ones.

pub const META: u8 = b'm';
pub const TASK: u8 = b't';
pub const HISTORY: u8 = b'h';
pub const EVENT: u8 = b'e';
/// A queue position of store format 6 and older: opening folds each into
/// its task's `t` value, and removes it.
pub const QUEUE: u8 = b'q';
/// An attempt's log (`AttemptLog`): `o` ‖ task id ‖ attempt number. New
/// logs are added at the end of this range (ids grow), so the leaf sled
/// rewrites for each one also holds the first keys of the next range:
/// here the oldest live tasks (`t`; until format 7, the small `q` keys). (Before `e`, as `a` was at first, that leaf
/// held the oldest commit records, which can be megabytes: sled rewrote
/// them, as blobs, at every step, and the engine ran at half speed.)
pub const ATTEMPT: u8 = b'o';
/// Counters per task kind (see `counters`). These keys live in a sled tree
/// of their own, [`COUNTERS_TREE`] (see `overlay::Trees`).
pub const COUNTER: u8 = b'c';
/// A group parent's children list (`children`), written once.
pub const CHILDREN: u8 = b'g';
/// The sled tree of the `c` keys (format 4 on; before, they were in the
/// default tree, and opening moves them).
pub const COUNTERS_TREE: &[u8] = b"counters";

pub const META_FORMAT: &[u8] = b"mformat";
/// The key (first event number) of a commit record up to which every record's
/// key writes are in the tree; open re-applies the records after it.
pub const META_APPLIED: &[u8] = b"mapplied";
/// The event where counting began (see `counters`).
pub const META_COUNTED: &[u8] = b"mcounted";

/// The first event the store's log still holds (absent: 1). The events
/// before it are in a checkpoint (`checkpoint.rs`) and the archive.
pub const META_LOG_START: &[u8] = b"mlogstart";

/// The number of parallel queues the last daemon ran (so that a data dir
/// read without a daemon lists the same queues).
pub const META_PARALLEL: &[u8] = b"mparallel";

/// The node (name and tags) of the last daemon that ran on the data dir,
/// so that a data dir read without a daemon says which tasks are not for it.
pub const META_NODE: &[u8] = b"mnode";

/// The on-disk layout version (the key layout above; the record framing has its own byte).
/// 10: the log may hold `RetriedAnew` events (`EventKind` variant 14: a
/// retried dead letter is queued anew), which a format-9 build cannot
/// decode: it would find such a record damaged, or take the last one for
/// a commit cut short and drop it. Opening upgrades a format-9 dir by
/// writing this number: its events stay as they are (`Retried` is still
/// read, and replayed as it was).
pub const STORE_FORMAT: u64 = 10;
/// 9: commit records may be of version 3 (`codec::COMMIT_VERSION`: a new
/// task's key write names its `Enqueued` event instead of carrying its
/// bytes, see `commit_record`), which a format-8 build cannot read: it
/// would find every such record damaged. Opening upgrades a format-8 dir
/// by writing this number: its records stay as they are, and readable.
pub const STORE_FORMAT_V9: u64 = 9;
/// 8: a live task's `t` value may hold a summary between its position and
/// its record (see `stored`), flagged in the position's length byte; a
/// format-7 build would misread every such position. Opening upgrades a
/// format-7 dir by writing this number: its values have no summary, and
/// are read as they are.
pub const STORE_FORMAT_V8: u64 = 8;
/// 7: a live task's queue position is in its `t` value (see `stored`), and
/// there are no `q` keys; a format-6 build would find every queue empty.
/// Opening upgrades a format-6 (or older) dir by folding each `q` key into
/// its task's value (`open::fold_queue_keys`).
pub const STORE_FORMAT_V7: u64 = 7;
/// 6: a commit is durable once its record is in the write-ahead log
/// (`db/wal`, see `wal`), before sled has it on disk; a format-5 build
/// would not read that log and would lose those commits. Opening upgrades a
/// format-5 dir by writing this number: it has no log, and its sled holds
/// every commit.
pub const STORE_FORMAT_V6: u64 = 6;
/// 5: a commit record over `records::CHUNK` bytes is stored in pieces
/// under `e` ‖ seq ‖ piece:u32 (see `records`), and a group parent's
/// children under `g` ‖ id (see `children`); a format-4 build would
/// misread both. Opening upgrades a format-4 dir by writing this number:
/// its records are all whole and its parents hold their lists, which
/// format 5 reads as they are.
pub const STORE_FORMAT_V5: u64 = 5;
/// 4: the `c` keys are in their own tree (`COUNTERS_TREE`); a format-3
/// build would not see them. Opening upgrades a format-3 (or older) dir by
/// moving them there.
pub const STORE_FORMAT_V4: u64 = 4;
/// 3: records may be of version 2 (`codec`), which builds of format 2 cannot
/// read; the key layout is format 2's. Opening upgrades a format-2 dir by
/// writing this number: its version-1 records stay as they are and readable,
/// and a format-2 build refuses the dir instead of misreading new records.
pub const STORE_FORMAT_V3: u64 = 3;
/// Deferred apply (`mapplied`), every record of version 1. Opening upgrades it.
pub const STORE_FORMAT_V2: u64 = 2;
/// The format before deferred apply (no `mapplied`; only the last record may
/// be partly applied). Opening upgrades it.
pub const STORE_FORMAT_V1: u64 = 1;

pub fn id_key(prefix: u8, id: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = prefix;
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

/// Reads the u64 after a one-byte prefix.
pub fn parse_id_key(key: &[u8]) -> Option<u64> {
    if key.len() != 9 {
        return None;
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[1..]);
    Some(u64::from_be_bytes(b))
}

/// The key of attempt `attempt` of task `id`: `o` ‖ id (u64 BE) ‖ attempt
/// (u32 BE), so a task's logs are contiguous and in attempt order.
pub fn attempt_key(id: u64, attempt: u32) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[0] = ATTEMPT;
    k[1..9].copy_from_slice(&id.to_be_bytes());
    k[9..].copy_from_slice(&attempt.to_be_bytes());
    k
}

/// The prefix of every attempt key of task `id`.
pub fn attempt_prefix(id: u64) -> [u8; 9] {
    id_key(ATTEMPT, id)
}

/// Splits an attempt key into task id and attempt number.
pub fn parse_attempt_key(key: &[u8]) -> Option<(u64, u32)> {
    if key.len() != 13 || key[0] != ATTEMPT {
        return None;
    }
    let id = parse_id_key(&key[..9])?;
    let mut b = [0u8; 4];
    b.copy_from_slice(&key[9..]);
    Some((id, u32::from_be_bytes(b)))
}

/// The key of a kind's counters.
pub fn counter_key(kind: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(kind.len() + 1);
    k.push(COUNTER);
    k.extend_from_slice(kind.as_bytes());
    k
}

fn pos_bytes(pos: i64) -> [u8; 8] {
    ((pos as u64) ^ (1 << 63)).to_be_bytes()
}

pub fn queue_key(queue: &str, pos: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(queue.len() + 10);
    k.push(QUEUE);
    k.extend_from_slice(queue.as_bytes());
    k.push(0);
    k.extend_from_slice(&pos_bytes(pos));
    k
}

/// Splits a queue key into queue name and position.
pub fn parse_queue_key(key: &[u8]) -> Option<(String, i64)> {
    parse_queue_key_ref(key).map(|(name, pos)| (name.to_string(), pos))
}

/// [`parse_queue_key`] without copying the name.
pub fn parse_queue_key_ref(key: &[u8]) -> Option<(&str, i64)> {
    if key.len() < 11 || key[0] != QUEUE || key[key.len() - 9] != 0 {
        return None;
    }
    let name = std::str::from_utf8(&key[1..key.len() - 9]).ok()?;
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[key.len() - 8..]);
    let pos = (u64::from_be_bytes(b) ^ (1 << 63)) as i64;
    Some((name, pos))
}

pub fn key_display(key: &[u8]) -> String {
    match key.first() {
        Some(&p @ (TASK | HISTORY | EVENT | CHILDREN)) if key.len() == 9 => {
            format!("{}/{}", p as char, parse_id_key(key).unwrap_or(0))
        }
        Some(&ATTEMPT) => match parse_attempt_key(key) {
            Some((id, n)) => format!("o/{id}/{n}"),
            None => format!("{key:?}"),
        },
        Some(&QUEUE) => match parse_queue_key(key) {
            Some((q, pos)) => format!("q/{q}/{pos}"),
            None => format!("{key:?}"),
        },
        _ => String::from_utf8_lossy(key).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_keys_sort_by_position_and_round_trip() {
        let ps = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        let keys: Vec<_> = ps.iter().map(|p| queue_key("main", *p)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        for (k, p) in keys.iter().zip(ps) {
            assert_eq!(parse_queue_key(k), Some(("main".to_string(), p)));
        }
        assert_eq!(parse_queue_key(b"qmain"), None);
    }

    #[test]
    fn id_keys_sort_numerically() {
        assert!(id_key(TASK, 2) < id_key(TASK, 256));
        assert_eq!(parse_id_key(&id_key(EVENT, 99)), Some(99));
        assert_eq!(key_display(&id_key(TASK, 42)), "t/42");
    }

    #[test]
    fn attempt_keys_sort_by_task_then_attempt_and_round_trip() {
        let keys = [
            attempt_key(1, 1),
            attempt_key(1, 2),
            attempt_key(1, 256),
            attempt_key(2, 1),
            attempt_key(256, 0),
        ];
        let mut sorted = keys;
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(parse_attempt_key(&attempt_key(7, 3)), Some((7, 3)));
        assert!(attempt_key(7, 3).starts_with(&attempt_prefix(7)));
        assert!(!attempt_key(8, 3).starts_with(&attempt_prefix(7)));
        assert_eq!(parse_attempt_key(&id_key(ATTEMPT, 7)), None);
        assert_eq!(key_display(&attempt_key(42, 5)), "o/42/5");
    }
}
