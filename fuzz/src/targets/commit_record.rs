//! Commit records and their replay (`berth::store::event`,
//! `berth::store::verify`): a log that `verify` and offline replay read.
//!
//! The first byte picks how the rest is read:
//! - even: structured. `arbitrary` builds a record of up to 64 events about
//!   a handful of task ids and queues (so that they collide), which is
//!   encoded as a commit writes it (version 3: each new task's key write
//!   names its event), decoded back (it must round-trip, the key writes'
//!   values made again from their events) and replayed;
//! - odd: raw. The rest is a record's version byte and body, framed with a
//!   correct checksum and decoded; whatever decodes is replayed.
//!
//! Events include `expired` (which the model accepts only for a task that
//! never started, see `ttl`).
//!
//! Asserts, for every event applied to the model (`verify::Model::apply`):
//! - it never panics;
//! - an event the model refuses leaves it exactly as it was;
//! - an event it accepts leaves it consistent: no task both live and
//!   finished, every queued id a live task whose `queue` is that queue,
//!   in exactly one position, no empty queue kept, each task under its own id.

use std::collections::BTreeSet;

use arbitrary::{Arbitrary, Unstructured};
use berth::budget::Blob;
use berth::codec;
use berth::store::event::{CommitRecord, Event, EventKind, FromEvent, KeyWrite};
use berth::store::order::Placement;
use berth::store::verify::Model;
use berth::store::{keys, stored};
use berth::task::{Status, Task};

const QUEUES: [&str; 3] = ["main", "parallel_queue_0", "q.1"];

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Id(u8);

impl Id {
    fn get(self) -> u64 {
        u64::from(self.0 % 8) + 1
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Queue(u8);

impl Queue {
    fn get(self) -> &'static str {
        QUEUES[usize::from(self.0) % QUEUES.len()]
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Place {
    Last,
    First,
    After(Id),
    Before(Id),
}

impl Place {
    fn get(self) -> Placement {
        match self {
            Place::Last => Placement::Last,
            Place::First => Placement::First,
            Place::After(a) => Placement::After(a.get()),
            Place::Before(b) => Placement::Before(b.get()),
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum St {
    Queued,
    Running,
    Succeeded,
    Failed,
}

impl St {
    fn get(self) -> Status {
        match self {
            St::Queued => Status::Queued,
            St::Running => Status::Running,
            St::Succeeded => Status::Succeeded,
            St::Failed => Status::Failed,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Ev {
    Enqueued {
        id: Id,
        queue: Queue,
        placement: Option<Place>,
        parent: Option<Id>,
        children: Vec<Id>,
    },
    Placed {
        id: Id,
        queue: Queue,
        placement: Place,
    },
    Started {
        id: Id,
    },
    Succeeded {
        id: Id,
        result: bool,
    },
    Failed {
        id: Id,
        delay_ms: Option<u16>,
    },
    Requeued {
        id: Id,
        retry_at: Option<u16>,
    },
    GroupUpdated {
        id: Id,
        failures: u8,
    },
    Removed {
        id: Id,
    },
    MovedToHistory {
        id: Id,
        status: St,
    },
    Retried {
        id: Id,
        placement: Place,
    },
    /// Last, so that older structured seeds read as before where they can.
    Expired {
        id: Id,
    },
    RetriedAnew {
        id: Id,
        placement: Place,
    },
}

fn task(id: u64, queue: &str, parent: Option<u64>, children: Vec<u64>) -> Task {
    Task {
        id,
        kind: "ModuleRun".into(),
        queue: queue.into(),
        name: format!("t{id}"),
        description: None,
        weight: None,
        payload: Blob::default(),
        tags: Vec::new(),
        target: None,
        compaction_key: None,
        failures: 0,
        attempts: 0,
        last_failure: None,
        status: Status::Queued,
        queued_at: 1,
        started_at: None,
        finished_at: None,
        retry_at: None,
        parent,
        children: children.into(),
        result: None,
        // Every task may expire (its TTL ran out at 1 + 1000 ms, before the
        // events' time): the model checks the rest (never started, not a
        // dispatched child, a group that has not started).
        ttl_ms: Some(1_000),
    }
}

impl Ev {
    fn kind(self) -> EventKind {
        match self {
            Ev::Enqueued {
                id,
                queue,
                placement,
                parent,
                children,
            } => EventKind::Enqueued {
                task: Box::new(task(
                    id.get(),
                    queue.get(),
                    parent.map(Id::get),
                    children.into_iter().map(Id::get).collect(),
                )),
                placement: placement.map(Place::get),
            },
            Ev::Placed {
                id,
                queue,
                placement,
            } => EventKind::Placed {
                id: id.get(),
                queue: queue.get().into(),
                placement: placement.get(),
            },
            Ev::Started { id } => EventKind::Started { id: id.get() },
            Ev::Succeeded { id, result } => EventKind::Succeeded {
                id: id.get(),
                result: result.then(|| Blob {
                    compressed: false,
                    bytes: b"{\"ok\":true}".to_vec(),
                }),
            },
            Ev::Failed { id, delay_ms } => EventKind::Failed {
                id: id.get(),
                message: "boom".into(),
                delay_ms: delay_ms.map(u64::from),
            },
            Ev::Requeued { id, retry_at } => EventKind::Requeued {
                id: id.get(),
                retry_at: retry_at.map(u64::from),
            },
            Ev::GroupUpdated { id, failures } => EventKind::GroupUpdated {
                id: id.get(),
                name: "Parallel run for a".into(),
                failures: u32::from(failures),
                message: (failures > 0).then(|| "Errors:\n- a: boom".to_string()),
            },
            Ev::Removed { id } => EventKind::Removed { id: id.get() },
            Ev::MovedToHistory { id, status } => EventKind::MovedToHistory {
                id: id.get(),
                status: status.get(),
            },
            Ev::Retried { id, placement } => EventKind::Retried {
                id: id.get(),
                placement: placement.get(),
            },
            Ev::Expired { id } => EventKind::Expired { id: id.get() },
            Ev::RetriedAnew { id, placement } => EventKind::RetriedAnew {
                id: id.get(),
                placement: placement.get(),
            },
        }
    }
}

/// A structured record: where its events start, and the events, each with
/// a rare jump in its sequence number (a gap in the log).
#[derive(Arbitrary, Debug)]
struct Script {
    first_seq: u64,
    events: Vec<(Ev, u8)>,
}

fn record_from(script: Script) -> CommitRecord {
    let mut seq = script.first_seq;
    let mut events = Vec::new();
    for (ev, jump) in script.events.into_iter().take(64) {
        if jump == 0xff {
            seq = seq.wrapping_add(2);
        }
        events.push(Event {
            seq,
            at: 1_800_000_000_000,
            kind: ev.kind(),
        });
        seq = seq.wrapping_add(1);
    }
    // Each new task's key write names its event, as a commit writes it
    // (a version-3 record), with a position or none.
    let mut writes = vec![KeyWrite::remove(b"mapplied".to_vec())];
    for (i, e) in events.iter().enumerate() {
        if let EventKind::Enqueued { task, .. } = &e.kind {
            let position = (i % 2 == 0).then_some(i as i64 - 32);
            writes.push(KeyWrite {
                key: keys::id_key(keys::TASK, task.id).to_vec(),
                value: Some(stored::live_bytes(task, position)),
                from_event: Some(FromEvent {
                    event: i as u32,
                    position,
                }),
            });
        }
    }
    CommitRecord {
        next_id: 9,
        events,
        writes,
    }
}

/// Why the model is inconsistent, if it is.
pub fn inconsistency(m: &Model) -> Option<String> {
    for (id, t) in m.live.iter().chain(m.history.iter()) {
        if *id != t.id {
            return Some(format!("task {} is kept under id {id}", t.id));
        }
    }
    if let Some(id) = m.live.keys().find(|id| m.history.contains_key(id)) {
        return Some(format!("task {id} is both live and finished"));
    }
    let mut seen = BTreeSet::new();
    for (q, ids) in &m.queues {
        if ids.is_empty() {
            return Some(format!("queue '{q}' is kept empty"));
        }
        for id in ids {
            if !seen.insert(*id) {
                return Some(format!("task {id} is in more than one queue position"));
            }
            match m.live.get(id) {
                None => return Some(format!("queue '{q}' holds task {id}, which is not live")),
                Some(t) if t.queue != *q => {
                    return Some(format!(
                        "queue '{q}' holds task {id}, whose queue is '{}'",
                        t.queue
                    ));
                }
                Some(_) => {}
            }
        }
    }
    None
}

/// Replays `events` into `model`, checking the properties after each.
pub fn replay_checked(model: &mut Model, events: &[Event]) {
    for ev in events {
        let before = model.clone();
        match model.apply(ev.clone()) {
            Ok(()) => {
                if let Some(why) = inconsistency(model) {
                    panic!(
                        "event {ev:?} left the model inconsistent: {why}\nbefore: {before:#?}\nafter: {model:#?}"
                    );
                }
            }
            Err(e) => {
                assert!(
                    *model == before,
                    "event {ev:?} was refused ({e}) but changed the model\nbefore: {before:#?}\nafter: {model:#?}"
                );
                // Replay stops at an error; so does this.
                return;
            }
        }
    }
}

pub fn commit_record(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let record = if mode & 1 == 0 {
        let Ok(script) = Script::arbitrary_take_rest(Unstructured::new(rest)) else {
            return;
        };
        let record = record_from(script);
        let bytes = codec::encode_as(&record, codec::COMMIT_VERSION).expect("encodes");
        let back: CommitRecord = codec::decode(&bytes).expect("an encoded record decodes");
        assert_eq!(back, record, "a record round-trips through the codec");
        record
    } else {
        match codec::decode::<CommitRecord>(&super::codec::frame(rest)) {
            Ok(r) => r,
            Err(_) => return,
        }
    };
    let mut model = Model::default();
    replay_checked(&mut model, &record.events);
    // The same events again, after what they built: every id now collides.
    let mut again = model.clone();
    let shifted: Vec<Event> = record
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| Event {
            seq: model.last_seq.wrapping_add(1 + i as u64),
            ..e.clone()
        })
        .collect();
    replay_checked(&mut again, &shifted);
}
