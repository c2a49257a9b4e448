//! Deferred apply: the key writes of committed transactions that are not yet
//! in sled's tree, and the background thread that applies them.
//!
//! A commit inserts only its commit record (events + exact key writes) into
//! sled and puts its key writes here. Every read consults the overlay first,
//! so readers see committed state at once. The applier thread takes a
//! snapshot of everything pending, writes it to the tree with plain inserts
//! (a key changed by several commits since the last round is written once,
//! with its latest value), then (every [`MARK_EVERY`], and when it goes
//! idle) writes `mapplied` = the key of the last commit record the snapshot
//! covered, and drops from the overlay the entries that did not change
//! meanwhile.
//!
//! Crash argument: sled recovers a prefix of its log. The applier writes a
//! commit's keys only after its record was inserted, and `mapplied` only
//! after the keys it covers, so after a crash every record after the
//! recovered `mapplied` is re-applied at open, in order; the writes are whole
//! values, so re-applying is harmless and yields exactly the state of the
//! last recovered record.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use sled::IVec;

use crate::codec;
use crate::store::event::KeyWrite;
use crate::store::health::Failed;
use crate::store::keys;

/// How long the applier lets commits gather after it wakes up.
const GATHER: std::time::Duration = std::time::Duration::from_millis(2);

/// Pending entries above which a commit waits for the applier (backpressure).
const MAX_PENDING: usize = 200_000;

#[derive(Debug, Default)]
struct State {
    /// key -> (value or None for removed, version of the commit that set it).
    map: BTreeMap<Vec<u8>, (Option<IVec>, u64)>,
    /// Commits put here (a version counter).
    version: u64,
    /// The key (first event number) of the last commit record put here.
    committed_record: u64,
    /// Version and record covered by the last finished apply round.
    applied_version: u64,
    /// The record of the last `mapplied` written (see [`Overlay::wait_marked`]).
    marked: u64,
    /// The applier should drain and end.
    stop: bool,
    /// The applier failed: entries stay here (reads remain right) for good.
    failed: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Overlay {
    state: Mutex<State>,
    cv: Condvar,
}

impl Overlay {
    /// An empty overlay over a tree where every record up to `record` is applied.
    pub fn new(record: u64) -> Self {
        let ov = Overlay::default();
        {
            let mut st = ov.lock();
            st.committed_record = record;
            st.marked = record;
        }
        ov
    }
}

/// A pending value as readers see it: `Some(None)` means removed.
pub(crate) type Pending = Option<Option<IVec>>;

impl Overlay {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pending value of a key, if any.
    pub fn get(&self, key: &[u8]) -> Pending {
        self.lock().map.get(key).map(|(v, _)| v.clone())
    }

    /// Pending entries whose keys start with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> BTreeMap<Vec<u8>, Option<IVec>> {
        let st = self.lock();
        st.map
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect()
    }

    /// Waits while too much is pending (called before a commit inserts its record).
    pub fn wait_for_room(&self) {
        let mut st = self.lock();
        while st.map.len() > MAX_PENDING && !st.failed && !st.stop {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Puts one commit's key writes (after its record is in sled). Call it
    /// under the store's write lock, so commits arrive in record order.
    pub fn put(&self, record: u64, writes: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>) {
        let mut st = self.lock();
        st.version += 1;
        let v = st.version;
        for (k, val) in writes {
            st.map.insert(k, (val.map(IVec::from), v));
        }
        st.committed_record = record;
        self.cv.notify_all();
    }

    /// Waits until `mapplied` says every commit record up to `record` is
    /// applied (the applier writes it when it goes idle, and every
    /// [`MARK_EVERY`] while it is busy). False when the applier failed or
    /// stopped first.
    pub fn wait_marked(&self, record: u64) -> bool {
        let mut st = self.lock();
        while st.marked < record {
            if st.failed || st.stop || st.committed_record < record {
                return false;
            }
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        true
    }

    /// Notes a written mark and wakes those waiting for it.
    fn marked(&self, record: u64) {
        let mut st = self.lock();
        st.marked = st.marked.max(record);
        self.cv.notify_all();
    }

    /// One round: applies everything pending, or, with nothing pending,
    /// brings `mapplied` up to the last commit. Returns false when there
    /// was nothing to do.
    fn apply_round(&self, trees: &Trees, mark: &mut MarkTimer) -> Result<bool, sled::Error> {
        let (snapshot, version, record) = {
            let st = self.lock();
            if st.applied_version == st.version {
                if st.marked >= st.committed_record {
                    return Ok(false);
                }
                let record = st.committed_record;
                drop(st);
                write_mark(&trees.main, record)?;
                self.marked(record);
                return Ok(true);
            }
            let snap: Vec<(Vec<u8>, Option<IVec>, u64)> = st
                .map
                .iter()
                .map(|(k, (v, ver))| (k.clone(), v.clone(), *ver))
                .collect();
            (snap, st.version, st.committed_record)
        };
        for (k, v, _) in &snapshot {
            trees.apply_one(k, v.as_deref())?;
        }
        if mark.due() {
            write_mark(&trees.main, record)?;
            self.marked(record);
        }
        let mut st = self.lock();
        for (k, _, ver) in snapshot {
            if st.map.get(&k).is_some_and(|(_, cur)| *cur == ver) {
                st.map.remove(&k);
            }
        }
        st.applied_version = version;
        self.cv.notify_all();
        Ok(true)
    }

    /// Starts the applier thread. A failed write marks the store failed and
    /// ends it; so does a store that failed elsewhere.
    pub fn spawn(
        self: &Arc<Self>,
        trees: Trees,
        failed: Arc<Failed>,
    ) -> std::io::Result<JoinHandle<()>> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("berth-applier".into())
            .spawn(move || {
                lower_priority();
                let mut mark = MarkTimer::default();
                loop {
                    let round = if failed.is_failed() {
                        Err(None)
                    } else {
                        me.apply_round(&trees, &mut mark).map_err(Some)
                    };
                    match round {
                        Ok(true) => continue,
                        Ok(false) => {}
                        Err(e) => {
                            if let Some(e) = e {
                                failed.fail(&trees.main, format!("applying committed writes: {e}"));
                            }
                            let mut st = me.lock();
                            st.failed = true;
                            me.cv.notify_all();
                            return;
                        }
                    }
                    let st = me.lock();
                    if st.applied_version == st.version && st.stop {
                        let record = st.committed_record;
                        drop(st);
                        match write_mark(&trees.main, record) {
                            Ok(()) => me.marked(record),
                            Err(e) => log::error!("writing the applied mark failed: {e}"),
                        }
                        return;
                    }
                    if st.applied_version == st.version {
                        drop(self::wait(&me.cv, st));
                        // Let a few more commits arrive: a key written by
                        // several of them is then written to the tree once.
                        std::thread::sleep(GATHER);
                    }
                }
            })
    }

    /// Asks the applier to drain and end.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.cv.notify_all();
    }
}

/// The applier's nice value. Nobody waits for the applier (readers see the
/// overlay, acknowledgments wait for the commit record's flush), while the
/// threads a step waits for (the scheduler, the flush leader, sled's
/// writers, the handlers) share the same cores: at the default priority
/// it took their CPU and `e2e_noop_sync` ran at 10.7k-13k tasks/s; at 19,
/// 17k-20k. It cannot fall behind for good: a commit waits for it once
/// [`MAX_PENDING`] keys are pending, and then the cores are its own.
const APPLIER_NICE: libc::c_int = 19;

/// Gives the calling thread (the applier) [`APPLIER_NICE`]. Linux sets a
/// nice value per thread; elsewhere, or if it is refused, nothing changes.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain system calls on the calling thread's own id.
        let r = unsafe {
            libc::setpriority(
                libc::PRIO_PROCESS,
                libc::gettid() as libc::id_t,
                APPLIER_NICE,
            )
        };
        if r != 0 {
            log::debug!(
                "the applier keeps its priority: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// berth's sled trees: the default one, and [`keys::COUNTERS_TREE`] for
/// the `c` keys. A key's tree follows from its prefix ([`Trees::for_key`]).
///
/// Why two: sled keeps a leaf's values inline and splits leaves by key
/// count (16), so a small key rewritten at every commit drags its leaf's
/// neighbours along. The counters, written by every commit, sorted just
/// before the commit records (`e`), whose oldest ones can be megabytes (a
/// batch enqueue): each counter update rewrote them, as blob files, and the
/// engine ran at less than half speed. In their own tree their leaf holds
/// only counters.
#[derive(Clone)]
pub(crate) struct Trees {
    pub main: sled::Db,
    pub counters: sled::Tree,
}

impl Trees {
    pub fn open(main: sled::Db) -> Result<Trees, sled::Error> {
        let counters = main.open_tree(keys::COUNTERS_TREE)?;
        Ok(Trees { main, counters })
    }

    /// The tree that holds `key`.
    pub fn for_key(&self, key: &[u8]) -> &sled::Tree {
        match key.first() {
            Some(&keys::COUNTER) => &self.counters,
            _ => &self.main,
        }
    }

    /// Makes a commit record's key writes in the trees (open re-applies
    /// records with it; the applier does the same for the overlay's snapshot).
    pub fn apply_writes(&self, writes: &[KeyWrite]) -> Result<(), sled::Error> {
        for w in writes {
            self.apply_one(&w.key, w.value.as_deref())?;
        }
        Ok(())
    }

    fn apply_one(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), sled::Error> {
        let tree = self.for_key(key);
        match value {
            Some(v) => tree.insert(key, v)?,
            None => tree.remove(key)?,
        };
        Ok(())
    }
}

/// Writes `mapplied`: every commit record up to `record` is applied.
pub(crate) fn write_mark(tree: &sled::Db, record: u64) -> Result<(), sled::Error> {
    tree.insert(keys::META_APPLIED, codec::encode(&record))
        .map(|_| ())
}

/// How often the applied mark is written. It may lag behind what is applied:
/// open then re-applies a few records more, which is harmless.
const MARK_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

#[derive(Debug)]
struct MarkTimer(std::time::Instant);

impl Default for MarkTimer {
    fn default() -> Self {
        MarkTimer(std::time::Instant::now())
    }
}

impl MarkTimer {
    fn due(&mut self) -> bool {
        if self.0.elapsed() >= MARK_EVERY {
            self.0 = std::time::Instant::now();
            true
        } else {
            false
        }
    }
}

fn wait<'a>(cv: &Condvar, st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    cv.wait(st).unwrap_or_else(|p| p.into_inner())
}
