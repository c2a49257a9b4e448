//! Opening a data dir (lock, format check, index load, recovery) and reading
//! from it. Writing goes through [`WriteTxn`](super::WriteTxn).
//!
//! Recovery at open: a task found `running` was interrupted by a crash; it
//! stays where it is (at the head of its queue) with its failure count + 1
//! and the message [`INTERRUPTED`](super::INTERRUPTED), written as a
//! `failed` event like any other failure.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::budget::Budget;
use crate::clock::SharedClock;
use crate::codec;
use crate::store::durability::{Durability, GroupCommit};
use crate::store::error::{CorruptRecord, OpenError, ReadError, WriteError};
use crate::store::event::{CommitRecord, Event, INTERRUPTED};
use crate::store::files::{self, DbFiles};
use crate::store::keys::{self, EVENT, HISTORY, QUEUE, TASK};
use crate::store::lock::{DirLock, LockError, Role};
use crate::store::order::Order;
use crate::store::overlay::{self, Overlay};
use crate::store::panics;
use crate::store::write::{WriteTxn, apply_writes};
use crate::task::{Status, Task};

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
    /// sled's page cache size.
    pub cache_bytes: u64,
    /// fsync sled's files after every flush (see `files`), so that what
    /// `sync` acknowledges survives a power cut. `false` keeps only sled's
    /// own `sync_file_range`, which survives a process crash or `kill -9`
    /// but not a power cut; it exists to measure what power safety costs.
    pub power_safe: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Sync,
            budget: Budget::default(),
            role: Role::Command,
            wait_for_lock: Duration::from_secs(5),
            create: true,
            cache_bytes: 64 << 20,
            power_safe: true,
        }
    }
}

pub(crate) struct Inner {
    pub order: Order,
    pub next_id: u64,
    pub next_seq: u64,
}

pub struct Store {
    pub(crate) tree: sled::Db,
    dir: PathBuf,
    pub(crate) inner: Mutex<Inner>,
    pub(crate) commit: Arc<GroupCommit>,
    pub(crate) clock: SharedClock,
    pub(crate) budget: Budget,
    pub(crate) durability: Durability,
    /// Committed key writes not yet applied to the tree; every read looks here first.
    pub(crate) overlay: Arc<Overlay>,
    /// sled's files, synced after every flush.
    files: Arc<DbFiles>,
    applier: Option<JoinHandle<()>>,
    corrupt: Vec<CorruptRecord>,
    recovered: Vec<u64>,
    poisoned: Arc<std::sync::atomic::AtomicBool>,
    flusher: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    _lock: DirLock,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).finish()
    }
}

fn lock_dir(dir: &Path, opts: &Options) -> Result<DirLock, OpenError> {
    let started = Instant::now();
    loop {
        match DirLock::try_acquire(dir, opts.role) {
            Ok(l) => return Ok(l),
            Err(LockError::Io(source)) => {
                return Err(OpenError::Io {
                    dir: dir.to_path_buf(),
                    source,
                });
            }
            Err(LockError::Held(holder)) => {
                let waitable = opts.role == Role::Command && holder.role != Some(Role::Daemon);
                if !waitable || started.elapsed() >= opts.wait_for_lock {
                    return Err(OpenError::InUse {
                        dir: dir.to_path_buf(),
                        holder,
                    });
                }
                std::thread::sleep(Duration::from_millis(10 + fastrand::u64(0..20)));
            }
        }
    }
}

/// Opens sled in `DIR/db` after checking what it would read: leftovers of an
/// interrupted snapshot are removed, a database that the marker says existed
/// but is now missing or empty is refused, and a damaged one (sled returns
/// corruption, or panics) is an error that says what to do, never a panic.
fn open_sled(dir: &Path, opts: &Options) -> Result<sled::Db, OpenError> {
    match files::check_before_open(dir) {
        Ok(removed) => {
            for path in removed {
                log::warn!(
                    "removed {}, left by a sled snapshot that was interrupted",
                    path.display()
                );
            }
        }
        Err(files::Damage::Lost(what)) => {
            return Err(OpenError::Lost {
                dir: dir.to_path_buf(),
                what,
            });
        }
    }
    let config = sled::Config::new()
        .path(dir.join(files::DB))
        .cache_capacity(opts.cache_bytes)
        .flush_every_ms(None)
        .mode(sled::Mode::HighThroughput);
    let opened = panics::catch(|| config.open());
    let damaged = |detail: String| OpenError::Damaged {
        dir: dir.to_path_buf(),
        detail,
    };
    match opened {
        Ok(Ok(tree)) => Ok(tree),
        Ok(Err(sled::Error::Io(source))) if source.raw_os_error() == Some(libc::ENOSPC) => {
            Err(OpenError::NoSpace {
                dir: dir.to_path_buf(),
                source,
            })
        }
        Ok(Err(e @ (sled::Error::Corruption { .. } | sled::Error::ReportableBug(_)))) => {
            Err(damaged(e.to_string()))
        }
        Ok(Err(source)) => Err(OpenError::Database {
            dir: dir.to_path_buf(),
            source,
        }),
        Err(panic) => Err(damaged(format!("sled panicked while reading it: {panic}"))),
    }
}

impl Store {
    /// Opens (and if asked, creates) the data dir, recovering interrupted tasks.
    pub fn open(dir: &Path, opts: Options, clock: SharedClock) -> Result<Store, OpenError> {
        opts.budget.validate().map_err(OpenError::Options)?;
        let io_err = |source| OpenError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        if !dir.exists() && !opts.create {
            return Err(OpenError::Missing {
                dir: dir.to_path_buf(),
            });
        }
        files::private_dir(dir).map_err(io_err)?;
        let lock = lock_dir(dir, &opts)?;
        let tree = open_sled(dir, &opts)?;
        let db_files = Arc::new(DbFiles::open(dir, opts.power_safe).map_err(io_err)?);
        let db_err = |source| OpenError::Database {
            dir: dir.to_path_buf(),
            source,
        };

        // Format check.
        let format = match tree.get(keys::META_FORMAT).map_err(db_err)? {
            None => {
                if tree.iter().next().is_some() {
                    return Err(OpenError::Format {
                        dir: dir.to_path_buf(),
                        found: "missing".into(),
                        expected: keys::STORE_FORMAT,
                    });
                }
                if files::has_marker(dir) {
                    return Err(OpenError::Lost {
                        dir: dir.to_path_buf(),
                        what: "its database holds no data".into(),
                    });
                }
                overlay::write_mark(&tree, 0).map_err(db_err)?;
                tree.insert(keys::META_FORMAT, codec::encode(&keys::STORE_FORMAT))
                    .map_err(db_err)?;
                tree.flush().map_err(db_err)?;
                db_files.sync().map_err(io_err)?;
                keys::STORE_FORMAT
            }
            Some(v) => match codec::decode::<u64>(&v) {
                Ok(f @ (keys::STORE_FORMAT | keys::STORE_FORMAT_V1)) => f,
                Ok(other) => {
                    return Err(OpenError::Format {
                        dir: dir.to_path_buf(),
                        found: other.to_string(),
                        expected: keys::STORE_FORMAT,
                    });
                }
                Err(e) => {
                    return Err(OpenError::Format {
                        dir: dir.to_path_buf(),
                        found: format!("unreadable ({e})"),
                        expected: keys::STORE_FORMAT,
                    });
                }
            },
        };

        if !files::has_marker(dir) {
            files::write_marker(dir).map_err(io_err)?;
        }

        let mut corrupt = Vec::new();
        let mut next_id = 1u64;
        let mut next_seq = 1u64;
        // Every record after the applied mark may be unapplied or partly
        // applied: apply them again, in order. The last record is always
        // included (re-applying an applied record is harmless). A format-1
        // dir has no mark, and only its last record can be partly applied.
        let last = tree
            .scan_prefix([EVENT])
            .next_back()
            .transpose()
            .map_err(db_err)?;
        let last_key = last
            .as_ref()
            .and_then(|(k, _)| keys::parse_id_key(k))
            .unwrap_or(0);
        let mark = match tree.get(keys::META_APPLIED).map_err(db_err)? {
            Some(v) if format == keys::STORE_FORMAT => match codec::decode::<u64>(&v) {
                Ok(m) => m,
                Err(e) => {
                    corrupt.push(CorruptRecord {
                        key: keys::key_display(keys::META_APPLIED),
                        reason: e.to_string(),
                    });
                    0
                }
            },
            Some(_) | None if format == keys::STORE_FORMAT_V1 => last_key.saturating_sub(1),
            // A format-2 dir always has its mark; without it, re-apply everything.
            _ => 0,
        };
        let from = (mark + 1).min(last_key.max(1));
        for item in tree.range(keys::id_key(EVENT, from)..=keys::id_key(EVENT, u64::MAX)) {
            let (k, v) = item.map_err(db_err)?;
            match codec::decode::<CommitRecord>(&v) {
                Ok(rec) => {
                    apply_writes(&tree, &rec.writes).map_err(db_err)?;
                    next_id = rec.next_id;
                    next_seq = rec.events.last().map_or(1, |e| e.seq + 1);
                }
                Err(e) => {
                    corrupt.push(CorruptRecord {
                        key: keys::key_display(&k),
                        reason: e.to_string(),
                    });
                    next_seq = keys::parse_id_key(&k).map_or(1, |s| s + 1);
                }
            }
        }
        overlay::write_mark(&tree, last_key).map_err(db_err)?;
        if format == keys::STORE_FORMAT_V1 {
            tree.insert(keys::META_FORMAT, codec::encode(&keys::STORE_FORMAT))
                .map_err(db_err)?;
        }
        for prefix in [TASK, HISTORY] {
            if let Some((k, _)) = tree
                .scan_prefix([prefix])
                .next_back()
                .transpose()
                .map_err(db_err)?
                && let Some(id) = keys::parse_id_key(&k)
            {
                next_id = next_id.max(id + 1);
            }
        }

        // Queue order.
        let mut order = Order::default();
        for item in tree.scan_prefix([QUEUE]) {
            let (k, v) = item.map_err(db_err)?;
            let key = keys::key_display(&k);
            let parsed = keys::parse_queue_key(&k)
                .ok_or_else(|| "malformed queue key".to_string())
                .and_then(|(q, pos)| {
                    codec::decode::<u64>(&v)
                        .map(|id| (q, pos, id))
                        .map_err(|e| e.to_string())
                });
            match parsed {
                Ok((q, pos, id)) => {
                    if !order.load(q, pos, id) {
                        corrupt.push(CorruptRecord {
                            key,
                            reason: format!("task {id} is in more than one queue position"),
                        });
                    }
                }
                Err(reason) => corrupt.push(CorruptRecord { key, reason }),
            }
        }

        let poisoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let overlay = Arc::new(Overlay::new(last_key));
        let applier = overlay
            .spawn(tree.clone(), poisoned.clone())
            .map_err(|source| OpenError::Io {
                dir: dir.to_path_buf(),
                source,
            })?;
        let commit = Arc::new(GroupCommit::default());
        let flusher = match opts.durability {
            Durability::Sync => None,
            Durability::Batched { interval } => Some(
                spawn_flusher(tree.clone(), db_files.clone(), commit.clone(), interval).map_err(
                    |source| OpenError::Io {
                        dir: dir.to_path_buf(),
                        source,
                    },
                )?,
            ),
        };
        let mut store = Store {
            tree,
            dir: dir.to_path_buf(),
            inner: Mutex::new(Inner {
                order,
                next_id,
                next_seq,
            }),
            commit,
            clock,
            budget: opts.budget,
            durability: opts.durability,
            overlay,
            files: db_files,
            applier: Some(applier),
            corrupt,
            recovered: Vec::new(),
            poisoned,
            flusher,
            _lock: lock,
        };
        store.recover().map_err(|source| OpenError::Recover {
            dir: dir.to_path_buf(),
            source: Box::new(source),
        })?;
        for c in &store.corrupt {
            log::warn!("{}: {c}", store.dir.display());
        }
        Ok(store)
    }

    /// Puts tasks that were running when the process died back to waiting.
    fn recover(&mut self) -> Result<(), WriteError> {
        let mut interrupted = Vec::new();
        for item in self.tree.scan_prefix([TASK]) {
            let (k, v) = item?;
            match codec::decode::<Task>(&v) {
                Ok(t) if t.status == Status::Running => interrupted.push(t.id),
                Ok(_) => {}
                Err(e) => self.corrupt.push(CorruptRecord {
                    key: keys::key_display(&k),
                    reason: e.to_string(),
                }),
            }
        }
        if interrupted.is_empty() {
            return Ok(());
        }
        let mut txn = self.write();
        for id in &interrupted {
            txn.fail(*id, INTERRUPTED.to_string(), None)?;
        }
        txn.commit()?;
        log::info!(
            "{}: {} interrupted task(s) put back to wait: {:?}",
            self.dir.display(),
            interrupted.len(),
            interrupted
        );
        self.recovered = interrupted;
        Ok(())
    }

    /// Starts a write transaction. It holds the store's write lock until
    /// committed or dropped (dropping discards it).
    pub fn write(&self) -> WriteTxn<'_> {
        WriteTxn::new(self, self.lock_inner())
    }

    pub(crate) fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn poisoned(&self) -> bool {
        self.poisoned.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn flush_now(&self) -> std::io::Result<()> {
        flush_durable(&self.tree, &self.files)
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
    /// Flushes done so far (group commit makes this far fewer than commits).
    pub fn flush_count(&self) -> u64 {
        self.commit.flushes()
    }

    /// The current value of a key: a pending write if there is one, else the tree's.
    pub(crate) fn get_raw(&self, key: &[u8]) -> Result<Option<sled::IVec>, sled::Error> {
        match self.overlay.get(key) {
            Some(v) => Ok(v),
            None => self.tree.get(key),
        }
    }

    fn read_record<T: bincode::Decode<()>>(&self, key: &[u8]) -> Result<Option<T>, ReadError> {
        match self.get_raw(key)? {
            None => Ok(None),
            Some(v) => codec::decode(&v).map(Some).map_err(|e| {
                ReadError::Corrupt(CorruptRecord {
                    key: keys::key_display(key),
                    reason: e.to_string(),
                })
            }),
        }
    }

    /// A live task (queued or running, or a group child waiting for its parent).
    pub fn live_task(&self, id: u64) -> Result<Option<Task>, ReadError> {
        self.read_record(&keys::id_key(TASK, id))
    }

    /// A task from the history.
    pub fn history_task(&self, id: u64) -> Result<Option<Task>, ReadError> {
        self.read_record(&keys::id_key(HISTORY, id))
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
        self.scan(TASK)
    }

    /// Every finished task in the history, by id.
    pub fn history(&self) -> Vec<Result<Task, CorruptRecord>> {
        self.scan(HISTORY)
    }

    fn scan<T: bincode::Decode<()>>(&self, prefix: u8) -> Vec<Result<T, CorruptRecord>> {
        // Pending writes first, so a key the applier writes meanwhile is read
        // with a value at least as new as the one it had when the scan began.
        let mut pending = self.overlay.prefix(prefix).into_iter().peekable();
        let decode = |k: &[u8], v: &[u8]| {
            codec::decode(v).map_err(|e| CorruptRecord {
                key: keys::key_display(k),
                reason: e.to_string(),
            })
        };
        let mut out = Vec::new();
        for item in self.tree.scan_prefix([prefix]) {
            let (k, v) = match item {
                Ok(kv) => kv,
                Err(e) => {
                    out.push(Err(CorruptRecord {
                        key: format!("{}/?", prefix as char),
                        reason: e.to_string(),
                    }));
                    continue;
                }
            };
            while let Some((pk, pv)) = pending.next_if(|(pk, _)| pk.as_slice() < &k[..]) {
                if let Some(pv) = pv {
                    out.push(decode(&pk, &pv));
                }
            }
            match pending.next_if(|(pk, _)| pk.as_slice() == &k[..]) {
                Some((_, Some(pv))) => out.push(decode(&k, &pv)),
                Some((_, None)) => {}
                None => out.push(decode(&k, &v)),
            }
        }
        for (pk, pv) in pending {
            if let Some(pv) = pv {
                out.push(decode(&pk, &pv));
            }
        }
        out
    }

    /// The event log from `from_seq` on. A corrupt commit record yields one
    /// error in place of its events.
    pub fn events_from(
        &self,
        from_seq: u64,
    ) -> impl Iterator<Item = Result<Event, CorruptRecord>> + '_ {
        // Start at the record that holds `from_seq`.
        let start = self
            .tree
            .range(keys::id_key(EVENT, 0)..=keys::id_key(EVENT, from_seq))
            .next_back()
            .and_then(|r| r.ok())
            .map_or(keys::id_key(EVENT, from_seq), |(k, _)| {
                let mut a = [0u8; 9];
                a.copy_from_slice(&k);
                a
            });
        self.tree
            .range(start..=keys::id_key(EVENT, u64::MAX))
            .flat_map(move |item| {
                let decoded = item
                    .map_err(|e| CorruptRecord {
                        key: "e/?".into(),
                        reason: e.to_string(),
                    })
                    .and_then(|(k, v)| {
                        codec::decode::<CommitRecord>(&v).map_err(|e| CorruptRecord {
                            key: keys::key_display(&k),
                            reason: e.to_string(),
                        })
                    });
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

    /// Tasks placed in queues, in all.
    pub fn queued_total(&self) -> usize {
        self.lock_inner().order.total()
    }
}

/// Flushes sled, then makes what it wrote durable (see `files`).
fn flush_durable(tree: &sled::Db, files: &DbFiles) -> std::io::Result<()> {
    tree.flush().map_err(std::io::Error::other)?;
    files.sync()
}

fn spawn_flusher(
    tree: sled::Db,
    files: Arc<DbFiles>,
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
                    let r = commit.flush_all(|| flush_durable(&tree, &files));
                    if let Err(e) = r {
                        log::error!("batched flush failed: {e}");
                    }
                }
            }
        })?;
    Ok((tx, handle))
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Some((tx, handle)) = self.flusher.take() {
            drop(tx);
            let _ = handle.join();
        }
        // Apply everything pending, so the tree alone holds the state.
        self.overlay.stop();
        if let Some(handle) = self.applier.take() {
            let _ = handle.join();
        }
        if let Err(e) = self.flush() {
            log::error!("{}: final flush failed: {e}", self.dir.display());
        }
    }
}
