//! How a task is stored. A finished task (`h` ‖ id) is its record. A live
//! task (`t` ‖ id) is its queue position, a summary and its record, each
//! framed and checksummed on its own:
//!
//! ```text
//! 00 ‖ 0x80 | n: u8 ‖ position: record(Option<(queue, i64)>), n bytes
//!    ‖ m: u8 ‖ summary: record(Summary), m bytes ‖ record(Task)
//! ```
//!
//! The position is the task's place in its queue (see `order`), or none for
//! a task in no queue (a group child that waits for its dispatch). The queue
//! order is rebuilt from these at open; nothing else holds it. Separate
//! frames, so that a damaged task record still holds its place: the queue
//! stops at it (as `engine::dispatch` does for a head it cannot read)
//! instead of running the tasks behind it first.
//!
//! The summary (store format 8) is what a writable open needs of each live
//! task besides its place: whether it was running, and its TTL deadline.
//! With it, a daemon's open checks each record's frame (length, checksum,
//! version) but decodes only those that were running: decoding every record
//! was a quarter of the time it took to open a million queued tasks. It is
//! derived from the record in the same write ([`Summary::of`]), and
//! `verify` checks that they agree (`snapshot`).
//!
//! Until store format 7 a live task was its record alone, and its position
//! was a `q` key of its own: two more sled writes per task, and a second
//! million-key scan at open. Opening an older dir folds each `q` key into
//! its task's value ([`with_position`], `open::fold_queue_keys`). A value
//! that is a record alone (its first byte is the record's version, never 0)
//! is a live task in no position. A value of format 7 has no summary (its
//! length byte's top bit is clear): its record is decoded at open, as
//! before, until the task is next written.

use crate::codec::{self, CodecError};
use crate::store::children;
use crate::store::keys::TASK;
use crate::task::{Status, Task};
use crate::ttl;

/// The first byte of a live task's value with its position.
const POSITIONED: u8 = 0;

/// Set in the position's length byte when a summary frame follows the
/// position (format 8 on). A position's frame is at most about 80 bytes (a
/// queue name is at most 64), so its length needs only the other 7 bits.
const SUMMARIZED: u8 = 0x80;

/// What a writable open needs to know of a live task without decoding its
/// record (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub struct Summary {
    /// The task's id (the key's id, checked at open).
    pub id: u64,
    /// Its status is `running`: the open decodes its record, to put it back
    /// in its queue (`Store::recover`).
    pub running: bool,
    /// When its TTL runs out, if it may expire by itself
    /// (`ttl::deadline`, if `ttl::may_expire`): the deadlines index's entry.
    pub deadline: Option<u64>,
}

impl Summary {
    /// The summary of a task's record.
    pub fn of(t: &Task) -> Summary {
        Summary {
            id: t.id,
            running: t.status == Status::Running,
            deadline: ttl::deadline(t).filter(|_| ttl::may_expire(t)),
        }
    }
}

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
    match u8::try_from(n).ok().filter(|n| n & SUMMARIZED == 0) {
        Some(n) => {
            out[1] = n | SUMMARIZED;
            let at = out.len();
            out.push(0);
            let m = codec::encode_append(&Summary::of(t), &mut out);
            out[at] = u8::try_from(m).unwrap_or(u8::MAX);
        }
        // A position too long to flag (no valid queue name makes one): no
        // summary, so the open decodes the record.
        None => out[1] = u8::try_from(n).unwrap_or(u8::MAX),
    }
    codec::encode_append(&*children::stored_form(t), &mut out);
    out
}

/// A live task's value with its position (`position_bytes`) set, its
/// summary (if it has one) and its record (`v`'s, or `v` itself if it is a
/// record alone) kept byte for byte.
pub fn with_position(position_bytes: &[u8], v: &[u8]) -> Vec<u8> {
    let parts = split(v);
    join(position_bytes, parts.summary, parts.record)
}

/// The framed position of `queue` at `pos`.
pub fn position_bytes(queue: &str, pos: i64) -> Vec<u8> {
    codec::encode(&Some((queue, pos)))
}

fn join(position: &[u8], summary: Option<&[u8]>, record: &[u8]) -> Vec<u8> {
    // A position's queue name is at most 64 bytes: its frame fits in 7 bits
    // of length (a longer one is kept without its summary).
    let n = u8::try_from(position.len()).unwrap_or(u8::MAX);
    let summary = summary.filter(|s| n & SUMMARIZED == 0 && s.len() <= usize::from(u8::MAX));
    let mut out =
        Vec::with_capacity(3 + position.len() + record.len() + summary.map_or(0, <[u8]>::len));
    match summary {
        Some(s) => {
            out.extend_from_slice(&[POSITIONED, n | SUMMARIZED]);
            out.extend_from_slice(position);
            out.push(u8::try_from(s.len()).unwrap_or(u8::MAX));
            out.extend_from_slice(s);
        }
        None => {
            out.extend_from_slice(&[POSITIONED, n]);
            out.extend_from_slice(position);
        }
    }
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
    /// The framed summary; None before format 8.
    pub summary: Option<&'a [u8]>,
    pub record: &'a [u8],
}

/// Cuts a `t` key's value. A value with the marker whose length byte runs
/// past its end is all position (its decoding fails: corrupt); one whose
/// summary's length does is all summary (the summary and the record fail).
pub fn split(v: &[u8]) -> Parts<'_> {
    match v {
        [POSITIONED, n, rest @ ..] if n & SUMMARIZED != 0 => {
            let n = usize::from(n & !SUMMARIZED).min(rest.len());
            let (position, rest) = rest.split_at(n);
            let (summary, record) = match rest {
                [m, rest @ ..] => rest.split_at(usize::from(*m).min(rest.len())),
                [] => (rest, rest),
            };
            Parts {
                position: Some(position),
                summary: Some(summary),
                record,
            }
        }
        [POSITIONED, n, rest @ ..] => {
            let n = usize::from(*n).min(rest.len());
            Parts {
                position: Some(&rest[..n]),
                summary: None,
                record: &rest[n..],
            }
        }
        _ => Parts {
            position: None,
            summary: None,
            record: v,
        },
    }
}

/// A live task's summary, if its value has one that reads, and its record's
/// frame is whole (length, checksum and version: its body is not decoded).
/// None: the record must be decoded to know (format 7 and older, or damage
/// in either frame; the record's decoding then says what is wrong).
pub fn summary(v: &[u8]) -> Option<Summary> {
    let parts = split(v);
    let summary = codec::decode::<Summary>(parts.summary?).ok()?;
    codec::check_frame(parts.record).ok()?;
    Some(summary)
}

/// Checks that a live task's summary, if its value has one, is its
/// record's (`verify`): an error says what differs.
pub fn check_summary(v: &[u8], t: &Task) -> Result<(), String> {
    let Some(stored) = split(v).summary else {
        return Ok(());
    };
    let want = Summary::of(t);
    match codec::decode::<Summary>(stored) {
        Ok(s) if s == want => Ok(()),
        Ok(s) => Err(format!(
            "its summary ({s:?}) is not its record's ({want:?})"
        )),
        Err(e) => Err(format!("its summary: {e}")),
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
            // Encoded in one buffer: the three frames as each is alone.
            let apart = join(
                &codec::encode(&pos.map(|p| ("main", p))),
                Some(&codec::encode(&Summary::of(&t))),
                &history_bytes(&t),
            );
            assert_eq!(v, apart);
            assert_eq!(summary(&v), Some(Summary::of(&t)));
            assert_eq!(check_summary(&v, &t), Ok(()));
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
        assert_eq!(
            decode_live(&folded),
            (Ok(Some(("main".into(), 7))), Ok(t.clone()))
        );
        // Setting it again replaces it (a format-7 value: no summary).
        let moved = with_position(&position_bytes("main", 9), &folded);
        assert_eq!(split(&moved).summary, None);
        assert_eq!(summary(&moved), None, "decoded whole at open");
        assert_eq!(decode_live(&moved).1, Ok(t.clone()));
        // A format-8 value keeps its summary when its position moves.
        let moved = with_position(&position_bytes("main", 9), &live_bytes(&t, Some(3)));
        assert_eq!(moved, live_bytes(&t, Some(9)));
    }

    #[test]
    fn a_summary_says_whether_the_task_runs_and_when_it_expires() {
        let mut t = task();
        assert_eq!(
            Summary::of(&t),
            Summary {
                id: 5,
                running: false,
                deadline: None
            }
        );
        t.ttl_ms = Some(1_000);
        t.queued_at = 7;
        let queued = Summary {
            id: 5,
            running: false,
            deadline: Some(1_007),
        };
        assert_eq!(Summary::of(&t), queued);
        assert_eq!(summary(&live_bytes(&t, Some(0))), Some(queued));
        // Started: it runs, and cannot expire any more.
        t.status = Status::Running;
        t.attempts = 1;
        let running = Summary {
            id: 5,
            running: true,
            deadline: None,
        };
        assert_eq!(summary(&live_bytes(&t, Some(0))), Some(running));
        // A group child never expires by itself; it is in no queue.
        let mut child = task();
        child.ttl_ms = Some(1_000);
        child.parent = Some(1);
        assert_eq!(
            summary(&live_bytes(&child, None)).map(|s| s.deadline),
            Some(None)
        );
        // A summary that is not its record's is found (by `verify`).
        let v = live_bytes(&t, Some(0));
        let mut other = t.clone();
        other.status = Status::Queued;
        assert!(check_summary(&v, &other).is_err_and(|e| e.contains("not its record's")));
    }

    #[test]
    fn damage_to_one_part_leaves_the_other_readable() {
        let t = task();
        let v = live_bytes(&t, Some(3));
        let Parts {
            position,
            summary: sum,
            record,
        } = split(&v);
        let (p, s, r) = (
            position.expect("positioned").len(),
            sum.expect("a summary").len(),
            record.len(),
        );
        // A flipped bit in the record: the position still reads.
        let mut bad = v.clone();
        bad[3 + p + s + r / 2] ^= 0x40;
        let (pos, task) = decode_live(&bad);
        assert_eq!(pos, Ok(Some(("main".to_string(), 3))));
        assert!(matches!(task, Err(CodecError::Checksum { .. })), "{task:?}");
        // In the position: the record still reads.
        let mut bad = v.clone();
        bad[2 + p / 2] ^= 0x40;
        let (pos, task) = decode_live(&bad);
        assert!(pos.is_err());
        assert_eq!(task, Ok(t.clone()));
        // In the summary: the value reads whole, as a format-7 one would.
        let mut bad = v.clone();
        bad[3 + p + s / 2] ^= 0x40;
        assert_eq!(summary(&bad), None);
        assert_eq!(
            decode_live(&bad),
            (Ok(Some(("main".to_string(), 3))), Ok(t.clone()))
        );
        assert!(check_summary(&bad, &t).is_err_and(|e| e.contains("its summary")));
        // In the record: no summary either (its frame is checked), so the
        // open decodes the record and reports it.
        let mut bad = v.clone();
        bad[3 + p + s + r / 2] ^= 0x40;
        assert_eq!(summary(&bad), None);
        // Cut anywhere: never a summary with a record that is not whole.
        for cut in 0..v.len() {
            assert_eq!(summary(&v[..cut]), None, "cut at {cut}");
            let _ = decode_live(&v[..cut]);
        }
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
