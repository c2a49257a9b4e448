//! Export files (`berth export`, `berth import`, and the daemon's backups):
//! the byte format alone. What goes in and how an import writes it is in
//! `ops/transfer.rs`; this module knows no store and no command line.
//!
//! An export file holds tasks, whole as they were stored (payload and
//! result blobs as stored, compressed or not), where each was (in a queue,
//! waiting for its group, or in the history), and each queue's order of the
//! queued ones. Group relations are the tasks' own `parent` and `children`
//! fields. All numbers are little-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `BERTHEXP` |
//! | 8 | 2 | format version, 1 |
//! | 10 | 2 | flags: bit 0 set when finished tasks were asked for (`--history`); the other bits are 0 |
//! | 12 | 8 | when the file was made, ms since the epoch |
//! | 20 | 2 | length `n` of the source node's name, at most 64 (0: no name) |
//! | 22 | `n` | the source node's name, UTF-8 |
//! | 22+n | 4 | task count `T` |
//! | 26+n | 4 | queue count `Q` |
//! | 30+n | 4 | group count `G` (tasks with children) |
//! | 34+n | 8 | length `R` of the records once decompressed, at most [`MAX_RAW_BYTES`] |
//! | 42+n | 8 | compressed length `N` |
//! | 50+n | `N` | one zstd frame: `T` task records, then `Q` queue records; each is its length (4 bytes) and the record as the codec frames it (version byte, bincode body, CRC-32) |
//! | 50+n+N | 4 | CRC-32 (IEEE) of bytes `0 .. 50+n+N` |
//!
//! A task record's body is [`Exported`]: its place (a bincode variant
//! index: 0 in a queue, 1 waiting for its group, 2 in the history) and the
//! `Task` (its fields in `Task`'s declaration order, see ARCHITECTURE.md).
//! A queue record's body is [`QueueOrder`]: the queue's name and the ids of
//! its exported tasks, head first. Tasks are listed queue by queue in queue
//! order, then the waiting ones, then the history, each by id.
//!
//! Reading ([`decode`]) checks, in this order and before it inflates
//! anything: the length, the magic, the version, the flags, the name, that
//! `N` is what the file holds, that `R` is at most [`MAX_RAW_BYTES`], and
//! the trailing CRC; then it inflates exactly `R` bytes, cuts `T + Q`
//! records apart, decodes each (each has its own CRC), and checks that they
//! agree ([`Export::check`]): ids are unique; every queued task is in
//! exactly one queue record, the one its `queue` names, and queue records
//! name only queued tasks; waiting tasks are group children; queued and
//! waiting tasks are `queued` or `running`, the history's are finished; a
//! group is whole (every child names its parent, which lists it) and flat
//! (no task is its own parent or child, no child has children, no live
//! child has a finished parent); `G` is the number of groups.

use bincode::{Decode, Encode};

use crate::codec;
use crate::frame::{self, u16_at, u32_at, u64_at};
use crate::task::{Status, Task, check_name};

const MAGIC: &[u8; 8] = b"BERTHEXP";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;
/// Flag bit 0: finished tasks were asked for.
const FLAG_HISTORY: u16 = 1;
/// The header's size without the node's name.
const HEADER: usize = 50;
/// The longest node name (the rule of `check_name`).
const MAX_NODE: usize = 64;
/// The most an export's records may take decompressed.
pub const MAX_RAW_BYTES: u64 = 1 << 30;
/// The zstd level exports are written with.
const LEVEL: i32 = 3;

/// Where a task was when it was exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode)]
#[bincode(decode_context = "crate::codec::Layout")]
pub enum Place {
    /// In a queue: its queue record gives its position.
    Queue,
    /// Live but in no queue: a group child waiting for its parent.
    Waiting,
    /// Finished, in the history.
    History,
}

/// One task record.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
#[bincode(decode_context = "crate::codec::Layout")]
pub struct Exported {
    pub place: Place,
    pub task: Task,
}

/// One queue record: the ids of the queue's exported tasks, head first.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
#[bincode(decode_context = "crate::codec::Layout")]
pub struct QueueOrder {
    pub name: String,
    pub ids: Vec<u64>,
}

/// An export file's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// When it was made (ms since the epoch).
    pub created_at: u64,
    /// The node it came from, if it has a name.
    pub node: Option<String>,
    /// Finished tasks were asked for.
    pub history: bool,
    pub tasks: Vec<Exported>,
    pub queues: Vec<QueueOrder>,
}

/// Why bytes are not a readable export.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not a berth export file ({0})")]
    NotExport(String),
    #[error("export format version {0}; this build reads version {VERSION}")]
    Version(u16),
    #[error("the file is damaged: {0}")]
    Damaged(String),
    #[error("the file is damaged: record {index} {why}")]
    Record { index: usize, why: String },
    #[error("the file is inconsistent: {0}")]
    Inconsistent(String),
    #[error("the export is too large: {0}")]
    TooLarge(String),
}

impl Export {
    /// The number of groups (tasks with children).
    pub fn groups(&self) -> usize {
        self.tasks
            .iter()
            .filter(|e| !e.task.children.is_empty())
            .count()
    }

    /// Checks that the records agree (see the module doc).
    pub fn check(&self) -> Result<(), FormatError> {
        use std::collections::{BTreeMap, BTreeSet};
        let bad = |why: String| Err(FormatError::Inconsistent(why));
        let mut by_id: BTreeMap<u64, &Exported> = BTreeMap::new();
        for e in &self.tasks {
            if by_id.insert(e.task.id, e).is_some() {
                return bad(format!("task {} is in it twice", e.task.id));
            }
            let live = matches!(e.task.status, Status::Queued | Status::Running);
            let t = &e.task;
            match e.place {
                Place::History if live => {
                    return bad(format!(
                        "task {} is in the history but {}",
                        t.id,
                        t.status.as_str()
                    ));
                }
                Place::Queue | Place::Waiting if !live => {
                    return bad(format!("task {} is live but {}", t.id, t.status.as_str()));
                }
                Place::Waiting if t.parent.is_none() => {
                    return bad(format!(
                        "task {} waits in no queue but is not in a group",
                        t.id
                    ));
                }
                _ => {}
            }
        }
        let mut placed = BTreeSet::new();
        let mut names = BTreeSet::new();
        for q in &self.queues {
            if !names.insert(q.name.as_str()) {
                return bad(format!("queue {} has two records", q.name));
            }
            if q.ids.is_empty() {
                return bad(format!("queue {} has an empty record", q.name));
            }
            for id in &q.ids {
                let Some(e) = by_id.get(id) else {
                    return bad(format!(
                        "queue {} lists task {id}, which it does not hold",
                        q.name
                    ));
                };
                if e.place != Place::Queue || e.task.queue != q.name {
                    return bad(format!(
                        "queue {} lists task {id}, which is not queued there",
                        q.name
                    ));
                }
                if !placed.insert(*id) {
                    return bad(format!("task {id} is queued twice"));
                }
            }
        }
        for e in &self.tasks {
            let t = &e.task;
            if e.place == Place::Queue && !placed.contains(&t.id) {
                return bad(format!("task {} is queued but in no queue record", t.id));
            }
            // A group is one parent and its children, none a group itself.
            if t.parent == Some(t.id) || t.children.contains(&t.id) {
                return bad(format!("task {} is its own group's parent or child", t.id));
            }
            if let (Some(p), false) = (t.parent, t.children.is_empty()) {
                return bad(format!(
                    "task {} is a child of task {p} and has children of its own: a group's \
                     children are not groups",
                    t.id
                ));
            }
            if let Some(p) = t.parent
                && e.place != Place::History
                && by_id.get(&p).is_some_and(|pe| pe.place == Place::History)
            {
                return bad(format!(
                    "task {} is live but its group's parent, task {p}, is finished (a group \
                     ends when its last child does)",
                    t.id
                ));
            }
            if let Some(p) = t.parent {
                let listed = by_id
                    .get(&p)
                    .is_some_and(|pe| pe.task.children.contains(&t.id));
                if !listed {
                    return bad(format!(
                        "task {} is a child of task {p}, which is not in the file or does not list it",
                        t.id
                    ));
                }
            }
            let mut seen = BTreeSet::new();
            for c in t.children.iter() {
                let names_it = by_id.get(c).is_some_and(|ce| ce.task.parent == Some(t.id));
                if !names_it || !seen.insert(*c) {
                    return bad(format!(
                        "task {} lists child {c}, which is not in the file (or not once) as its child",
                        t.id
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The file's bytes. Refused when the records would take more than
/// [`MAX_RAW_BYTES`] or do not agree.
pub fn encode(export: &Export) -> Result<Vec<u8>, FormatError> {
    export.check()?;
    let node = export.node.as_deref().unwrap_or("");
    if node.len() > MAX_NODE {
        return Err(FormatError::Inconsistent(format!(
            "the node name is {} bytes; at most {MAX_NODE}",
            node.len()
        )));
    }
    let mut records: Vec<Vec<u8>> = Vec::with_capacity(export.tasks.len() + export.queues.len());
    let mut raw_len = 0u64;
    let sizes = export
        .tasks
        .iter()
        .map(codec::encode)
        .chain(export.queues.iter().map(codec::encode));
    for r in sizes {
        raw_len += 4 + r.len() as u64;
        if raw_len > MAX_RAW_BYTES {
            return Err(FormatError::TooLarge(format!(
                "its records take more than {} bytes; an export holds at most {MAX_RAW_BYTES}",
                MAX_RAW_BYTES
            )));
        }
        records.push(r);
    }
    let raw = frame::pack(&records);
    drop(records);
    let packed = frame::compress(&raw, LEVEL).map_err(|e| FormatError::TooLarge(e.to_string()))?;
    let count = |n: usize, what: &str| {
        u32::try_from(n).map_err(|_| FormatError::TooLarge(format!("{n} {what}")))
    };
    let mut out = Vec::with_capacity(HEADER + node.len() + packed.len() + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    let flags = if export.history { FLAG_HISTORY } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&export.created_at.to_le_bytes());
    out.extend_from_slice(&(node.len() as u16).to_le_bytes());
    out.extend_from_slice(node.as_bytes());
    out.extend_from_slice(&count(export.tasks.len(), "tasks")?.to_le_bytes());
    out.extend_from_slice(&count(export.queues.len(), "queues")?.to_le_bytes());
    out.extend_from_slice(&count(export.groups(), "groups")?.to_le_bytes());
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(&(packed.len() as u64).to_le_bytes());
    out.extend_from_slice(&packed);
    frame::seal(&mut out);
    Ok(out)
}

/// What the header says.
struct Header {
    created_at: u64,
    node: Option<String>,
    history: bool,
    tasks: u32,
    queues: u32,
    groups: u32,
    raw_len: u64,
    /// Where the zstd frame starts.
    body: usize,
}

/// How many of a file's first bytes [`check_start`] looks at: the header
/// without the node's name and the counts after it.
pub const START: usize = 22;

/// Checks what a file's first bytes (up to [`START`], fewer when the file
/// is shorter) say: the magic, the version, the flags and the length of
/// the node's name. A reader calls it before it reads the rest, so a file
/// (or a device, or a stream) that is no export is refused at once, not
/// once up to the largest export has been read.
pub fn check_start(bytes: &[u8]) -> Result<(), FormatError> {
    let damaged = |why: String| FormatError::Damaged(why);
    if bytes.len() < 8 || &bytes[..8] != MAGIC {
        let why = match bytes.len() {
            0 => "it is empty".to_string(),
            n if n < 8 => format!("{n} bytes, no BERTHEXP magic"),
            _ => "no BERTHEXP magic at its start".to_string(),
        };
        return Err(FormatError::NotExport(why));
    }
    if bytes.len() < 10 {
        return Ok(());
    }
    let version = u16_at(bytes, 8);
    if version != VERSION {
        return Err(FormatError::Version(version));
    }
    if bytes.len() < 12 {
        return Ok(());
    }
    let flags = u16_at(bytes, 10);
    if flags & !FLAG_HISTORY != 0 {
        return Err(damaged(format!("unknown flags {flags:#06x}")));
    }
    if bytes.len() < 22 {
        return Ok(());
    }
    let n = u16_at(bytes, 20) as usize;
    if n > MAX_NODE {
        return Err(damaged(format!(
            "its node name claims {n} bytes; at most {MAX_NODE}"
        )));
    }
    Ok(())
}

/// Checks the header and the checksum (nothing is inflated yet).
fn header(bytes: &[u8]) -> Result<Header, FormatError> {
    let damaged = |why: String| FormatError::Damaged(why);
    check_start(bytes)?;
    // The header with the node's name, and the checksum after the records.
    let n = match bytes.len() {
        len if len >= 22 => u16_at(bytes, 20) as usize,
        _ => 0,
    };
    if bytes.len() < HEADER + n + 4 {
        let with = match n {
            0 => String::new(),
            n => format!(", with its {n}-byte node name"),
        };
        return Err(damaged(format!(
            "{} bytes is too short for its header and checksum ({} bytes{with})",
            bytes.len(),
            HEADER + n + 4
        )));
    }
    let flags = u16_at(bytes, 10);
    let at = 22 + n;
    let (raw_len, packed_len) = (u64_at(bytes, at + 12), u64_at(bytes, at + 20));
    let holds = (bytes.len() - HEADER - n - 4) as u64;
    if packed_len != holds {
        return Err(damaged(format!(
            "it says {packed_len} compressed bytes but holds {holds} (cut short, or grown)"
        )));
    }
    if raw_len > MAX_RAW_BYTES {
        return Err(damaged(format!(
            "it claims {raw_len} bytes of records; at most {MAX_RAW_BYTES} are read"
        )));
    }
    frame::check_seal(bytes).map_err(damaged)?;
    let node = std::str::from_utf8(&bytes[22..at])
        .map_err(|_| damaged("its node name is not UTF-8".into()))?;
    if !node.is_empty() {
        check_name("node", node).map_err(damaged)?;
    }
    Ok(Header {
        created_at: u64_at(bytes, 12),
        node: (!node.is_empty()).then(|| node.to_string()),
        history: flags & FLAG_HISTORY != 0,
        tasks: u32_at(bytes, at),
        queues: u32_at(bytes, at + 4),
        groups: u32_at(bytes, at + 8),
        raw_len,
        body: HEADER + n,
    })
}

/// Reads an export file's bytes, checking everything (see the module doc).
pub fn decode(bytes: &[u8]) -> Result<Export, FormatError> {
    let h = header(bytes)?;
    let raw = frame::inflate(&bytes[h.body..bytes.len() - 4], h.raw_len, MAX_RAW_BYTES)
        .map_err(FormatError::Damaged)?;
    let records = frame::split(&raw).map_err(|e| FormatError::Record {
        index: e.index,
        why: e.why.to_string(),
    })?;
    let want = h.tasks as u64 + h.queues as u64;
    if records.len() as u64 != want {
        return Err(FormatError::Damaged(format!(
            "it holds {} records, its header says {} tasks and {} queues",
            records.len(),
            h.tasks,
            h.queues
        )));
    }
    let record = |index: usize, e: codec::CodecError| FormatError::Record {
        index,
        why: e.to_string(),
    };
    let (task_recs, queue_recs) = records.split_at(h.tasks as usize);
    let mut tasks = Vec::with_capacity(task_recs.len());
    for (i, r) in task_recs.iter().enumerate() {
        tasks.push(codec::decode::<Exported>(r).map_err(|e| record(i, e))?);
    }
    let mut queues = Vec::with_capacity(queue_recs.len());
    for (i, r) in queue_recs.iter().enumerate() {
        queues.push(codec::decode::<QueueOrder>(r).map_err(|e| record(task_recs.len() + i, e))?);
    }
    let export = Export {
        created_at: h.created_at,
        node: h.node,
        history: h.history,
        tasks,
        queues,
    };
    export.check()?;
    if export.groups() as u64 != h.groups as u64 {
        return Err(FormatError::Inconsistent(format!(
            "it holds {} groups, its header says {}",
            export.groups(),
            h.groups
        )));
    }
    Ok(export)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{Blob, Budget};
    use crate::task::TaskSpec;

    fn task(id: u64, queue: &str, status: Status) -> Task {
        let spec = TaskSpec {
            queue: queue.into(),
            kind: "ModuleRun".into(),
            name: format!("task-{id}"),
            payload: serde_json::json!({"id": id, "values": [1, 2, 3]}),
            ..Default::default()
        };
        let mut t = spec.into_task(1_000 + id, &Budget::default()).unwrap();
        t.id = id;
        t.status = status;
        t
    }

    /// Two queues, a group (parent 3 queued, child 4 waiting, child 5 in a
    /// parallel queue and running), and a finished task.
    fn sample() -> Export {
        let mut parent = task(3, "main", Status::Queued);
        parent.children = vec![4, 5].into();
        let mut c1 = task(4, "main", Status::Queued);
        c1.parent = Some(3);
        let mut c2 = task(5, "parallel_queue_0", Status::Running);
        c2.parent = Some(3);
        let mut big = task(1, "main", Status::Queued);
        big.payload = Blob {
            compressed: true,
            bytes: crate::budget::gzip(&vec![b'7'; 200_000]),
        };
        let e = |place, task| Exported { place, task };
        Export {
            created_at: 1_800_000_000_000,
            node: Some("edge-1".into()),
            history: true,
            tasks: vec![
                e(Place::Queue, big),
                e(Place::Queue, parent),
                e(Place::Queue, task(2, "other", Status::Queued)),
                e(Place::Queue, c2),
                e(Place::Waiting, c1),
                e(Place::History, task(6, "main", Status::Succeeded)),
            ],
            queues: vec![
                QueueOrder {
                    name: "main".into(),
                    ids: vec![1, 3],
                },
                QueueOrder {
                    name: "other".into(),
                    ids: vec![2],
                },
                QueueOrder {
                    name: "parallel_queue_0".into(),
                    ids: vec![5],
                },
            ],
        }
    }

    /// Recomputes the trailing CRC after a change to the header.
    fn reseal(b: &mut Vec<u8>) {
        b.truncate(b.len() - 4);
        frame::seal(b);
    }

    #[test]
    fn an_export_reads_back_as_written() {
        let x = sample();
        let bytes = encode(&x).unwrap();
        assert_eq!(&bytes[..8], b"BERTHEXP");
        assert_eq!(decode(&bytes).unwrap(), x);
        assert_eq!(x.groups(), 1);
        // No node, no history, no tasks.
        let empty = Export {
            created_at: 5,
            node: None,
            history: false,
            tasks: vec![],
            queues: vec![],
        };
        assert_eq!(decode(&encode(&empty).unwrap()).unwrap(), empty);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let bytes = encode(&sample()).unwrap();
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut} was accepted");
        }
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "a flip at byte {i} was accepted");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
    }

    #[test]
    fn magic_version_and_flags_are_checked_first_and_named() {
        let bytes = encode(&sample()).unwrap();
        let mut v = bytes.clone();
        v[8] = 2;
        assert_eq!(decode(&v).unwrap_err(), FormatError::Version(2));
        // Even without a valid checksum, the version is what is named.
        v[9] = 1;
        assert_eq!(decode(&v).unwrap_err(), FormatError::Version(258));
        let mut m = bytes.clone();
        m[0] = b'X';
        let e = decode(&m).unwrap_err();
        assert!(matches!(e, FormatError::NotExport(_)), "{e}");
        assert!(decode(b"").unwrap_err().to_string().contains("empty"));
        let mut f = bytes.clone();
        f[10] |= 4;
        reseal(&mut f);
        assert!(
            decode(&f)
                .unwrap_err()
                .to_string()
                .contains("unknown flags")
        );
    }

    #[test]
    fn a_crafted_length_claim_is_refused_before_inflating() {
        let mut b = encode(&sample()).unwrap();
        let at = 22 + "edge-1".len() + 12;
        b[at..at + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
        reseal(&mut b);
        let e = decode(&b).unwrap_err().to_string();
        assert!(e.contains("at most 1073741824 are read"), "{e}");
        // A smaller claim than the frame holds: refused by zstd, not cut.
        let mut b = encode(&sample()).unwrap();
        b[at..at + 8].copy_from_slice(&10u64.to_le_bytes());
        reseal(&mut b);
        assert!(matches!(decode(&b), Err(FormatError::Damaged(_))));
    }

    #[test]
    fn records_that_disagree_are_refused() {
        type Change = Box<dyn Fn(&mut Export)>;
        let cases: Vec<(&str, Change)> = vec![
            ("twice", Box::new(|x| x.tasks.push(x.tasks[2].clone()))),
            (
                "no queue record",
                Box::new(|x| x.queues.remove(1).name.clear()),
            ),
            ("does not hold", Box::new(|x| x.queues[1].ids.push(99))),
            ("not queued there", Box::new(|x| x.queues[1].ids.push(1))),
            (
                "in the history but queued",
                Box::new(|x| x.tasks[5].task.status = Status::Queued),
            ),
            (
                "live but succeeded",
                Box::new(|x| x.tasks[0].task.status = Status::Succeeded),
            ),
            (
                "not in a group",
                Box::new(|x| x.tasks[4].task.parent = None),
            ),
            (
                "a child of task 3",
                Box::new(|x| x.tasks[1].task.children = vec![5].into()),
            ),
            (
                "lists child 9",
                Box::new(|x| {
                    x.tasks[1].task.children = [&x.tasks[1].task.children[..], &[9]].concat().into()
                }),
            ),
            (
                "two records",
                Box::new(|x| {
                    let q = x.queues[1].clone();
                    x.queues.push(q)
                }),
            ),
            (
                "task 2 is its own group's parent or child",
                Box::new(|x| {
                    x.tasks[2].task.parent = Some(2);
                    x.tasks[2].task.children = vec![2].into();
                }),
            ),
            (
                "task 4 is a child of task 3 and has children of its own",
                Box::new(|x| {
                    x.tasks[2].task.parent = Some(4);
                    x.tasks[4].task.children = vec![2].into();
                }),
            ),
            (
                "task 5 is live but its group's parent, task 3, is finished",
                Box::new(|x| {
                    x.tasks[1].place = Place::History;
                    x.tasks[1].task.status = Status::Succeeded;
                    x.queues[0].ids = vec![1];
                }),
            ),
            (
                "task 5 is a child of task 3, which is not in the file",
                Box::new(|x| {
                    x.tasks.remove(1);
                    x.queues[0].ids = vec![1];
                }),
            ),
        ];
        for (why, change) in cases {
            let mut x = sample();
            change(&mut x);
            let e = x.check().unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
            assert!(encode(&x).is_err(), "{why}: encoded");
        }
    }

    #[test]
    fn the_start_of_a_file_is_checked_alone_and_a_short_header_is_named() {
        let bytes = encode(&sample()).unwrap();
        assert_eq!(check_start(&bytes[..START]), Ok(()));
        assert!(check_start(&bytes[..3]).is_err());
        assert!(matches!(
            check_start(&[0u8; START]),
            Err(FormatError::NotExport(_))
        ));
        let mut n = bytes[..START].to_vec();
        n[20] = 65;
        let e = check_start(&n).unwrap_err().to_string();
        assert!(
            e.contains("its node name claims 65 bytes; at most 64"),
            "{e}"
        );
        // Cut inside the header after the node name: too short for it.
        let e = decode(&bytes[..54]).unwrap_err().to_string();
        assert_eq!(
            e,
            "the file is damaged: 54 bytes is too short for its header and checksum \
             (60 bytes, with its 6-byte node name)"
        );
    }

    #[test]
    fn a_group_count_that_disagrees_is_refused() {
        let mut b = encode(&sample()).unwrap();
        let at = 22 + "edge-1".len() + 8;
        b[at..at + 4].copy_from_slice(&2u32.to_le_bytes());
        reseal(&mut b);
        let e = decode(&b).unwrap_err().to_string();
        assert!(e.contains("1 groups, its header says 2"), "{e}");
    }
}
