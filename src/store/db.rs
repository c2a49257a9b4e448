//! The store: what an open data dir holds, and every read. Opening is in
//! `open`, writing goes through [`WriteTxn`](super::WriteTxn).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::budget::Budget;
use crate::clock::SharedClock;
use crate::codec;
use crate::store::attempts::AttemptLog;
use crate::store::children;
use crate::store::counters::Counting;
use crate::store::deadlines::Deadlines;
use crate::store::durability::{Durability, GroupCommit};
use crate::store::error::WriteError;
use crate::store::error::{CorruptRecord, ReadError};
use crate::store::event::{Event, KeyWrite};
use crate::store::files::DbFiles;
use crate::store::health::{self, Failed, SpaceError};
use crate::store::keys::{self, EVENT, HISTORY, TASK};
use crate::store::lock::{DirLock, Role};
use crate::store::order::Order;
use crate::store::overlay::{Overlay, Trees};
use crate::store::records;
use crate::store::stored;
use crate::store::wal::Wal;
use crate::store::write::WriteTxn;
use crate::task::Task;

/// An attempt log with the task id and attempt number its key names.
pub type LoggedAttempt = ((u64, u32), AttemptLog);

/// How to open a data dir.
#[derive(Debug, Clone)]
pub struct Options {
    pub durability: Durability,
    pub budget: Budget,
    /// Who is opening: a daemon never waits for the lock; a command does.
    pub role: Role,
    /// How long to wait while another short command holds the data dir.
    pub wait_for_lock: Duration,
    /// Create the data dir if it does not exist.
    pub create: bool,
    /// sled's page cache size. sled holds several times this much in
    /// practice: opening 1,000,000 queued tasks peaked at 435 MiB with 64
    /// MiB and 294 MiB with the default 16 MiB (`VmHWM`), no slower (and
    /// the engine's throughput was the same).
    pub cache_bytes: u64,
    /// `fdatasync` the write-ahead log at every flush and fsync sled's
    /// files after each of sled's flushes (see `wal` and `files`), so that
    /// what `sync` acknowledges survives a power cut. `false` only writes
    /// the log, which survives a process crash or `kill -9` but not a power
    /// cut; it exists to measure what power safety costs.
    pub power_safe: bool,
    /// Make commits durable with berth's write-ahead log (`db/wal`, see
    /// `wal`) instead of a sled flush per commit. On by default (a daemon
    /// and the other commands turn it off when their config's
    /// `write_ahead_log` is false): a flush is one `pwrite` and one
    /// `fdatasync` of the log, against sled's write of every page the
    /// commits changed, its `sync_file_range` and berth's `fdatasync` of
    /// `db/db`; sled's own files are flushed and synced in the background
    /// (`sled_flush_every`). On 2026-12-06, `e2e_noop_sync` ran 8-37 %
    /// faster with it, 15 % in the middle (flushes 121-162 µs against
    /// 187-273), in seven pairs.
    /// Off, every commit waits for a sled flush (ARCHITECTURE.md, "The
    /// write-ahead log", says what each path has shown in LazyFS power cuts).
    pub write_ahead_log: bool,
    /// With `write_ahead_log`: how long after a commit sled itself is flushed at the latest (in
    /// the background; also after 32 MiB of commits), so that the
    /// write-ahead log's segments can be deleted (see `wal`). Longer means
    /// more log to read back after a crash.
    pub sled_flush_every: Duration,
    /// Open only to read: the data dir must be a berth data dir, nothing in
    /// it is created or changed (sled opens a private copy of `db/`), tasks
    /// found running are not recovered, and every commit is refused.
    pub read_only: bool,
    /// Disk space kept free on the data dir's filesystem: new work is
    /// refused while less than this plus what it needs is free, and the
    /// engine starts no task while less than this is free (see `health`).
    /// 0 turns the guard off.
    pub disk_reserve: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            budget: Budget::default(),
            role: Role::Command,
            wait_for_lock: Duration::from_secs(5),
            create: true,
            cache_bytes: 16 << 20,
            power_safe: true,
            write_ahead_log: true,
            sled_flush_every: crate::store::wal::CHECKPOINT_EVERY,
            read_only: false,
            disk_reserve: health::DEFAULT_RESERVE,
        }
    }
}

pub(crate) struct Inner {
    pub order: Order,
    pub next_id: u64,
    pub next_seq: u64,
    /// Every kind's counters as of the last commit (see `counters`).
    pub counting: Counting,
    /// The TTL deadlines of the live tasks: built by a writable open's
    /// pass over them (`recover`), or when asked (`track_deadlines`); kept
    /// up to date by every commit.
    pub deadlines: Option<Deadlines>,
    /// The progress views of live groups (see `write/group_views.rs`).
    pub groups: std::collections::HashMap<u64, crate::groups::GroupView>,
    /// The children lists of live group parents that transactions read
    /// (stored apart, see `children`): a list never changes, so a parent
    /// read at every step of its group decodes it once.
    pub children: std::collections::HashMap<u64, std::sync::Arc<[u64]>>,
    /// Decoded records of the live tasks read again soon (see `warm`).
    pub warm: super::warm::Warm,
}

pub struct Store {
    pub(super) trees: super::overlay::Trees,
    pub(super) dir: PathBuf,
    pub(super) inner: Mutex<Inner>,
    pub(super) commit: Arc<GroupCommit>,
    pub(super) clock: SharedClock,
    pub(super) budget: Budget,
    pub(super) durability: Durability,
    pub(super) reserve: u64,
    /// The data dir's file system, asked for the space left.
    pub(super) space: health::Space,
    /// Committed key writes not yet applied to the tree; every read looks here first.
    pub(super) overlay: Arc<Overlay>,
    /// sled's files, synced after every flush.
    pub(super) files: Arc<DbFiles>,
    pub(super) applier: Option<JoinHandle<()>>,
    pub(super) corrupt: Vec<CorruptRecord>,
    pub(super) recovered: Vec<u64>,
    /// Set for good by the first failed sled write or flush.
    pub(super) failed: Arc<Failed>,
    pub(super) flusher: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    /// Where commits are made durable (`None` when opened to read).
    pub(super) wal: Option<Arc<Wal>>,
    /// Flushes sled in the background so that the log's segments can go.
    pub(super) sled_flusher: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    /// Opened to read: commits are refused, nothing in the data dir changes.
    pub(super) read_only: bool,
    /// The data dir's high-water mark as last read or written (see
    /// `high_mark`).
    pub(super) high_mark: Mutex<Option<super::high_mark::Mark>>,
    /// Whether this store writes high-water marks: it writes, and its
    /// flushes are power-safe.
    pub(super) marks: bool,
    /// What to take away when the store closes ([`Store::discard_on_close`]).
    pub(super) discard: Mutex<Option<Discard>>,
    /// `None` for a read-only open of a copy without a lock file.
    pub(super) _lock: Option<DirLock>,
    /// To read, sled works on this private copy of `db/`; it goes last, so
    /// that it is removed after sled closed it.
    pub(super) read_copy: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).finish()
    }
}

impl Store {
    /// Starts a write transaction. It holds the store's write lock until
    /// committed or dropped (dropping discards it).
    pub fn write(&self) -> WriteTxn<'_> {
        WriteTxn::new(self, self.lock_inner())
    }

    /// Reads the task right behind each of `running` in its queue into the
    /// warm records (see `warm`): the engine's next step starts it, and
    /// calls this while the step before is flushed, and at every turn of
    /// its loop. A record that cannot be read is left to the step, which
    /// reports it.
    pub fn warm_next(&self, running: impl IntoIterator<Item = u64>) {
        let mut inner = self.lock_inner();
        for id in running {
            let Some(next) = inner.order.next_after(id) else {
                continue;
            };
            if inner.warm.contains(next) {
                continue;
            }
            // Looked at once until it is written: a large record is passed
            // over unread, and one that cannot be read is left to the step.
            match self.get_raw(&keys::id_key(TASK, next)) {
                Ok(Some(v)) if v.len() <= super::warm::MAX_RECORD_BYTES => {
                    match stored::decode(TASK, &v) {
                        Ok(task) if !children::is_apart(&task) => inner.warm.keep(&task),
                        _ => inner.warm.pass(next),
                    }
                }
                _ => inner.warm.pass(next),
            }
        }
    }

    /// Stops every later write, for a process about to exit at once: takes
    /// the write lock (which every transaction holds from its start to its
    /// publish) and never gives it back. A daemon's second signal calls it
    /// before it kills the running handlers, so that no attempt ended by
    /// that kill is recorded as if its handler had failed: the next start
    /// finds those tasks `running`, as after a crash. A transaction open
    /// now finishes first; if one is still open after `patience` (a write
    /// stuck in sled), it gives up and returns false.
    pub fn freeze(&self, patience: Duration) -> bool {
        let end = std::time::Instant::now() + patience;
        loop {
            match self.inner.try_lock() {
                Ok(guard) => {
                    std::mem::forget(guard);
                    return true;
                }
                Err(TryLockError::Poisoned(p)) => {
                    std::mem::forget(p.into_inner());
                    return true;
                }
                Err(TryLockError::WouldBlock) => {
                    if std::time::Instant::now() >= end {
                        return false;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    pub(crate) fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many parallel queues the last daemon on this data dir ran (the
    /// daemon's default if none said).
    pub fn parallel_queues(&self) -> Result<usize, ReadError> {
        Ok(self
            .recorded_parallel_queues()?
            .unwrap_or(crate::queues::DEFAULT_PARALLEL_QUEUES))
    }

    /// The parallel queue count a daemon recorded, if one has run here.
    pub fn recorded_parallel_queues(&self) -> Result<Option<usize>, ReadError> {
        match self.get_raw(keys::META_PARALLEL)? {
            None => Ok(None),
            Some(v) => codec::decode::<u64>(&v)
                .map(|n| Some(n as usize))
                .map_err(|e| ReadError::Corrupt(CorruptRecord::new(keys::META_PARALLEL, e))),
        }
    }

    /// Records how many parallel queues this daemon runs (made durable now).
    pub fn set_parallel_queues(&self, n: usize) -> Result<(), crate::store::WriteError> {
        if self.parallel_queues().ok() == Some(n) {
            return Ok(());
        }
        if let Some(why) = self.failure() {
            return Err(crate::store::WriteError::Failed(why));
        }
        let written = {
            let _writing = self.trees.writing();
            self.trees
                .main
                .insert(keys::META_PARALLEL, codec::encode(&(n as u64)))
        };
        if let Err(e) = written {
            self.failed.fail(&self.trees.main, &e);
            return Err(e.into());
        }
        self.flush_sled().map_err(crate::store::WriteError::Flush)
    }

    /// Why the store stopped writing, if it did (see `health`). It then
    /// refuses every commit until the data dir is opened again.
    pub fn failure(&self) -> Option<String> {
        self.failed.reason()
    }

    /// Marks the store failed after a sled error that reached a caller by
    /// another way than the store's own write paths (which mark it
    /// themselves): a sled that returned an error may never make progress
    /// again (see `health`), so the store stops writing and is not flushed
    /// when it closes.
    pub(crate) fn sled_failed(&self, e: &sled::Error) {
        self.failed.fail(&self.trees.main, e);
    }

    /// Refuses a write to a failed or read-only store.
    pub(crate) fn check_writable(&self) -> Result<(), crate::store::WriteError> {
        use crate::store::WriteError;
        if let Some(reason) = self.failed.reason() {
            return Err(WriteError::Failed(reason));
        }
        if self.read_only {
            return Err(WriteError::ReadOnly);
        }
        Ok(())
    }

    /// Bytes free on the data dir's filesystem (`None`: it does not say).
    pub fn free_space(&self) -> std::io::Result<Option<u64>> {
        self.space.free_bytes()
    }

    /// The disk space kept free (0: no guard).
    pub fn disk_reserve(&self) -> u64 {
        self.reserve
    }

    /// Whether less than the reserve is free: the engine then starts no
    /// task, so that the tasks running can still record how they ended.
    pub fn below_reserve(&self) -> Option<SpaceError> {
        self.space.check(self.reserve, 0).err()
    }

    /// A transaction has begun (so a flush leader may wait for it).
    /// Whether the store was opened only to read.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub(crate) fn txn_begun(&self) {
        self.commit.begin();
    }

    /// A begun transaction was dropped without writing.
    pub(crate) fn txn_dropped(&self) {
        self.commit.abandon();
    }

    /// The group-commit rendezvous, to announce transactions that will begin
    /// soon (`GroupCommit::coming`) from threads that hold no transaction.
    pub fn group_commit(&self) -> Arc<GroupCommit> {
        self.commit.clone()
    }

    /// Checks the space for a commit of new work whose record is `bytes` long.
    pub(crate) fn check_space(&self, bytes: usize) -> Result<(), SpaceError> {
        self.space
            .check(self.reserve, health::need_for_record(bytes))
    }

    /// The acknowledged path of a commit, under the write lock: inserts its
    /// record under `e` + its first event number (the only sled write a
    /// commit waits for), puts its key writes in the overlay (readers see
    /// them from now on; the applier writes them to the tree later), and
    /// returns its group-commit ticket.
    pub(crate) fn append(
        &self,
        first_seq: u64,
        next_seq: u64,
        record: Vec<u8>,
        writes: Vec<KeyWrite>,
    ) -> Result<u64, WriteError> {
        self.overlay.wait_for_room();
        let writes = writes.into_iter().map(|w| (w.key, w.value));
        match &self.wal {
            // The log makes the commit durable; the record goes to the
            // tree with its key writes, in the applier's next round (a
            // checkpoint releases only the frames of applied records).
            Some(wal) => {
                wal.append(first_seq, next_seq, &record);
                let log = records::pieces(first_seq, &record)
                    .into_iter()
                    .map(|(k, v)| (k, Some(v.to_vec())));
                self.overlay.put(first_seq, log.chain(writes));
            }
            // sled's flush makes it durable: the record goes to the tree now.
            None => {
                let written = {
                    let _writing = self.trees.writing();
                    records::writes(first_seq, &record).apply(&self.trees.main)
                };
                if let Err(e) = written {
                    self.failed.fail(&self.trees.main, &e);
                    return Err(WriteError::Database(e));
                }
                self.overlay.put(first_seq, writes);
            }
        }
        Ok(self.commit.published())
    }

    /// Waits until the commit with `ticket` is durable, as the mode says
    /// (after the write lock is released, so that commits share flushes).
    pub(crate) fn wait_durable(&self, ticket: u64) -> Result<(), WriteError> {
        if self.durability == Durability::Sync {
            self.commit
                .wait_durable(ticket, || self.flush_now())
                .map_err(WriteError::Flush)?;
        }
        Ok(())
    }

    /// Makes every commit appended so far durable: writes the write-ahead
    /// log's pending frames and syncs them (see `wal`).
    pub(crate) fn flush_now(&self) -> std::io::Result<()> {
        match &self.wal {
            Some(wal) => flush_wal(wal, &self.trees.main, &self.failed),
            // Read-only: nothing is written.
            None if self.read_only => Ok(()),
            None => self.flush_sled(),
        }
    }

    /// Flushes sled and syncs its files, then deletes the write-ahead
    /// segments that flush made needless: for writes made to sled directly
    /// (meta keys, the log's cut), at a close, and in the background.
    pub(crate) fn flush_sled(&self) -> std::io::Result<()> {
        match &self.wal {
            Some(wal) => {
                checkpoint_sled(wal, &self.overlay, &self.trees, &self.files, &self.failed)
            }
            None if self.read_only => Ok(()),
            // Per commit: commits go on beside it (holding writers back here
            // made eight producers no faster than one).
            None => flush_durable(&self.trees.main, &self.files, &self.failed),
        }
    }

    /// Flushes everything written so far to disk.
    /// A commit in progress holds the write lock until it has its ticket,
    /// so taking the lock first covers every write a reader may have seen.
    pub fn flush(&self) -> std::io::Result<()> {
        let ticket = {
            let _writes = self.lock_inner();
            self.commit.written()
        };
        self.commit.wait_durable(ticket, || self.flush_now())
    }

    /// In `sync` mode, makes every commit a reader may have seen so far
    /// durable (see [`Store::flush`]): a daemon calls it before it answers
    /// a read, so that nothing it shows (a task finished, an event logged)
    /// can be undone by a crash or a power cut after the answer. The engine
    /// publishes a step before its flush (pipelining), so without it a read
    /// could show a step's outcome about one flush before it was on disk.
    /// Costs nothing when every commit is durable already, else it joins the
    /// flush under way. In `batched` mode it does nothing: there, reads and
    /// acknowledgements alike may show what the last interval may lose.
    pub fn flush_seen(&self) -> std::io::Result<()> {
        match self.durability {
            Durability::Sync => self.flush(),
            Durability::Batched { .. } => Ok(()),
        }
    }

    /// Writes the data dir's high-water mark (see `high_mark`) for every
    /// commit made so far, once they are durable; nothing when the mark
    /// would not change, or the store writes none (opened to read, or not
    /// power-safe), or has failed. Returns whether it wrote. A daemon calls
    /// it every few seconds; a close writes it too.
    pub fn save_high_mark(&self) -> std::io::Result<bool> {
        self.write_high_mark(true)
    }

    /// [`Store::save_high_mark`]; without `wait` the caller has flushed
    /// everything (a close).
    fn write_high_mark(&self, wait: bool) -> std::io::Result<bool> {
        if !self.marks || self.failed.is_failed() {
            return Ok(false);
        }
        let (now, ticket) = {
            let inner = self.lock_inner();
            let now = super::high_mark::Mark {
                next_event: inner.next_seq,
                next_id: inner.next_id,
            };
            (now, self.commit.written())
        };
        let mut last = self.high_mark.lock().unwrap_or_else(|p| p.into_inner());
        if *last == Some(now) {
            return Ok(false);
        }
        if wait {
            self.commit.wait_durable(ticket, || self.flush_now())?;
        }
        super::high_mark::write(&self.dir, &now)?;
        *last = Some(now);
        Ok(true)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn budget(&self) -> &Budget {
        &self.budget
    }
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }
    pub fn durability(&self) -> Durability {
        self.durability
    }
    /// Records found corrupt when the data dir was opened.
    pub fn corrupt_records(&self) -> &[CorruptRecord] {
        &self.corrupt
    }
    /// Tasks that recovery put back to wait at open.
    pub fn recovered(&self) -> &[u64] {
        &self.recovered
    }
    /// Every kind's counters and where counting began (see `counters`).
    pub fn counting(&self) -> Counting {
        self.lock_inner().counting.clone()
    }
    /// Flushes done so far (group commit makes this far fewer than commits).
    pub fn flush_count(&self) -> u64 {
        self.commit.flushes()
    }

    /// How long the flushes of this process took.
    pub fn flush_stats(&self) -> crate::store::durability::FlushStats {
        self.commit.flush_stats()
    }

    /// The current value of a key: a pending write if there is one, else the tree's.
    pub(crate) fn get_raw(&self, key: &[u8]) -> Result<Option<sled::IVec>, sled::Error> {
        match self.overlay.get(key) {
            Some(v) => Ok(v),
            None => self.trees.for_key(key).get(key),
        }
    }

    fn read_record<T: crate::codec::Record>(&self, key: &[u8]) -> Result<Option<T>, ReadError> {
        match self.get_raw(key)? {
            None => Ok(None),
            Some(v) => codec::decode(&v)
                .map(Some)
                .map_err(|e| ReadError::Corrupt(CorruptRecord::new(key, e))),
        }
    }

    /// A live task (queued or running, or a group child waiting for its parent).
    pub fn live_task(&self, id: u64) -> Result<Option<Task>, ReadError> {
        self.read_task(&keys::id_key(TASK, id))
    }

    /// A task from the history.
    pub fn history_task(&self, id: u64) -> Result<Option<Task>, ReadError> {
        self.read_task(&keys::id_key(HISTORY, id))
    }

    fn read_task(&self, key: &[u8]) -> Result<Option<Task>, ReadError> {
        match self.get_raw(key)? {
            None => Ok(None),
            Some(v) => self
                .task_from(key, &v)
                .map(Some)
                .map_err(ReadError::Corrupt),
        }
    }

    /// A task from its stored bytes, its children list joined (`children`).
    fn task_from(&self, key: &[u8], v: &[u8]) -> Result<Task, CorruptRecord> {
        let prefix = key.first().copied().unwrap_or_default();
        let mut t = stored::decode(prefix, v).map_err(|e| CorruptRecord::new(key, e))?;
        self.join_children(&mut t)
            .map_err(|e| CorruptRecord::new(key, e))?;
        // The open trusted the summary (running, deadline): a read, and so
        // `verify`, reports one that is not the record's.
        if prefix == TASK {
            stored::check_summary(v, &t).map_err(|e| CorruptRecord::new(key, e))?;
        }
        Ok(t)
    }

    /// Puts a stored parent's children list back from its `g` key (as
    /// `children::join`); whether it was there.
    pub(crate) fn join_children(&self, t: &mut Task) -> Result<bool, String> {
        children::join(t, |k| {
            self.get_raw(k)
                .map(|v| v.map(|v| v.to_vec()))
                .map_err(|e| e.to_string())
        })
    }

    /// A task, live or from the history.
    pub fn task(&self, id: u64) -> Result<Option<Task>, ReadError> {
        match self.live_task(id)? {
            Some(t) => Ok(Some(t)),
            None => self.history_task(id),
        }
    }

    /// Every live task, by id, corrupt ones as errors.
    pub fn live_tasks(&self) -> Vec<Result<Task, CorruptRecord>> {
        self.scan_tasks(TASK)
    }

    /// Every finished task in the history, by id.
    pub fn history(&self) -> Vec<Result<Task, CorruptRecord>> {
        self.scan_tasks(HISTORY)
    }

    fn scan_tasks(&self, prefix: u8) -> Vec<Result<Task, CorruptRecord>> {
        self.scan_raw(&[prefix])
            .into_iter()
            .map(|(k, v)| v.and_then(|v| self.task_from(&k, &v)))
            .collect()
    }

    /// Every record whose key starts with `prefix`, with its key, in key
    /// order; corrupt ones as errors.
    fn scan_keyed<T: crate::codec::Record>(
        &self,
        prefix: &[u8],
    ) -> Vec<(Vec<u8>, Result<T, CorruptRecord>)> {
        let decode = |k: &[u8], v: &[u8]| codec::decode(v).map_err(|e| CorruptRecord::new(k, e));
        self.scan_raw(prefix)
            .into_iter()
            .map(|(k, v)| match v {
                Ok(v) => {
                    let d = decode(&k, &v);
                    (k, d)
                }
                Err(c) => (k, Err(c)),
            })
            .collect()
    }

    /// Every key that starts with `prefix` and its current value, in key
    /// order (pending writes win over the tree's).
    pub(super) fn scan_raw(
        &self,
        prefix: &[u8],
    ) -> Vec<(Vec<u8>, Result<sled::IVec, CorruptRecord>)> {
        // Pending writes first, so a key the applier writes meanwhile is read
        // with a value at least as new as the one it had when the scan began.
        let mut pending = self.overlay.prefix(prefix).into_iter().peekable();
        let mut out = Vec::new();
        for item in self.trees.for_key(prefix).scan_prefix(prefix) {
            let (k, v) = match item {
                Ok(kv) => kv,
                Err(e) => {
                    out.push((prefix.to_vec(), Err(CorruptRecord::new(prefix, e))));
                    continue;
                }
            };
            while let Some((pk, pv)) = pending.next_if(|(pk, _)| pk.as_slice() < &k[..]) {
                if let Some(pv) = pv {
                    out.push((pk, Ok(pv)));
                }
            }
            match pending.next_if(|(pk, _)| pk.as_slice() == &k[..]) {
                Some((_, Some(pv))) => out.push((k.to_vec(), Ok(pv))),
                Some((_, None)) => {}
                None => out.push((k.to_vec(), Ok(v))),
            }
        }
        for (pk, pv) in pending {
            if let Some(pv) = pv {
                out.push((pk, Ok(pv)));
            }
        }
        out
    }

    /// The attempt logs of task `id`, oldest first (at most the last
    /// `KEEP_ATTEMPTS`).
    pub fn attempts(&self, id: u64) -> Result<Vec<AttemptLog>, ReadError> {
        self.scan_keyed(&keys::attempt_prefix(id))
            .into_iter()
            .map(|(_, r)| r.map_err(ReadError::from))
            .collect()
    }

    /// The attempt numbers task `id` has logs for, without reading them.
    pub fn attempt_numbers(&self, id: u64) -> Result<BTreeSet<u32>, ReadError> {
        let mut out = BTreeSet::new();
        for (k, v) in self.scan_raw(&keys::attempt_prefix(id)) {
            v?;
            if let Some((_, n)) = keys::parse_attempt_key(&k) {
                out.insert(n);
            }
        }
        Ok(out)
    }

    /// Every attempt log in the store, by task id and attempt number (as
    /// their keys say), corrupt ones as errors.
    pub fn all_attempts(&self) -> Vec<Result<LoggedAttempt, CorruptRecord>> {
        self.scan_keyed(&[keys::ATTEMPT])
            .into_iter()
            .map(|(k, r)| {
                let at = keys::parse_attempt_key(&k)
                    .ok_or_else(|| CorruptRecord::new(&k, "not an attempt key"))?;
                Ok((at, r?))
            })
            .collect()
    }

    /// The event log from `from_seq` on, up to the last event committed
    /// when it is called (a record being written meanwhile, perhaps in
    /// pieces not all there yet, is not read). A corrupt commit record
    /// yields one error in place of its events.
    pub fn events_from(
        &self,
        from_seq: u64,
    ) -> impl Iterator<Item = Result<Event, CorruptRecord>> + '_ {
        // Under the write lock, a record is committed before its events
        // are counted.
        let last = self.next_seq().saturating_sub(1);
        let log = self.log_view();
        // Start at the record that holds `from_seq`.
        let start = log.holding(from_seq).unwrap_or(from_seq);
        log.read(start, last).flat_map(move |item| {
            let decoded = item
                .map_err(records::Unread::corrupt)
                .and_then(|l| l.record());
            let items: Vec<Result<Event, CorruptRecord>> = match decoded {
                Ok(rec) => rec
                    .events
                    .into_iter()
                    .filter(|e| e.seq >= from_seq)
                    .map(Ok)
                    .collect(),
                Err(c) => vec![Err(c)],
            };
            items
        })
    }

    /// The number of the first event in the log (the key of its first
    /// commit record), or `None` when the log is empty. (Once retention
    /// moves old records into archive segments, it is more than 1.)
    pub fn first_logged_seq(&self) -> Result<Option<u64>, CorruptRecord> {
        match self.log_view().first_key() {
            Ok(None) => Ok(None),
            Err(e) => Err(CorruptRecord::new(&[EVENT], e)),
            Ok(Some(k)) => records::key_seq(&k)
                .map(Some)
                .ok_or_else(|| CorruptRecord::new(&k, "not a commit record key")),
        }
    }

    /// The commit records as readers see them: those in the tree and those
    /// the applier has yet to write there.
    pub(crate) fn log_view(&self) -> records::View<'_> {
        let (pending, last) = self.overlay.pending_records();
        records::View {
            tree: &self.trees.main,
            pending,
            last,
        }
    }

    /// The number of the next event.
    pub fn next_seq(&self) -> u64 {
        self.lock_inner().next_seq
    }

    /// Ids in a queue, head first.
    pub fn queue_ids(&self, queue: &str) -> Vec<u64> {
        self.lock_inner().order.ids(queue)
    }

    pub fn head(&self, queue: &str) -> Option<u64> {
        self.lock_inner().order.head(queue)
    }

    pub fn queue_len(&self, queue: &str) -> usize {
        self.lock_inner().order.len(queue)
    }

    /// Non-empty queues with their lengths, in name order.
    pub fn queues(&self) -> Vec<(String, usize)> {
        self.lock_inner().order.queues()
    }

    /// The queue a task is placed in, if any.
    pub fn queue_of(&self, id: u64) -> Option<String> {
        self.lock_inner().order.queue_of(id).map(str::to_string)
    }

    /// The node of the last daemon that ran on this data dir (see
    /// [`Store::set_node`]), if one said.
    pub fn node(&self) -> Result<Option<crate::routing::Node>, ReadError> {
        self.read_record(keys::META_NODE)
    }

    /// Records this daemon's node (name and tags), made durable now, so
    /// that commands without a daemon can say which tasks are not for it.
    pub fn set_node(&self, node: &crate::routing::Node) -> Result<(), WriteError> {
        if self.node().ok().flatten().as_ref() == Some(node) {
            return Ok(());
        }
        if let Some(why) = self.failure() {
            return Err(WriteError::Failed(why));
        }
        let written = {
            let _writing = self.trees.writing();
            self.trees.main.insert(keys::META_NODE, codec::encode(node))
        };
        if let Err(e) = written {
            self.failed.fail(&self.trees.main, &e);
            return Err(e.into());
        }
        self.flush_sled().map_err(WriteError::Flush)
    }

    /// Builds the index of TTL deadlines from the live tasks (a corrupt
    /// record is logged and left out: it cannot expire), and from now on
    /// keeps it up to date at every commit. The engine calls it when it
    /// starts; commands never do. Returns how many tasks may expire.
    pub fn track_deadlines(&self) -> usize {
        let mut inner = self.lock_inner();
        if let Some(d) = &inner.deadlines {
            // Built by the open's pass over the live tasks (`recover`).
            return d.len();
        }
        let mut d = Deadlines::default();
        for t in self.live_tasks() {
            match t {
                Ok(t) => d.add(&t),
                Err(c) => log::error!("a live task cannot be read, so it cannot expire: {c}"),
            }
        }
        let n = d.len();
        inner.deadlines = Some(d);
        n
    }

    /// The earliest TTL deadline of a task that may expire (once
    /// [`Store::track_deadlines`] was called; None before).
    pub fn next_deadline(&self) -> Option<u64> {
        self.lock_inner()
            .deadlines
            .as_ref()
            .and_then(Deadlines::next)
    }

    /// Runs `f` on a view of the store as of one moment: the queues'
    /// order and every task read through it are of the same event (an
    /// export's consistent read). The view is a [`Store::snapshot`], so
    /// commits go on while `f` reads: nothing waits for an export.
    pub fn at_rest<R>(&self, f: impl FnOnce(&AtRest<'_>) -> R) -> Result<R, CorruptRecord> {
        let snap = self.snapshot()?;
        let view = AtRest {
            queues: snap
                .model
                .queues
                .into_iter()
                .map(|(q, ids)| (q, ids.into()))
                .collect(),
            live: snap.model.live,
            history: snap.model.history,
            _store: std::marker::PhantomData,
        };
        Ok(f(&view))
    }

    /// Tasks placed in queues, in all.
    pub fn queued_total(&self) -> usize {
        self.lock_inner().order.total()
    }

    /// How many of `ids` are placed in queues (read under one lock).
    pub fn placed_among<'a>(&self, ids: impl IntoIterator<Item = &'a u64>) -> usize {
        let inner = self.lock_inner();
        ids.into_iter()
            .filter(|id| inner.order.queue_of(**id).is_some())
            .count()
    }
}

/// Flushes sled, then makes what it wrote durable (see `files`). The first
/// error marks the store failed; a failed store never calls sled again.
pub(crate) fn flush_durable(
    tree: &sled::Db,
    files: &DbFiles,
    failed: &Failed,
) -> std::io::Result<()> {
    check_not_failed(failed)?;
    let r = tree
        .flush()
        .map(|_| ())
        .map_err(std::io::Error::other)
        .and_then(|()| files.sync());
    if let Err(e) = &r {
        failed.fail(tree, e);
    }
    r
}

fn check_not_failed(failed: &Failed) -> std::io::Result<()> {
    match failed.reason() {
        Some(why) => Err(std::io::Error::other(format!(
            "the store stopped writing earlier: {why}"
        ))),
        None => Ok(()),
    }
}

/// Writes and syncs the write-ahead log's pending frames. The first error
/// marks the store failed.
fn flush_wal(wal: &Wal, tree: &sled::Db, failed: &Failed) -> std::io::Result<()> {
    check_not_failed(failed)?;
    let r = wal.flush();
    if let Err(e) = &r {
        failed.fail(tree, format!("cannot write the write-ahead log: {e}"));
    }
    r
}

/// A durable sled flush, then the write-ahead segments it covered deleted.
/// sled is flushed once beside the writers (most of the work), then again,
/// with its files synced, while no write to sled is under way
/// (`Trees::quiet`): what the syncs capture is a state sled finished
/// writing.
pub(crate) fn checkpoint_sled(
    wal: &Wal,
    overlay: &Overlay,
    trees: &Trees,
    files: &DbFiles,
    failed: &Failed,
) -> std::io::Result<()> {
    // The frames whose records the tree holds now: appended, and applied
    // (a record reaches the tree in an apply round after its frame).
    let upto = wal.begin_checkpoint().min(overlay.applied_record());
    check_not_failed(failed)?;
    if let Err(e) = trees.main.flush() {
        failed.fail(&trees.main, &e);
        return Err(std::io::Error::other(e));
    }
    {
        let _quiet = trees.quiet();
        flush_durable(&trees.main, files, failed)?;
    }
    // A segment left behind is read again at the next open and skipped
    // there: not a reason to stop writing.
    if let Err(e) = wal.release(upto) {
        log::warn!("cannot delete a write-ahead segment: {e}");
    }
    Ok(())
}

/// The batched flusher: every `interval`, the write-ahead log, or sled
/// (without it).
pub(crate) fn spawn_flusher(
    trees: Trees,
    files: Arc<DbFiles>,
    wal: Option<Arc<Wal>>,
    failed: Arc<Failed>,
    commit: Arc<GroupCommit>,
    interval: Duration,
) -> std::io::Result<(mpsc::Sender<()>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("berth-flusher".into())
        .spawn(move || {
            loop {
                match rx.recv_timeout(interval) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                if commit.pending() {
                    let r = commit.flush_all(|| match &wal {
                        Some(wal) => flush_wal(wal, &trees.main, &failed),
                        None => flush_durable(&trees.main, &files, &failed),
                    });
                    if let Err(e) = r {
                        log::error!("batched flush failed: {e}");
                    }
                }
            }
        })?;
    Ok((tx, handle))
}

/// How often the sled flusher looks whether a flush is due.
const CHECKPOINT_POLL: Duration = Duration::from_millis(100);

/// The sled flusher: flushes sled once the write-ahead log says it is due
/// (`Wal::checkpoint_due`), so that the log's segments can go; and writes
/// the log's pending frames once there are many (`Wal::pending_full`).
pub(crate) fn spawn_sled_flusher(
    trees: Trees,
    overlay: Arc<Overlay>,
    wal: Arc<Wal>,
    files: Arc<DbFiles>,
    failed: Arc<Failed>,
) -> std::io::Result<(mpsc::Sender<()>, JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<()>();
    let handle = std::thread::Builder::new()
        .name("berth-sled-flush".into())
        .spawn(move || {
            loop {
                match rx.recv_timeout(CHECKPOINT_POLL) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                if failed.is_failed() {
                    continue;
                }
                if wal.pending_full()
                    && let Err(e) = flush_wal(&wal, &trees.main, &failed)
                {
                    log::error!("writing the write-ahead log failed: {e}");
                }
                if !wal.checkpoint_due() {
                    continue;
                }
                if let Err(e) = checkpoint_sled(&wal, &overlay, &trees, &files, &failed) {
                    log::error!("flushing sled failed: {e}");
                }
            }
        })?;
    Ok((tx, handle))
}

/// A data dir a command made for a first write that was refused, to take
/// away as the store closes: the folders it made (`path` and all in it,
/// `whole`), or what it made in the empty folder `path`, whose mode the
/// open changed from `mode`.
#[derive(Debug)]
pub struct Discard {
    pub path: std::path::PathBuf,
    pub whole: bool,
    pub mode: Option<u32>,
}

impl Store {
    /// Takes the data dir away when the store closes, instead of making it
    /// durable: for a store whose open made the data dir (`discard`) and
    /// that committed nothing (else this does nothing). It is removed while
    /// the store still holds the data dir's lock, so no other process can
    /// have written to it.
    pub fn discard_on_close(&self, discard: Discard) {
        if self.next_seq() == 1 && !self.read_only {
            *self.discard.lock().unwrap_or_else(|p| p.into_inner()) = Some(discard);
        }
    }

    /// Removes what [`Store::discard_on_close`] named (the store is closing;
    /// what cannot be removed is left, and said).
    fn remove_discarded(&self, d: &Discard) {
        let removed = match d.whole {
            true => std::fs::remove_dir_all(&d.path),
            false => std::fs::read_dir(&d.path).and_then(|entries| {
                for e in entries {
                    let e = e?;
                    match e.file_type()?.is_dir() {
                        true => std::fs::remove_dir_all(e.path())?,
                        false => std::fs::remove_file(e.path())?,
                    }
                }
                match d.mode {
                    Some(mode) => {
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(&d.path, std::fs::Permissions::from_mode(mode))
                    }
                    None => Ok(()),
                }
            }),
        };
        if let Err(e) = removed {
            log::warn!(
                "{}: could not take away the data dir made for a refused first write: {e}",
                d.path.display()
            );
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        for (tx, handle) in [self.flusher.take(), self.sled_flusher.take()]
            .into_iter()
            .flatten()
        {
            drop(tx);
            if !self.failed.is_failed() {
                let _ = handle.join();
            }
        }
        // Apply everything pending, so the tree alone holds the state.
        self.overlay.stop();
        if let Some(handle) = self.applier.take()
            && !self.failed.is_failed()
        {
            let _ = handle.join();
        }
        // A failed store never waits on sled again (see `health`); the
        // records it acknowledged are in the write-ahead log and reopening
        // puts them back. A read-only one has nothing to keep.
        if self.failed.is_failed() || self.read_only {
            return;
        }
        // A data dir made for a first write that was refused goes, with
        // nothing to keep (sled closes on unlinked files after this).
        if let Some(d) = self
            .discard
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            self.remove_discarded(&d);
            return;
        }
        // Everything, including what the applier wrote after the last
        // commit's flush, so that a closed data dir is whole in sled and
        // its write-ahead log is empty.
        let flushed = {
            let _quiet = self.trees.quiet();
            flush_durable(&self.trees.main, &self.files, &self.failed)
        };
        match flushed {
            Ok(()) => {
                // Every commit is on disk now (nothing waits to be durable).
                if let Err(e) = self.write_high_mark(false) {
                    log::warn!(
                        "{}: cannot write the high-water mark ({}): {e}",
                        self.dir.display(),
                        super::high_mark::FILE
                    );
                }
                if let Some(wal) = &self.wal
                    && let Err(e) = wal.clear()
                {
                    log::warn!(
                        "{}: cannot empty the write-ahead log: {e}",
                        self.dir.display()
                    );
                }
            }
            Err(e) => log::error!("{}: final flush failed: {e}", self.dir.display()),
        }
    }
}

/// The store as [`Store::at_rest`] shows it: the state after one event.
pub struct AtRest<'a> {
    queues: Vec<(String, Vec<u64>)>,
    live: std::collections::BTreeMap<u64, Task>,
    history: std::collections::BTreeMap<u64, Task>,
    _store: std::marker::PhantomData<&'a Store>,
}

impl AtRest<'_> {
    /// Every non-empty queue (in name order) with its ids, head first.
    pub fn queues(&self) -> &[(String, Vec<u64>)] {
        &self.queues
    }

    /// Every live task, by id (a snapshot holds no corrupt one: it refuses).
    pub fn live_tasks(&self) -> Vec<Result<Task, CorruptRecord>> {
        self.live.values().cloned().map(Ok).collect()
    }

    /// Every finished task, by id.
    pub fn history(&self) -> Vec<Result<Task, CorruptRecord>> {
        self.history.values().cloned().map(Ok).collect()
    }

    /// A live task, if there is one with this id.
    pub fn live_task(&self, id: u64) -> Result<Option<Task>, ReadError> {
        Ok(self.live.get(&id).cloned())
    }

    /// A finished task, if there is one with this id.
    pub fn history_task(&self, id: u64) -> Result<Option<Task>, ReadError> {
        Ok(self.history.get(&id).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `freeze` waits for the transaction under way (and gives up after its
    /// patience), then holds the write lock for good: no transaction can
    /// start, so nothing more is written.
    #[test]
    fn a_frozen_store_starts_no_transaction() {
        let dir = tempfile::tempdir().expect("tempdir");
        let clock = Arc::new(crate::clock::FakeClock::new(1_800_000_000_000));
        let s = Store::open(dir.path(), Options::default(), clock).expect("open");
        let open = s.write();
        assert!(
            !s.freeze(Duration::from_millis(20)),
            "a transaction is open"
        );
        drop(open);
        assert!(s.freeze(Duration::from_secs(5)));
        assert!(
            matches!(s.inner.try_lock(), Err(TryLockError::WouldBlock)),
            "a transaction could start"
        );
        // Its close would wait for the lock: a frozen store is only left
        // behind by a process that exits.
        std::mem::forget(s);
    }

    /// A sled checkpoint deletes only the write-ahead segments whose
    /// records the applier has written to the tree: a record still in the
    /// overlay is in the log alone, and a crash would lose it with the
    /// segment.
    #[test]
    fn a_checkpoint_keeps_the_log_segments_whose_records_are_not_in_the_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = Options {
            write_ahead_log: true,
            sled_flush_every: Duration::from_secs(3600),
            ..Options::default()
        };
        let clock = Arc::new(crate::clock::FakeClock::new(1_800_000_000_000));
        let s = Store::open(dir.path(), options, clock).expect("open");
        let wal_dir = dir.path().join("db").join(super::super::wal::DIR);
        let segments = || {
            let mut v: Vec<_> = std::fs::read_dir(&wal_dir)
                .expect("wal dir")
                .map(|e| e.expect("entry").path())
                .filter(|p| p.extension().is_some_and(|x| x == "wal"))
                .collect();
            v.sort();
            v
        };
        s.overlay.hold(true);
        // More than a segment of records: each carries its task once, with
        // a payload of hex digits of a pseudo-random sequence, which gzip
        // packs to about half (4 bits a digit): so twice a segment of text.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut total = 0;
        while total < 2 * super::super::wal::SEGMENT_BYTES as usize + (4 << 20) {
            let text: String = (0..600_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    char::from(b"0123456789abcdef"[(x & 15) as usize])
                })
                .collect();
            total += text.len();
            let spec = crate::task::TaskSpec {
                queue: "main".into(),
                kind: "K".into(),
                name: format!("t{total}"),
                payload: serde_json::json!({ "x": text }),
                ..Default::default()
            };
            crate::submit::enqueue_one(&s, spec, crate::store::Placement::Last).expect("enqueue");
        }
        let first = segments();
        assert!(
            first.len() >= 2,
            "the log began a second segment: {first:?}"
        );
        s.flush_sled().expect("checkpoint");
        assert_eq!(
            segments(),
            first,
            "no segment goes while its records are only in the overlay"
        );
        s.overlay.hold(false);
        let (_, last) = s.overlay.pending_records();
        assert!(
            s.overlay.wait_marked(last),
            "the applier wrote every record"
        );
        s.flush_sled().expect("checkpoint");
        let left = segments();
        assert!(
            !left.contains(&first[0]) && left.len() < first.len(),
            "once applied, the closed segments go: {left:?} of {first:?}"
        );
    }
}
