//! Checkpoints: the whole state (live tasks, history, queue order, attempt
//! logs, counters, next task id) as of one event, in a file under
//! `DIR/checkpoints/`. The store's log can only be cut after a checkpoint:
//! `verify` and replay start from the checkpoint at the log's start, and
//! replay of the archive from the newest checkpoint at or before where it
//! begins.
//!
//! A checkpoint file, `ckpt-<event, 20 digits>.bck`, has the archive
//! segment's layout (`archive.rs`: header, one zstd frame of length-
//! prefixed codec records, CRC-32) with the magic `BERTHCKP`; both event
//! numbers in its header are the checkpoint's event. Its records are
//! `Entry`s: first a `Head`, then (format version 2) an `At`, the time of
//! the checkpoint's event when it is known, then every live task, every
//! finished task, each queue's ids in order (in chunks), every attempt log
//! and every kind's counters. Version 1 (written before `At`) is still
//! read; a build that reads only version 1 refuses version 2, naming it. The state comes from
//! [`Store::snapshot`](crate::store::Store::snapshot), which holds
//! no lock while it reads (see `store/snapshot.rs`).

use std::io;
use std::path::{Path, PathBuf};

use bincode::{Decode, Encode};

use crate::archive::{self, ArchiveError};
use crate::codec;
use crate::store::counters::KindCounts;
use crate::store::verify::Model;
use crate::store::{AttemptLog, Snapshot};
use crate::task::Task;

/// The folder of a data dir's checkpoints.
pub const DIR: &str = "checkpoints";
const MAGIC: &[u8; 8] = b"BERTHCKP";
/// The format version of the checkpoints this build writes, the newest it
/// reads: 2 (an `At` entry may follow the head).
pub(crate) const VERSION: u16 = 2;
/// Queue ids per `Queue` entry.
const QUEUE_CHUNK: usize = 8192;

/// One record of a checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
#[bincode(decode_context = "crate::codec::Layout")]
enum Entry {
    Head {
        last_seq: u64,
        next_id: u64,
        count_from: u64,
    },
    Live(Task),
    History(Task),
    /// The next ids of a queue, in order.
    Queue {
        name: String,
        ids: Vec<u64>,
    },
    Attempt {
        id: u64,
        attempt: u32,
        log: AttemptLog,
    },
    Counts {
        kind: String,
        counts: KindCounts,
    },
    /// Version 2: the time of the checkpoint's event (ms since the epoch),
    /// right after the head, when the writer knew it.
    At {
        ms: u64,
    },
}

/// The checkpoint file name for event `seq`.
pub fn file_name(seq: u64) -> String {
    format!("ckpt-{seq:020}.bck")
}

/// The checkpoints folder of a data dir.
pub fn dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join(DIR)
}

/// Writes `snap` as a checkpoint of `data_dir`, durably; its path.
pub fn write(data_dir: &Path, snap: &Snapshot) -> io::Result<PathBuf> {
    let m = &snap.model;
    let mut records = vec![codec::encode(&Entry::Head {
        last_seq: m.last_seq,
        next_id: snap.next_id,
        count_from: m.count_from,
    })];
    if let Some(ms) = snap.at {
        records.push(codec::encode(&Entry::At { ms }));
    }
    records.extend(
        m.live
            .values()
            .map(|t| codec::encode(&Entry::Live(t.clone()))),
    );
    records.extend(
        m.history
            .values()
            .map(|t| codec::encode(&Entry::History(t.clone()))),
    );
    for (name, ids) in &m.queues {
        let ids: Vec<u64> = ids.iter().copied().collect();
        for chunk in ids.chunks(QUEUE_CHUNK) {
            records.push(codec::encode(&Entry::Queue {
                name: name.clone(),
                ids: chunk.to_vec(),
            }));
        }
    }
    for ((id, attempt), log) in &m.attempts {
        records.push(codec::encode(&Entry::Attempt {
            id: *id,
            attempt: *attempt,
            log: log.clone(),
        }));
    }
    for (kind, counts) in &m.counts {
        records.push(codec::encode(&Entry::Counts {
            kind: kind.clone(),
            counts: counts.clone(),
        }));
    }
    archive::write_file(
        &dir_of(data_dir),
        &file_name(m.last_seq),
        MAGIC,
        m.last_seq,
        m.last_seq,
        &records,
    )
}

/// Reads and checks one checkpoint file.
pub fn read(path: &Path) -> Result<Snapshot, ArchiveError> {
    let bytes = std::fs::read(path).map_err(|source| ArchiveError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    from_bytes(path, &bytes)
}

/// Reads and checks a checkpoint from bytes already read (`path` names
/// them in errors).
pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Snapshot, ArchiveError> {
    let (info, raw) = archive::decode_file(path, MAGIC, bytes)?;
    let slices = archive::split_records(path, MAGIC, &raw, info.records)?;
    let bad = |index: usize, why: String| ArchiveError::Record {
        path: path.to_path_buf(),
        index,
        why,
    };
    let mut model = Model::default();
    let mut next_id = None;
    let mut at = None;
    for (index, r) in slices.iter().enumerate() {
        let entry: Entry = codec::decode(r).map_err(|e| bad(index, e.to_string()))?;
        match entry {
            Entry::Head {
                last_seq,
                next_id: n,
                count_from,
            } if index == 0 => {
                if last_seq != info.last_seq {
                    return Err(bad(
                        index,
                        format!(
                            "it is the state after event {last_seq}, the header says {}",
                            info.last_seq
                        ),
                    ));
                }
                model.last_seq = last_seq;
                model.count_from = count_from;
                next_id = Some(n);
            }
            Entry::Head { .. } => return Err(bad(index, "a second head".into())),
            _ if index == 0 => return Err(bad(index, "no head first".into())),
            Entry::Live(t) => {
                model.live.insert(t.id, t);
            }
            Entry::History(t) => {
                model.history.insert(t.id, t);
            }
            Entry::Queue { name, ids } => model.queues.entry(name).or_default().extend(ids),
            Entry::Attempt { id, attempt, log } => {
                model.attempts.insert((id, attempt), log);
            }
            Entry::Counts { kind, counts } => {
                model.counts.insert(kind, counts);
            }
            Entry::At { ms } if index == 1 && info.version >= 2 => at = Some(ms),
            Entry::At { .. } => {
                return Err(bad(
                    index,
                    "a time that is not right after the head of a version-2 checkpoint".into(),
                ));
            }
        }
    }
    let next_id = next_id.ok_or_else(|| bad(0, "no head".into()))?;
    Ok(Snapshot { model, next_id, at })
}

/// The checkpoints of a data dir, oldest first, by the event each is of
/// (from their names; files of other names are ignored).
pub fn list(data_dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir_of(data_dir)) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let path = e?.path();
        let seq = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("ckpt-"))
            .and_then(|n| n.strip_suffix(".bck"))
            .filter(|n| n.len() == 20)
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(seq) = seq {
            out.push((seq, path));
        }
    }
    out.sort();
    Ok(out)
}

/// The checkpoint of event `seq`, if there is one.
pub fn path_of(data_dir: &Path, seq: u64) -> Option<PathBuf> {
    let p = dir_of(data_dir).join(file_name(seq));
    p.exists().then_some(p)
}

/// The newest checkpoint at or before event `seq`, if any.
pub fn newest_at_or_before(data_dir: &Path, seq: u64) -> io::Result<Option<(u64, PathBuf)>> {
    Ok(list(data_dir)?.into_iter().rev().find(|(s, _)| *s <= seq))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Blob;
    use crate::task::Status;

    fn task(id: u64, status: Status) -> Task {
        Task {
            id,
            kind: "K".into(),
            queue: "main".into(),
            name: format!("t{id}"),
            description: None,
            weight: None,
            payload: Blob::from_json(
                "payload",
                &serde_json::json!({"n": id}),
                &Default::default(),
            )
            .expect("a payload"),
            tags: Vec::new(),
            target: None,
            compaction_key: None,
            failures: 0,
            attempts: 0,
            last_failure: None,
            status,
            queued_at: 1,
            started_at: None,
            finished_at: None,
            retry_at: None,
            parent: None,
            children: Default::default(),
            result: None,
            ttl_ms: Some(60_000),
        }
    }

    fn snapshot() -> Snapshot {
        let mut m = Model {
            last_seq: 42,
            count_from: 1,
            ..Model::default()
        };
        for id in 1..=20_000u64 {
            m.live.insert(id, task(id, Status::Queued));
        }
        m.history.insert(30_000, task(30_000, Status::Succeeded));
        m.queues.insert("main".into(), (1..=20_000).collect());
        m.counts.insert("K".into(), KindCounts::default());
        Snapshot {
            model: m,
            next_id: 30_001,
            at: Some(1_800_000_000_123),
        }
    }

    /// `bytes` of a checkpoint file with its version set to `version`, its
    /// checksum made right again.
    fn as_version(bytes: &[u8], version: u16) -> Vec<u8> {
        let mut out = bytes[..bytes.len() - 4].to_vec();
        out[8..10].copy_from_slice(&version.to_le_bytes());
        crate::frame::seal(&mut out);
        out
    }

    /// A version-1 checkpoint (no time: what builds before version 2 wrote)
    /// still reads; a time in one is refused, and so is a version this
    /// build does not know, naming the versions it reads.
    #[test]
    fn a_version_1_checkpoint_reads_without_its_time() {
        let dir = tempfile::tempdir().unwrap();
        let untimed = Snapshot {
            at: None,
            ..snapshot()
        };
        let path = write(dir.path(), &untimed).unwrap();
        let v2 = std::fs::read(&path).unwrap();
        assert_eq!(u16::from_le_bytes([v2[8], v2[9]]), VERSION);
        std::fs::write(&path, as_version(&v2, 1)).unwrap();
        assert_eq!(read(&path).unwrap(), untimed);

        let timed = write(dir.path(), &snapshot()).unwrap();
        let v2 = std::fs::read(&timed).unwrap();
        std::fs::write(&timed, as_version(&v2, 1)).unwrap();
        let e = read(&timed).unwrap_err().to_string();
        assert!(
            e.contains("record 1 is corrupt: a time that is not right after the head"),
            "{e}"
        );
        std::fs::write(&timed, as_version(&v2, 3)).unwrap();
        let e = read(&timed).unwrap_err().to_string();
        assert!(
            e.ends_with(
                ": a berth checkpoint of format version 3; this build reads versions 1 to 2"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_checkpoint_reads_back_whole_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let snap = snapshot();
        let path = write(dir.path(), &snap).unwrap();
        assert_eq!(path, dir.path().join(DIR).join(file_name(42)));
        assert_eq!(read(&path).unwrap(), snap);
        assert_eq!(list(dir.path()).unwrap(), vec![(42, path.clone())]);
        assert_eq!(newest_at_or_before(dir.path(), 41).unwrap(), None);
        assert_eq!(
            newest_at_or_before(dir.path(), 100).unwrap(),
            Some((42, path.clone()))
        );
        let good = std::fs::read(&path).unwrap();
        for at in [0, 9, 13, 30, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            let e = read(&path).expect_err(&format!("a flip at {at} was read"));
            // The magic, the version, or the rest: each says what it is.
            let says = match at {
                0 => ": not a berth checkpoint (no BERTHCKP magic)",
                9 => ": a berth checkpoint of format version",
                _ => ": a damaged berth checkpoint (",
            };
            assert!(e.to_string().contains(says), "{at}: {e}");
        }
        std::fs::write(&path, &good[..good.len() - 7]).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("ckpt-"), "{e}");
        assert!(e.contains(": a damaged berth checkpoint ("), "{e}");
        std::fs::write(&path, &good[..20]).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(
            e.ends_with(": a damaged berth checkpoint (20 bytes is too short)"),
            "{e}"
        );
        std::fs::write(&path, b"").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(
            e.ends_with(": not a berth checkpoint (0 bytes is too short)"),
            "{e}"
        );
    }
}
