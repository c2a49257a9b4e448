//! A commit record: one committed transaction's events (the log) and the
//! exact key writes it made (the redo), and their codec.
//!
//! A new task is in a record twice: whole in its `Enqueued` event, and as
//! the value of its `t` key (`stored::live_bytes`: its queue position, its
//! summary and its record), which is that task again. From version 3 on
//! (`codec::COMMIT_VERSION`) such a write names the event instead of
//! carrying the bytes: the key, the event's index in the record and the
//! task's place in its queue, about a dozen bytes instead of a hundred or
//! more. Decoding the record makes the value again from the event, so every
//! reader of a record gets its key writes whole, byte for byte as they were
//! applied.
//!
//! A key write's body, after its key: `0` (the key is removed), `1` and the
//! value's bytes (the key is set: this is `Option<Vec<u8>>`'s body, so a
//! version-1 or 2 write is the same), or, in a version-3 commit record
//! only, `2`, the event's index (`u32`) and the position
//! (`Option<i64>`). Decoding checks that the event enqueued the task the
//! key names, and that no two writes name the same event (so a small
//! record cannot make a large one: each task is made again at most once).

use bincode::de::{BorrowDecoder, Decoder};
use bincode::enc::Encoder;
use bincode::error::{DecodeError, EncodeError};
use bincode::{BorrowDecode, Decode, Encode};

use crate::codec::{self, Layout};
use crate::store::event::{Event, EventKind};
use crate::store::keys::{self, TASK};
use crate::store::stored;

/// One committed transaction, stored under `e` + the sequence number of its
/// first event: its events (the log) and the exact key writes it made (the
/// redo), so the last transaction can be re-applied after a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitRecord {
    /// The next task id after this transaction.
    pub next_id: u64,
    pub events: Vec<Event>,
    pub writes: Vec<KeyWrite>,
}

/// A key set to a value, or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWrite {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
    /// Set when `value` is the live value of the task an `Enqueued` event
    /// of the same record adds (`stored::live_bytes` of its task at
    /// `position`): a version-3 record stores this instead of the value.
    pub from_event: Option<FromEvent>,
}

/// Which event of its record a key write's value is made from (see the
/// module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FromEvent {
    /// The event's index in the record's events.
    pub event: u32,
    /// The task's place in its queue (`order`), none for a task in no queue.
    pub position: Option<i64>,
}

impl KeyWrite {
    /// `key` set to `value`.
    pub fn put(key: Vec<u8>, value: Vec<u8>) -> KeyWrite {
        KeyWrite {
            key,
            value: Some(value),
            from_event: None,
        }
    }

    /// `key` removed.
    pub fn remove(key: Vec<u8>) -> KeyWrite {
        KeyWrite {
            key,
            value: None,
            from_event: None,
        }
    }
}

const REMOVED: u8 = 0;
const SET: u8 = 1;
const FROM_EVENT: u8 = 2;

impl Encode for KeyWrite {
    fn encode<E: Encoder>(&self, e: &mut E) -> Result<(), EncodeError> {
        self.key.encode(e)?;
        match (&self.from_event, &self.value) {
            (Some(f), _) if codec::encoding_version() >= codec::COMMIT_VERSION => {
                FROM_EVENT.encode(e)?;
                f.event.encode(e)?;
                f.position.encode(e)
            }
            (_, value) => value.encode(e),
        }
    }
}

/// A key write's body (see the module doc). `events` are the record's, to
/// make a value from; None for a key write decoded on its own, which cannot
/// name an event.
fn decode_write<D: Decoder<Context = Layout>>(
    d: &mut D,
    events: Option<&[Event]>,
    named: &mut [bool],
) -> Result<KeyWrite, DecodeError> {
    let version = d.context().version;
    let key: Vec<u8> = Decode::decode(d)?;
    let tag: u8 = Decode::decode(d)?;
    match tag {
        REMOVED => Ok(KeyWrite::remove(key)),
        SET => Ok(KeyWrite::put(key, Decode::decode(d)?)),
        FROM_EVENT if version >= codec::COMMIT_VERSION => {
            let f = FromEvent {
                event: Decode::decode(d)?,
                position: Decode::decode(d)?,
            };
            let Some(events) = events else {
                return Err(DecodeError::Other(
                    "a key write that names an event is read only in its commit record",
                ));
            };
            let i = usize::try_from(f.event).unwrap_or(usize::MAX);
            let task = match events.get(i).map(|e| &e.kind) {
                Some(EventKind::Enqueued { task, .. }) => task,
                _ => {
                    return Err(DecodeError::Other(
                        "a key write names an event of its record that enqueued no task",
                    ));
                }
            };
            if key != keys::id_key(TASK, task.id) {
                return Err(DecodeError::Other(
                    "a key write names the event of a task whose key it is not",
                ));
            }
            match named.get_mut(i) {
                Some(seen @ false) => *seen = true,
                _ => {
                    return Err(DecodeError::Other(
                        "two key writes name the same event of their record",
                    ));
                }
            }
            Ok(KeyWrite {
                key,
                value: Some(stored::live_bytes(task, f.position)),
                from_event: Some(f),
            })
        }
        found => Err(DecodeError::UnexpectedVariant {
            type_name: "KeyWrite",
            allowed: match events {
                Some(_) if version >= codec::COMMIT_VERSION => {
                    &bincode::error::AllowedEnumVariants::Range { min: 0, max: 2 }
                }
                _ => &bincode::error::AllowedEnumVariants::Range { min: 0, max: 1 },
            },
            found: u32::from(found),
        }),
    }
}

impl Decode<Layout> for KeyWrite {
    fn decode<D: Decoder<Context = Layout>>(d: &mut D) -> Result<Self, DecodeError> {
        decode_write(d, None, &mut [])
    }
}

impl<'de> BorrowDecode<'de, Layout> for KeyWrite {
    fn borrow_decode<D: BorrowDecoder<'de, Context = Layout>>(
        d: &mut D,
    ) -> Result<Self, DecodeError> {
        Decode::decode(d)
    }
}

impl Encode for CommitRecord {
    fn encode<E: Encoder>(&self, e: &mut E) -> Result<(), EncodeError> {
        self.next_id.encode(e)?;
        self.events.encode(e)?;
        self.writes.encode(e)
    }
}

impl Decode<Layout> for CommitRecord {
    fn decode<D: Decoder<Context = Layout>>(d: &mut D) -> Result<Self, DecodeError> {
        let next_id = Decode::decode(d)?;
        let events: Vec<Event> = Decode::decode(d)?;
        // As bincode decodes a Vec: its length claimed against the
        // allocation limit first.
        let len = u64::decode(d)?;
        let len = usize::try_from(len).map_err(|_| DecodeError::OutsideUsizeRange(len))?;
        d.claim_container_read::<KeyWrite>(len)?;
        let mut named = vec![false; events.len()];
        let mut writes = Vec::with_capacity(len);
        for _ in 0..len {
            d.unclaim_bytes_read(std::mem::size_of::<KeyWrite>());
            writes.push(decode_write(d, Some(&events), &mut named)?);
        }
        Ok(CommitRecord {
            next_id,
            events,
            writes,
        })
    }
}

impl<'de> BorrowDecode<'de, Layout> for CommitRecord {
    fn borrow_decode<D: BorrowDecoder<'de, Context = Layout>>(
        d: &mut D,
    ) -> Result<Self, DecodeError> {
        Decode::decode(d)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::budget::Budget;
    use crate::store::{Options, Placement, Store};
    use crate::task::{Task, TaskSpec};

    fn task(id: u64, payload: serde_json::Value) -> Task {
        let spec = TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: format!("t{id}"),
            payload,
            ..Default::default()
        };
        let mut t = spec.into_task(42, &Budget::default()).expect("task");
        t.id = id;
        t
    }

    fn enqueued(seq: u64, t: &Task) -> Event {
        Event {
            seq,
            at: 1_800_000_000_000,
            kind: EventKind::Enqueued {
                task: Box::new(t.clone()),
                placement: Some(Placement::Last),
            },
        }
    }

    fn named(key: Vec<u8>, t: &Task, event: u32, position: Option<i64>) -> KeyWrite {
        KeyWrite {
            key,
            value: Some(stored::live_bytes(t, position)),
            from_event: Some(FromEvent { event, position }),
        }
    }

    /// Two new tasks (one with a large payload), their key writes naming
    /// their events, and a write of another kind.
    fn record() -> (CommitRecord, Task, Task) {
        let small = task(1, serde_json::json!({"n": 1}));
        let big = task(2, serde_json::json!({"text": "x".repeat(20_000)}));
        let rec = CommitRecord {
            next_id: 3,
            events: vec![enqueued(1, &small), enqueued(2, &big)],
            writes: vec![
                named(keys::id_key(TASK, 2).to_vec(), &big, 1, Some(5)),
                named(keys::id_key(TASK, 1).to_vec(), &small, 0, None),
                KeyWrite::remove(b"h\0\0\0\0\0\0\0\x09".to_vec()),
                KeyWrite::put(b"cK".to_vec(), vec![1, 2, 3]),
            ],
        };
        (rec, small, big)
    }

    fn at(rec: &CommitRecord, version: u8) -> Vec<u8> {
        codec::encode_as(rec, version).expect("encodes")
    }

    /// The body after the framing: what a test crafts a record from.
    fn body(bytes: &[u8]) -> Vec<u8> {
        bytes[1..bytes.len() - 4].to_vec()
    }

    fn frame(version: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![version];
        out.extend_from_slice(body);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn a_write_that_names_its_event_reads_back_whole_and_costs_a_few_bytes() {
        let (rec, _, big) = record();
        let v3 = at(&rec, codec::COMMIT_VERSION);
        let back: CommitRecord = codec::decode(&v3).expect("decodes");
        assert_eq!(back, rec, "the values are made again, byte for byte");
        // Version 2 carries the values: each new task a second time.
        let v2 = at(&rec, codec::FORMAT_VERSION);
        let carried: usize = rec.writes[..2]
            .iter()
            .map(|w| w.value.as_ref().map_or(0, Vec::len))
            .sum();
        assert!(carried > codec::encode(&big).len());
        let saved = v2.len() - v3.len();
        assert!(
            saved + 2 * 16 >= carried && saved <= carried,
            "version 3 saves the values' bytes less a few: saved {saved} of {carried}"
        );
        let back2: CommitRecord = codec::decode(&v2).expect("decodes");
        assert_eq!(back2.writes.len(), rec.writes.len());
        for (a, b) in back2.writes.iter().zip(&rec.writes) {
            assert_eq!((&a.key, &a.value), (&b.key, &b.value));
            assert_eq!(a.from_event, None, "version 2 cannot name an event");
        }
    }

    /// A version-3 record whose second write names `event` for the key of
    /// task `id`.
    fn crafted(event: u32, id: u64) -> Vec<u8> {
        let (mut rec, small, _) = record();
        rec.writes[1] = named(keys::id_key(TASK, id).to_vec(), &small, event, None);
        at(&rec, codec::COMMIT_VERSION)
    }

    fn refusal(bytes: &[u8]) -> String {
        match codec::decode::<CommitRecord>(bytes) {
            Ok(r) => panic!("decoded {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_write_that_names_no_fit_event_is_refused() {
        assert!(codec::decode::<CommitRecord>(&crafted(0, 1)).is_ok());
        let out_of_range = refusal(&crafted(7, 1));
        assert!(out_of_range.contains("enqueued no task"), "{out_of_range}");
        let other_task = refusal(&crafted(1, 1));
        assert!(other_task.contains("whose key it is not"), "{other_task}");
        // The same event named by two writes for the same key.
        let (mut rec, small, _) = record();
        rec.writes[0] = named(keys::id_key(TASK, 1).to_vec(), &small, 0, None);
        let repeat = refusal(&at(&rec, codec::COMMIT_VERSION));
        assert!(repeat.contains("same event"), "{repeat}");

        // An event that enqueued nothing.
        let (mut rec, _, _) = record();
        rec.events[0].kind = EventKind::Started { id: 1 };
        let started = refusal(&at(&rec, codec::COMMIT_VERSION));
        assert!(started.contains("enqueued no task"), "{started}");
    }

    #[test]
    fn only_a_version_3_commit_record_may_name_an_event() {
        let (rec, _, _) = record();
        let v3 = at(&rec, codec::COMMIT_VERSION);
        // The same body framed as version 2: its tag 2 is no option there.
        let as_v2 = refusal(&frame(codec::FORMAT_VERSION, &body(&v3)));
        assert!(as_v2.contains("KeyWrite"), "{as_v2}");
        // A key write on its own cannot name an event.
        let w = &rec.writes[0];
        let alone = codec::encode_as(w, codec::COMMIT_VERSION).expect("encodes");
        let e = codec::decode::<KeyWrite>(&alone).expect_err("refused");
        assert!(e.to_string().contains("only in its commit record"), "{e}");
        // Writes that name nothing read the same at every version.
        for w in &rec.writes[2..] {
            let (a, b) = (codec::encode(w), codec::encode_as(w, codec::COMMIT_VERSION));
            assert_eq!(body(&a), body(&b.expect("encodes")));
        }
    }

    /// Through the store: a batch's new tasks are written naming their
    /// events, the log's record reads back with the values the tree holds,
    /// and a task changed again in its transaction carries its value.
    #[test]
    fn a_commit_names_the_events_of_the_tasks_it_adds_unchanged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(crate::clock::FakeClock::new(1_800_000_000_000));
        let s = Store::open(dir.path(), Options::default(), clock).expect("open");
        let mut txn = s.write();
        let a = txn
            .enqueue(task(0, serde_json::json!({"n": 1})), Some(Placement::Last))
            .expect("a");
        let b = txn
            .enqueue(task(0, serde_json::json!({"n": 2})), Some(Placement::Last))
            .expect("b");
        let waiting = txn
            .enqueue(task(0, serde_json::json!({"n": 3})), None)
            .expect("waiting");
        txn.start(b).expect("start b");
        txn.commit().expect("commit");
        let rec = s
            .log_view()
            .read(0, u64::MAX)
            .last()
            .expect("a record")
            .expect("reads")
            .record()
            .expect("decodes");
        let of = |id: u64| {
            rec.writes
                .iter()
                .find(|w| w.key == keys::id_key(TASK, id))
                .expect("its write")
        };
        assert_eq!(of(a).from_event.map(|f| f.event), Some(0));
        assert!(of(a).from_event.and_then(|f| f.position).is_some());
        assert_eq!(of(waiting).from_event.map(|f| f.event), Some(2));
        assert_eq!(of(waiting).from_event.and_then(|f| f.position), None);
        assert_eq!(of(b).from_event, None, "started in its transaction");
        for id in [a, b, waiting] {
            let stored = s.get_raw(&keys::id_key(TASK, id)).expect("read");
            assert_eq!(stored.as_deref(), of(id).value.as_deref(), "task {id}");
        }
    }
}
