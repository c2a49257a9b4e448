//! The whole state as of one event, read without stopping writers (for
//! checkpoints), and the store's log as retention sees it: its records'
//! sizes and times, taking the oldest out once they are archived.
//!
//! A snapshot is a *fuzzy* read repaired by redo: it notes the next event
//! number `s0` (under the write lock, so every commit record that begins
//! before `s0` is whole in the overlay or the tree), scans every state key
//! without any lock while commits go on, then notes the next event number
//! `s1` and re-applies, in order, the key writes of every commit record that
//! begins in `s0 .. s1`. A key that no such record wrote did not change
//! during the scan, so the scan read its value as of `s1 - 1`; a key that one
//! did gets its last written value from the redo. The result is exactly the
//! state after event `s1 - 1`. The write lock is held only to read the two
//! event numbers.

use std::collections::BTreeMap;

use crate::codec;
use crate::store::attempts::AttemptLog;
use crate::store::children;
use crate::store::counters::KindCounts;
use crate::store::db::Store;
use crate::store::error::{CorruptRecord, WriteError};
use crate::store::keys::{self, ATTEMPT, CHILDREN, COUNTER, EVENT, HISTORY, TASK};
use crate::store::records;
use crate::store::stored;
use crate::store::verify::Model;

/// The state after event `model.last_seq`, and the next task id then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub model: Model,
    pub next_id: u64,
    /// When the snapshot's last event (`model.last_seq`) happened (ms since
    /// the epoch), if known: the state holds from then on (a checkpoint
    /// records it, for `replay --at`).
    pub at: Option<u64>,
}

/// One commit record of the store's log, as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRecord {
    /// Its first and last event numbers.
    pub first_seq: u64,
    pub last_seq: u64,
    /// When its last event happened (ms since the epoch).
    pub at: u64,
    /// Its size as stored.
    pub bytes: u64,
}

/// The commit records a cut of the log takes out ([`Store::log_cut`]).
#[derive(Debug)]
pub struct LogCut {
    /// The checkpoint's event: the log starts after it once cut.
    pub upto: u64,
    /// The records' stored bytes, oldest first, as the codec framed them
    /// (what the archive keeps).
    pub records: Vec<Vec<u8>>,
    /// Their keys (a record in pieces has several).
    keys: Vec<sled::IVec>,
}

/// The prefixes of the keys that hold the state (not the log, not meta).
const STATE: [u8; 5] = [TASK, HISTORY, ATTEMPT, COUNTER, CHILDREN];

impl Store {
    /// The state after the last committed event, read while commits go on
    /// (see the module doc), and made durable first: a checkpoint written
    /// from it never holds an event a crash could still take back.
    pub fn snapshot(&self) -> Result<Snapshot, CorruptRecord> {
        let s0 = self.next_seq();
        let mut state: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for prefix in STATE {
            for (k, v) in self.scan_raw(&[prefix]) {
                state.insert(k, v?.to_vec());
            }
        }
        let counted = self
            .get_raw(keys::META_COUNTED)
            .map_err(|e| CorruptRecord::new(keys::META_COUNTED, e))?;
        let (s1, next_id) = {
            let inner = self.lock_inner();
            (inner.next_seq, inner.next_id)
        };
        self.flush().map_err(|e| {
            CorruptRecord::new(&[EVENT], format!("flushing before a snapshot: {e}"))
        })?;
        // Redo: the key writes of the records committed during the scan.
        for item in self.log_view().read(s0, s1.saturating_sub(1)) {
            let l = item.map_err(records::Unread::corrupt)?;
            let rec = l.record()?;
            for w in rec.writes {
                if !w.key.first().is_some_and(|p| STATE.contains(p)) {
                    continue;
                }
                match w.value {
                    Some(v) => state.insert(w.key, v),
                    None => state.remove(&w.key),
                };
            }
        }
        let count_from = match counted {
            Some(v) => {
                codec::decode::<u64>(&v).map_err(|e| CorruptRecord::new(keys::META_COUNTED, e))?
            }
            None => self.counting().since,
        };
        let mut model = model_from_keys(state)?;
        model.last_seq = s1 - 1;
        model.count_from = count_from;
        // The last event's time, while the log still holds it.
        let at = match model.last_seq {
            0 => None,
            last => self
                .events_from(last)
                .next()
                .transpose()?
                .filter(|e| e.seq == last)
                .map(|e| e.at),
        };
        Ok(Snapshot { model, next_id, at })
    }

    /// The commit records of the log, oldest first, with their sizes and
    /// times (each record is decoded to read them).
    pub fn log_records(&self) -> Result<Vec<LogRecord>, CorruptRecord> {
        let mut out = Vec::new();
        for item in self.log_view().read(0, u64::MAX) {
            let l = item.map_err(records::Unread::corrupt)?;
            let rec = l.record()?;
            let (Some(first), Some(last)) = (rec.events.first(), rec.events.last()) else {
                return Err(CorruptRecord::new(
                    &l.key(),
                    "a commit record without events",
                ));
            };
            out.push(LogRecord {
                first_seq: first.seq,
                last_seq: last.seq,
                at: last.at,
                bytes: l.bytes.len() as u64,
            });
        }
        Ok(out)
    }

    /// The stored bytes of the commit records whose events are all at or
    /// before `upto`, oldest first (as the codec framed them: what the
    /// archive keeps).
    pub fn log_bytes_upto(&self, upto: u64) -> Result<Vec<Vec<u8>>, CorruptRecord> {
        let mut out = Vec::new();
        for item in self.log_view().read(0, upto) {
            let l = item.map_err(records::Unread::corrupt)?;
            let rec = l.record()?;
            if rec.events.last().is_some_and(|e| e.seq <= upto) {
                out.push(l.bytes.to_vec());
            }
        }
        Ok(out)
    }

    /// What a cut of the log up to the checkpoint of event `upto` takes
    /// out: every commit record whose events are all at or before `upto`.
    /// None when there is nothing to cut, or when those records do not end
    /// exactly at `upto` (a cut is all or nothing: the log must start right
    /// after a checkpoint). Waits until the applier has written every one
    /// of them to the tree (open re-applies only the records after
    /// `mapplied`). The log's last record is never cut: open takes the next
    /// event and task numbers from it.
    pub fn log_cut(&self, upto: u64) -> Result<Option<LogCut>, WriteError> {
        self.check_writable()?;
        let log = self.log_view();
        let last = log.last_seq().map_err(WriteError::Database)?;
        let mut cut = LogCut {
            upto,
            records: Vec::new(),
            keys: Vec::new(),
        };
        let (mut end, mut last_record) = (0, 0);
        for item in log.read(0, upto) {
            let l = item.map_err(|e| match e {
                records::Unread::Db(e) => WriteError::Database(e),
                other => WriteError::Corrupt(other.corrupt()),
            })?;
            if Some(l.seq) == last {
                break;
            }
            let rec = l.record().map_err(WriteError::Corrupt)?;
            let Some(seq) = rec.events.last().map(|e| e.seq).filter(|s| *s <= upto) else {
                break;
            };
            (end, last_record) = (seq, l.seq);
            cut.records.push(l.bytes.to_vec());
            cut.keys.extend(l.keys);
        }
        if cut.records.is_empty() {
            return Ok(None);
        }
        if end != upto {
            log::warn!(
                "the log is not cut at event {upto}: its records to cut end at event {end}, not at the checkpoint"
            );
            return Ok(None);
        }
        if !self.overlay.wait_marked(last_record) {
            self.check_writable()?;
            return Ok(None);
        }
        Ok(Some(cut))
    }

    /// `mapplied`: the last commit record whose key writes the tree holds
    /// (every one before it too). Open re-applies the records after it.
    pub fn applied_mark(&self) -> Result<u64, CorruptRecord> {
        self.meta_u64(keys::META_APPLIED, 0)
    }

    /// A number kept under a meta key of the tree (`absent` when missing).
    fn meta_u64(&self, key: &[u8], absent: u64) -> Result<u64, CorruptRecord> {
        match self.trees.main.get(key) {
            Err(e) => Err(CorruptRecord::new(key, e)),
            Ok(None) => Ok(absent),
            Ok(Some(v)) => codec::decode::<u64>(&v).map_err(|e| CorruptRecord::new(key, e)),
        }
    }

    /// Takes `cut`'s records out of the log, in one atomic sled batch that
    /// also records the new log start (`cut.upto + 1`), and makes it
    /// durable. The caller has made the records and the state at
    /// `cut.upto` durable elsewhere first (archive and checkpoint). Returns
    /// how many records went.
    pub fn cut_log(&self, cut: LogCut) -> Result<usize, WriteError> {
        self.check_writable()?;
        let mut batch = sled::Batch::default();
        for k in cut.keys {
            batch.remove(k);
        }
        batch.insert(keys::META_LOG_START, codec::encode(&(cut.upto + 1)));
        let written = {
            let _writing = self.trees.writing();
            self.trees.main.apply_batch(batch)
        };
        if let Err(e) = written {
            self.failed.fail(&self.trees.main, &e);
            return Err(WriteError::Database(e));
        }
        self.flush_sled().map_err(WriteError::Flush)?;
        Ok(cut.records.len())
    }

    /// The first event the store's log holds (1 until the log was cut).
    pub fn log_start(&self) -> Result<u64, CorruptRecord> {
        self.meta_u64(keys::META_LOG_START, 1)
    }
}

/// The model of a set of state keys (see [`keys`]).
fn model_from_keys(state: BTreeMap<Vec<u8>, Vec<u8>>) -> Result<Model, CorruptRecord> {
    let mut m = Model::default();
    // (queue, position, id) of every queued task.
    let mut positions = Vec::new();
    for (k, v) in &state {
        let corrupt = |e: codec::CodecError| CorruptRecord::new(k, e);
        match k.first() {
            Some(&TASK) | Some(&HISTORY) => {
                let mut t = stored::decode(k[0], v).map_err(corrupt)?;
                children::join(&mut t, |g| Ok(state.get(g).cloned()))
                    .map_err(|e| CorruptRecord::new(k, e))?;
                if k[0] == TASK {
                    stored::check_summary(v, &t).map_err(|e| CorruptRecord::new(k, e))?;
                    if let Some((queue, pos)) = stored::position(v).map_err(corrupt)? {
                        positions.push((queue, pos, t.id));
                    }
                    m.live.insert(t.id, t);
                } else {
                    m.history.insert(t.id, t);
                }
            }
            Some(&ATTEMPT) => {
                let at = keys::parse_attempt_key(k)
                    .ok_or_else(|| CorruptRecord::new(k, "not an attempt key"))?;
                let log: AttemptLog = codec::decode(v).map_err(corrupt)?;
                m.attempts.insert(at, log);
            }
            Some(&COUNTER) => {
                let kind = String::from_utf8_lossy(&k[1..]).into_owned();
                let c: KindCounts = codec::decode(v).map_err(corrupt)?;
                m.counts.insert(kind, c);
            }
            _ => {}
        }
    }
    positions.sort_unstable();
    for (queue, _, id) in positions {
        m.queues.entry(queue).or_default().push_back(id);
    }
    Ok(m)
}
