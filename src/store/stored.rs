//! How a task is stored. A finished task (`h` ‖ id) is its record. A live
//! task (`t` ‖ id) is its queue position and its record, each framed and
//! checksummed on its own:
//!
//! ```text
//! 00 ‖ n: u8 ‖ position: record(Option<(queue, i64)>), n bytes ‖ record(Task)
//! ```
//!
//! The position is the task's place in its queue (see `order`), or none for
//! a task in no queue (a group child that waits for its dispatch). The queue
//! order is rebuilt from these at open; nothing else holds it. Two frames,
//! so that a damaged task record still holds its place: the queue stops at
//! it (as `engine::dispatch` does for a head it cannot read) instead of
//! running the tasks behind it first.
//!
//! Until store format 7 a live task was its record alone, and its position
//! was a `q` key of its own: two more sled writes per task, and a second
//! million-key scan at open. Opening an older dir folds each `q` key into
//! its task's value ([`with_position`], `open::fold_queue_keys`). A value
//! that is a record alone (its first byte is the record's version, never 0)
//! is a live task in no position.

use crate::codec::{self, CodecError};
use crate::store::children;
use crate::store::keys::TASK;
use crate::task::Task;

/// The first byte of a live task's value with its position.
const POSITIONED: u8 = 0;

/// A queue position: the queue's name and the place in it.
pub type Position = (String, i64);

/// The bytes of a live task's `t` key: its position in `t.queue` (if it is
/// queued) and its record (its children under its `g` key, see `children`).
pub fn live_bytes(t: &Task, pos: Option<i64>) -> Vec<u8> {
    // Both frames are encoded in place, in one buffer (this is on every
    // commit's path): the same bytes as `join` of the two encoded apart.
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(&[POSITIONED, 0]);
    let n = codec::encode_append(&pos.map(|p| (t.queue.as_str(), p)), &mut out);
    out[1] = u8::try_from(n).unwrap_or(u8::MAX);
    codec::encode_append(&*children::stored_form(t), &mut out);
    out
}

/// A live task's value with its position (`position_bytes`) set, its
/// record (`v`'s, or `v` itself if it is a record alone) kept byte for byte.
pub fn with_position(position_bytes: &[u8], v: &[u8]) -> Vec<u8> {
    join(position_bytes, split(v).record)
}

/// The framed position of `queue` at `pos`.
pub fn position_bytes(queue: &str, pos: i64) -> Vec<u8> {
    codec::encode(&Some((queue, pos)))
}

fn join(position: &[u8], record: &[u8]) -> Vec<u8> {
    // A position's queue name is at most 64 bytes: its frame fits a u8 length.
    let n = u8::try_from(position.len()).unwrap_or(u8::MAX);
    let mut out = Vec::with_capacity(2 + position.len() + record.len());
    out.extend_from_slice(&[POSITIONED, n]);
    out.extend_from_slice(position);
    out.extend_from_slice(record);
    out
}

/// The bytes of a finished task's `h` key.
pub fn history_bytes(t: &Task) -> Vec<u8> {
    codec::encode(&*children::stored_form(t))
}

/// A live task's value cut in its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts<'a> {
    /// The framed position; None for a record alone (format 6 and older).
    pub position: Option<&'a [u8]>,
    pub record: &'a [u8],
}

/// Cuts a `t` key's value. A value with the marker whose length byte runs
/// past its end is all position (its decoding fails: corrupt).
pub fn split(v: &[u8]) -> Parts<'_> {
    match v {
        [POSITIONED, n, rest @ ..] => {
            let n = usize::from(*n).min(rest.len());
            Parts {
                position: Some(&rest[..n]),
                record: &rest[n..],
            }
        }
        _ => Parts {
            position: None,
            record: v,
        },
    }
}

/// The position a live task's value holds (None: in no queue, or a record
/// alone).
pub fn position(v: &[u8]) -> Result<Option<Position>, CodecError> {
    match split(v).position {
        None => Ok(None),
        Some(p) => codec::decode::<Option<Position>>(p),
    }
}

/// A stored task as it was written (see `children` for its list), from the
/// value of its key; `prefix` is the key's first byte.
pub fn decode(prefix: u8, v: &[u8]) -> Result<Task, CodecError> {
    let record = match prefix {
        TASK => split(v).record,
        _ => v,
    };
    codec::decode::<Task>(record)
}

/// Both parts of a live task's value, each read on its own; a position in
/// another queue than the task's record names is an error of the position.
pub fn decode_live(
    v: &[u8],
) -> (
    Result<Option<Position>, CodecError>,
    Result<Task, CodecError>,
) {
    let task = codec::decode::<Task>(split(v).record);
    let mut position = position(v);
    if let (Ok(Some((q, _))), Ok(t)) = (&position, &task)
        && *q != t.queue
    {
        position = Err(CodecError::Body(format!(
            "its queue position is in queue '{q}', its record in queue '{}'",
            t.queue
        )));
    }
    (position, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keys::HISTORY;
    use crate::task::TaskSpec;

    fn task() -> Task {
        let spec = TaskSpec {
            queue: "main".into(),
            kind: "Hook".into(),
            name: "a".into(),
            ..Default::default()
        };
        let mut t = spec
            .into_task(1, &crate::budget::Budget::default())
            .expect("task");
        t.id = 5;
        t
    }

    #[test]
    fn a_live_value_holds_its_position_and_its_record_apart() {
        let t = task();
        for pos in [Some(-(1 << 40)), Some(0), Some(i64::MAX), None] {
            let v = live_bytes(&t, pos);
            // Encoded in one buffer: the two frames as each is alone.
            let apart = join(
                &codec::encode(&pos.map(|p| ("main", p))),
                &history_bytes(&t),
            );
            assert_eq!(v, apart);
            let want = pos.map(|p| ("main".to_string(), p));
            assert_eq!(decode_live(&v), (Ok(want.clone()), Ok(t.clone())));
            assert_eq!(decode(TASK, &v), Ok(t.clone()));
            assert_eq!(position(&v), Ok(want));
            // Not a finished task's record.
            assert!(decode(HISTORY, &v).is_err());
        }
        // A record alone (format 6 and older) is a live task in no position,
        // and folding a position into it keeps the record byte for byte.
        let alone = history_bytes(&t);
        assert_eq!(decode_live(&alone), (Ok(None), Ok(t.clone())));
        assert_eq!(decode(HISTORY, &alone), Ok(t.clone()));
        let folded = with_position(&position_bytes("main", 7), &alone);
        assert_eq!(split(&folded).record, &alone[..]);
        assert_eq!(folded, live_bytes(&t, Some(7)));
        // Setting it again replaces it.
        let moved = with_position(&position_bytes("main", 9), &folded);
        assert_eq!(moved, live_bytes(&t, Some(9)));
    }

    #[test]
    fn damage_to_one_part_leaves_the_other_readable() {
        let t = task();
        let v = live_bytes(&t, Some(3));
        let Parts { position, record } = split(&v);
        let (p, r) = (position.expect("positioned").len(), record.len());
        // A flipped bit in the record: the position still reads.
        let mut bad = v.clone();
        bad[2 + p + r / 2] ^= 0x40;
        let (pos, task) = decode_live(&bad);
        assert_eq!(pos, Ok(Some(("main".to_string(), 3))));
        assert!(matches!(task, Err(CodecError::Checksum { .. })), "{task:?}");
        // In the position: the record still reads.
        let mut bad = v.clone();
        bad[2 + p / 2] ^= 0x40;
        let (pos, task) = decode_live(&bad);
        assert!(pos.is_err());
        assert_eq!(task, Ok(t.clone()));
        // A length past the end, a position in another queue: errors.
        assert!(decode_live(&[0, 200, 1, 2]).0.is_err());
        let mut other = t.clone();
        other.queue = "other".into();
        let v = with_position(&position_bytes("main", 1), &history_bytes(&other));
        let (pos, task) = decode_live(&v);
        assert!(
            pos.as_ref()
                .is_err_and(|e| e.to_string().contains("'other'")),
            "{pos:?}"
        );
        assert_eq!(task, Ok(other));
    }
}
