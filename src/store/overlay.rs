//! Deferred apply: the key writes of committed transactions that are not yet
//! in sled's tree, and the background thread that applies them.
//!
//! A commit puts its key writes here. With a write-ahead log (what makes it
//! durable, see `wal`) its commit record (events + exact key writes) comes
//! here too, as the keys that store it (`records::pieces`); without one,
//! the commit inserts the record into sled itself, since sled's flush is
//! then what makes it durable. Every read consults the overlay first, so
//! readers see committed state at once (the log's readers through
//! `records::View`). The applier thread takes everything pending in one
//! move (the map becomes the round's `applying` map, still read by
//! readers, and commits go on into a new empty one that shadows it),
//! writes the round's commit records to the tree, in order, then its other
//! keys, with plain inserts (a key changed by several commits since the
//! last round is written once, with its latest value), then (every
//! [`MARK_EVERY`], and when it goes idle) writes `mapplied` = the key of
//! the last commit record the round covered, and drops the `applying` map.
//! The lock is held for O(1) per round, not for a copy of everything
//! pending.
//!
//! Why the record waits for the applier: inserting it into sled in the
//! committing thread, under the write lock, was a third of the lock's hold
//! and serialised every commit (8 producers ran at 2.2-2.4 times one; 64
//! producers no faster than 8), and was on the engine's critical path at
//! each step.
//!
//! Crash argument: sled recovers a prefix of its log. The applier writes a
//! commit's keys only after its record (a round's records first, on one
//! thread, in order; then its keys), and `mapplied` only after the keys it
//! covers, so after a crash every record after the recovered `mapplied` is
//! re-applied at open, in order; the writes are whole values, so
//! re-applying is harmless and yields exactly the state of the last
//! recovered record. A record sled lost is in the write-ahead log: a
//! checkpoint deletes only the frames of records applied before its sled
//! flush began (`db.rs` `checkpoint_sled`), and open puts the frames after
//! sled's last record back first (`open.rs` `replay_wal`).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use sled::IVec;

use crate::codec;
use crate::store::event::KeyWrite;
use crate::store::health::Failed;
use crate::store::keys::{self, EVENT};
use crate::store::records;

/// How long the applier lets commits gather after it wakes up.
const GATHER: std::time::Duration = std::time::Duration::from_millis(2);

/// Key writes not yet in the tree above which a commit waits for the
/// applier (backpressure). A commit waits until the round under way has
/// written enough of its keys, not until it has ended (the round's map is
/// dropped only then): with a bound of 200,000 and waits for a whole round,
/// a batch of 10,000 tasks waited 0.36-0.63 s about once every 20 batches
/// of a million-task enqueue, against 0.09 s for the others. The memory
/// held is at most about twice this: the round's map, and the commits made
/// while it is written.
///
/// Why 10,000 (one batch of 10,000 tasks on an idle store never waits):
/// until 2026-12-06 the bound was 100,000. The first 100,000 or so key
/// writes of a burst were then acknowledged at the commit path's speed
/// (about 230,000 tasks/s here) and the rest at the applier's (about
/// 130,000-150,000), so a long batch enqueue slowed down by a third once
/// the overlay was full, whatever the size of the tree
/// (`enqueue_batch_1m_flatness` 0.53-0.70, 100,000 tasks at a time in
/// windows of 198,743, 187,947, 174,613, 144,679, ... 128,718 tasks/s).
/// With 10,000 a burst runs at the applier's pace once its first 30,000 to
/// 40,000 tasks are in (those still go faster, on a tree small enough for
/// sled's cache), then stays flat to the millionth (134,514, 112,928, ...
/// 128,035: flatness 0.72-0.95 against 0.65 in the same hour);
/// `e2e_noop_sync` is unchanged (four pairs: 23,088 against 23,615
/// tasks/s, within the noise) while `e2e_noop_sync_enqueue`, 100,000 tasks
/// into an idle store, now goes at the applier's pace (about 130,000
/// tasks/s against 200,000); and the overlay and the records open
/// re-applies after a crash are a tenth as large.
const MAX_PENDING: usize = 10_000;

/// Keys the applier writes between two reports of its progress to the
/// commits waiting for room.
const PROGRESS_KEYS: usize = 1_024;

/// Pending key writes: key -> value, or None for removed.
type Writes = BTreeMap<Vec<u8>, Option<IVec>>;

/// What an apply round does.
enum Round {
    /// Nothing pending, the mark is current.
    Idle,
    /// Nothing pending; the mark is to be brought up to this record.
    Mark(u64),
    Apply(Applying),
}

/// A round's writes, and the commits (version counter and last record) they cover.
struct Applying {
    writes: Arc<Writes>,
    version: u64,
    record: u64,
}

#[derive(Debug, Default)]
struct State {
    /// The writes of the commits since the current round began (they
    /// shadow `applying`).
    map: Writes,
    /// The writes the current round is writing to the tree (None between
    /// rounds); readers still see them until the round ends.
    applying: Option<Arc<Writes>>,
    /// Commits put here (a version counter).
    version: u64,
    /// The key (first event number) of the last commit record put here.
    committed_record: u64,
    /// Version and record covered by the last finished apply round.
    applied_version: u64,
    applied_record: u64,
    /// The record of the last `mapplied` written (see [`Overlay::wait_marked`]).
    marked: u64,
    /// The applier should drain and end.
    stop: bool,
    /// The applier failed: entries stay here (reads remain right) for good.
    failed: bool,
    /// Tests: the applier begins no round while set (`Overlay::hold`;
    /// never set otherwise).
    held: bool,
}

#[derive(Debug, Default)]
pub(crate) struct Overlay {
    state: Mutex<State>,
    cv: Condvar,
    /// Keys of the round under way already written to the tree (0 between
    /// rounds): set to 0 under the lock when a round begins and ends, and
    /// raised without it by the applier and its helper as they write.
    written: AtomicUsize,
    /// Commits waiting for room, which the applier wakes as it writes.
    room_waiters: AtomicUsize,
}

impl Overlay {
    /// An empty overlay over a tree where every record up to `record` is applied.
    pub fn new(record: u64) -> Self {
        let ov = Overlay::default();
        {
            let mut st = ov.lock();
            st.committed_record = record;
            st.applied_record = record;
            st.marked = record;
        }
        ov
    }
}

/// A pending value as readers see it: `Some(None)` means removed.
pub(crate) type Pending = Option<Option<IVec>>;

impl State {
    /// Tests: whether the applier is held back (`Overlay::hold`).
    fn is_held(&self) -> bool {
        self.held && !self.stop
    }

    /// Key writes not yet in the tree.
    fn pending(&self) -> usize {
        self.map.len() + self.applying.as_ref().map_or(0, |a| a.len())
    }
}

impl Overlay {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pending value of a key, if any.
    pub fn get(&self, key: &[u8]) -> Pending {
        let st = self.lock();
        st.map
            .get(key)
            .or_else(|| st.applying.as_ref().and_then(|a| a.get(key)))
            .cloned()
    }

    /// Pending entries whose keys start with `prefix`, in key order.
    pub fn prefix(&self, prefix: &[u8]) -> Writes {
        let st = self.lock();
        let mut out = Writes::new();
        // The round's writes, then the newer ones over them.
        for w in st.applying.as_deref().into_iter().chain([&st.map]) {
            out.extend(
                w.range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(k, v)| (k.clone(), v.clone())),
            );
        }
        out
    }

    /// The commit records not yet in the tree (whole or in pieces, by key),
    /// and the key of the last record committed.
    pub fn pending_records(&self) -> (records::Pending, u64) {
        let st = self.lock();
        let mut out = records::Pending::new();
        for w in st.applying.as_deref().into_iter().chain([&st.map]) {
            for (k, v) in w.range::<[u8], _>(LOG) {
                // A record is never removed through the overlay.
                if let Some(v) = v {
                    out.insert(k.clone(), v.clone());
                }
            }
        }
        (out, st.committed_record)
    }

    /// The key of the last commit record whose writes (the record's own
    /// keys among them) are all in the tree, and of every one before it.
    pub fn applied_record(&self) -> u64 {
        self.lock().applied_record
    }

    /// Key writes not yet in the tree: those pending less those of the
    /// round under way that the applier has already written.
    fn unwritten(&self, st: &State) -> usize {
        st.pending()
            .saturating_sub(self.written.load(Ordering::SeqCst))
    }

    /// Waits while too many key writes are not yet in the tree (called
    /// before a commit logs its record).
    pub fn wait_for_room(&self) {
        let full = |st: &State| self.unwritten(st) > MAX_PENDING && !st.failed && !st.stop;
        let mut st = self.lock();
        if !full(&st) {
            return;
        }
        // Counted before the check that precedes each wait, so that an
        // applier that writes after that check sees a waiter and wakes it
        // ([`Overlay::wrote`]).
        self.room_waiters.fetch_add(1, Ordering::SeqCst);
        while full(&st) {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        self.room_waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// The applier (or its helper) wrote `n` more keys of the round under
    /// way; commits waiting for room are woken to look again.
    fn wrote(&self, n: usize) {
        self.written.fetch_add(n, Ordering::SeqCst);
        if self.room_waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock waits for a waiter between its check and its
            // wait, so that it cannot miss this.
            let _st = self.lock();
            self.cv.notify_all();
        }
    }

    /// Puts one commit's key writes (with the write-ahead log, its record's
    /// keys among them; without it, after its record is in sled). Call it
    /// under the store's write lock, so commits arrive in record order.
    pub fn put(&self, record: u64, writes: impl IntoIterator<Item = (Vec<u8>, Option<Vec<u8>>)>) {
        let mut st = self.lock();
        st.version += 1;
        for (k, val) in writes {
            st.map.insert(k, val.map(IVec::from));
        }
        st.committed_record = record;
        self.cv.notify_all();
    }

    /// Waits until `mapplied` says every commit record up to `record` is
    /// applied (the applier writes it when it goes idle, and every
    /// [`MARK_EVERY`] while it is busy), and the round that applied it has
    /// ended (its records are read from the tree alone: the log's cut may
    /// take them out). False when the applier failed or stopped first.
    pub fn wait_marked(&self, record: u64) -> bool {
        let mut st = self.lock();
        while st.marked < record || st.applied_record < record {
            if st.failed || st.stop || st.committed_record < record {
                return false;
            }
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        true
    }

    /// Writes `mapplied` = `record`, then notes it (see [`Overlay::marked`]).
    fn write_mark(&self, trees: &Trees, record: u64) -> Result<(), sled::Error> {
        {
            let _writing = trees.writing();
            write_mark(&trees.main, record)?;
        }
        self.marked(record);
        Ok(())
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
    fn apply_round(
        &self,
        trees: &Trees,
        helper: Option<&Helper>,
        mark: &mut MarkTimer,
    ) -> Result<bool, sled::Error> {
        let round = match self.begin_round() {
            Round::Idle => return Ok(false),
            Round::Mark(record) => {
                self.write_mark(trees, record)?;
                return Ok(true);
            }
            Round::Apply(round) => round,
        };
        // A failed write leaves `applying` in place: reads stay right.
        // The round's commit records first, in order, on this thread: a
        // commit's keys reach sled's log after its record (see the module
        // doc).
        apply_range(trees, &round.writes, LOG, Keys::All, self)?;
        match (split_key(&round.writes), helper) {
            // A large round: the helper writes the keys from the middle one
            // on while this thread writes those before it.
            (Some(split), Some(helper)) => {
                helper.apply(round.writes.clone(), split.clone());
                let first = apply_range(
                    trees,
                    &round.writes,
                    (Bound::Unbounded, Bound::Excluded(&split)),
                    Keys::NotLog,
                    self,
                );
                let second = helper.finished();
                first?;
                second?;
            }
            _ => apply_range(
                trees,
                &round.writes,
                (Bound::Unbounded, Bound::Unbounded),
                Keys::NotLog,
                self,
            )?,
        }
        if mark.due() {
            self.write_mark(trees, round.record)?;
        }
        self.end_round(round.version, round.record);
        Ok(true)
    }

    /// What the next round does; for `Apply`, everything pending becomes
    /// the round's `applying` map (readers still see it) and new commits
    /// go to an empty map that shadows it.
    fn begin_round(&self) -> Round {
        let mut st = self.lock();
        if st.is_held() {
            return Round::Idle;
        }
        if st.applied_version == st.version {
            return match st.marked >= st.committed_record {
                true => Round::Idle,
                false => Round::Mark(st.committed_record),
            };
        }
        let writes = Arc::new(std::mem::take(&mut st.map));
        st.applying = Some(writes.clone());
        self.written.store(0, Ordering::SeqCst);
        Round::Apply(Applying {
            writes,
            version: st.version,
            record: st.committed_record,
        })
    }

    /// The round's writes are in the tree: readers no longer need them.
    fn end_round(&self, version: u64, record: u64) {
        let mut st = self.lock();
        st.applying = None;
        self.written.store(0, Ordering::SeqCst);
        st.applied_version = version;
        st.applied_record = record;
        self.cv.notify_all();
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
                // Without its helper (it could not start) the applier writes
                // every round alone.
                let helper = Helper::spawn(trees.clone(), me.clone())
                    .inspect_err(|e| log::warn!("the applier works alone: {e}"))
                    .ok();
                let mut mark = MarkTimer::default();
                loop {
                    let round = if failed.is_failed() {
                        Err(None)
                    } else {
                        me.apply_round(&trees, helper.as_ref(), &mut mark)
                            .map_err(Some)
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
                        if let Err(e) = me.write_mark(&trees, record) {
                            log::error!("writing the applied mark failed: {e}");
                        }
                        return;
                    }
                    if st.applied_version == st.version || st.is_held() {
                        drop(self::wait(&me.cv, st));
                        // Let a few more commits arrive: a key written by
                        // several of them is then written to the tree once.
                        std::thread::sleep(GATHER);
                    }
                }
            })
    }

    /// Tests: holds the applier back (it begins no round) until called
    /// with false.
    #[cfg(test)]
    pub fn hold(&self, held: bool) {
        self.lock().held = held;
        self.cv.notify_all();
    }

    /// Asks the applier to drain and end.
    pub fn stop(&self) {
        self.lock().stop = true;
        self.cv.notify_all();
    }
}

/// Rounds of at least this many key writes are written by two threads.
const SPLIT_MIN: usize = 1_024;

/// The key from which the second half of a round's writes (in key order)
/// begins, for a round large enough to be split (see [`Helper`]).
fn split_key(writes: &Writes) -> Option<Vec<u8>> {
    if writes.len() < SPLIT_MIN {
        return None;
    }
    writes.keys().nth(writes.len() / 2).cloned()
}

/// Writes the round's writes whose keys are in `range`, in key order.
///
/// The values go to sled as the `IVec`s the overlay holds (a reference
/// count, not a copy), and the gate that lets sled's files be synced
/// ([`Trees::writing`]) is taken once per [`GATE_KEYS`] keys, not per key.
fn apply_range(
    trees: &Trees,
    writes: &Writes,
    range: (Bound<&[u8]>, Bound<&[u8]>),
    which: Keys,
    overlay: &Overlay,
) -> Result<(), sled::Error> {
    let mut writes = writes
        .range::<[u8], _>(range)
        .filter(|(k, _)| which == Keys::All || k.first() != Some(&EVENT))
        .peekable();
    let mut unreported = 0;
    while writes.peek().is_some() {
        let _writing = trees.writing();
        for (k, v) in writes.by_ref().take(GATE_KEYS) {
            trees.write_one(k, v.clone())?;
            unreported += 1;
        }
        if unreported >= PROGRESS_KEYS {
            overlay.wrote(std::mem::take(&mut unreported));
        }
    }
    overlay.wrote(unreported);
    Ok(())
}

/// The commit records' keys (whole or pieces).
const LOG: (Bound<&[u8]>, Bound<&[u8]>) =
    (Bound::Included(&[EVENT]), Bound::Excluded(&[EVENT + 1]));

/// Which keys of a range [`apply_range`] writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    All,
    /// All but the commit records' (written first, alone).
    NotLog,
}

/// Keys the applier writes under one hold of the sync gate: few enough
/// that a sled checkpoint waiting for the gate waits for a few hundred
/// microseconds of inserts at most.
const GATE_KEYS: usize = 32;

/// The applier's second thread. A large round is split at its middle key:
/// the helper writes the upper half while the applier writes the lower
/// one, and the round ends (its mark may be written) only once both have
/// finished. The two halves touch disjoint keys (a round holds one write
/// per key), so their order does not matter: after a crash, open
/// re-applies every record after the mark as before. Sled's writers are
/// lock-free, and the halves lie mostly in different leaves (a batch
/// enqueue's `t` keys, cut at its middle id, for one). With a single applier,
/// sled's inserts at one core were the limit of a long batch enqueue once
/// the overlay was full.
///
/// The helper holds a handle on the trees: dropping the `Helper` (the
/// applier ending) ends it and waits for it, so that once the applier has
/// been joined nothing holds the database open any more.
struct Helper {
    jobs: Option<crossbeam_channel::Sender<(Arc<Writes>, Vec<u8>)>>,
    done: crossbeam_channel::Receiver<Result<(), sled::Error>>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Helper {
    fn spawn(trees: Trees, overlay: Arc<Overlay>) -> std::io::Result<Helper> {
        let (jobs, job_rx) = crossbeam_channel::bounded::<(Arc<Writes>, Vec<u8>)>(1);
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("berth-applier-2".into())
            .spawn(move || {
                lower_priority();
                // Ends when the applier drops its sender.
                for (writes, from) in job_rx {
                    let r = apply_range(
                        &trees,
                        &writes,
                        (Bound::Included(&from), Bound::Unbounded),
                        Keys::NotLog,
                        &overlay,
                    );
                    if done_tx.send(r).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Helper {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Hands the helper the writes from `from` on.
    fn apply(&self, writes: Arc<Writes>, from: Vec<u8>) {
        // A helper gone is found by `finished`.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send((writes, from));
        }
    }

    /// Waits for the helper's half.
    fn finished(&self) -> Result<(), sled::Error> {
        self.done.recv().unwrap_or_else(|_| {
            Err(sled::Error::ReportableBug(
                "the applier's helper thread ended".into(),
            ))
        })
    }
}

/// The applier's nice value. Nobody waits for the applier (readers see the
/// overlay, acknowledgments wait for the commit record's flush), while the
/// threads a step waits for (the scheduler, the flush leader, sled's
/// writers, the handlers) share the same cores: at the default priority
/// it took their CPU and `e2e_noop_sync` ran at 10.7k-13k tasks/s; at 19,
/// 17k-20k. It cannot fall behind for good: a commit waits for it once
/// [`MAX_PENDING`] key writes are not yet in the tree, and then the cores are its own.
const APPLIER_NICE: libc::c_int = 19;

/// Gives the calling thread (the applier) [`APPLIER_NICE`].
fn lower_priority() {
    crate::threads::set_nice(APPLIER_NICE, "the applier");
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
///
/// `quiet` is the gate that lets sled's files be synced while nothing
/// writes to sled: every write to the trees after open holds it shared (a
/// key, or [`GATE_KEYS`] keys of the applier or of a re-applied record, at a time, see
/// [`Trees::writing`]), and the sled flusher holds it
/// alone while it flushes sled and syncs its files (`db.rs`
/// `checkpoint_sled`), so that the syncs capture a state sled finished
/// writing (sled 0.34 writes its buffers on several threads, out of order).
#[derive(Clone)]
pub(crate) struct Trees {
    pub main: sled::Db,
    pub counters: sled::Tree,
    quiet: Arc<std::sync::RwLock<()>>,
}

impl Trees {
    pub fn open(main: sled::Db) -> Result<Trees, sled::Error> {
        let counters = main.open_tree(keys::COUNTERS_TREE)?;
        Ok(Trees {
            main,
            counters,
            quiet: Arc::default(),
        })
    }

    /// Held while writing to sled (shared with other writers).
    pub fn writing(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.quiet.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Held while sled's files are synced: no write to sled is under way.
    pub fn quiet(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.quiet.write().unwrap_or_else(|p| p.into_inner())
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
        for chunk in writes.chunks(GATE_KEYS) {
            let _writing = self.writing();
            for w in chunk {
                self.write_one(&w.key, w.value.as_deref().map(IVec::from))?;
            }
        }
        Ok(())
    }

    /// Writes one key; the caller holds [`Trees::writing`].
    fn write_one(&self, key: &[u8], value: Option<IVec>) -> Result<(), sled::Error> {
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
    /// A timer whose mark is due at once (tests: the round writes it).
    #[cfg(test)]
    fn due_now() -> Self {
        let now = std::time::Instant::now();
        MarkTimer(now.checked_sub(MARK_EVERY).unwrap_or(now))
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn put(ov: &Overlay, record: u64, writes: &[(&str, Option<&str>)]) {
        ov.put(
            record,
            writes
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))),
        );
    }

    fn value(ov: &Overlay, key: &str) -> Option<Option<String>> {
        ov.get(key.as_bytes())
            .map(|v| v.map(|v| String::from_utf8(v.to_vec()).unwrap()))
    }

    /// A round large enough to be split is written by both threads: every
    /// put and every removal lands, on each side of the middle key, and
    /// the round ends only once both halves are in the tree.
    #[test]
    fn a_large_round_is_written_by_the_applier_and_its_helper() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = Trees::open(db).unwrap();
        let n = SPLIT_MIN * 2;
        // Keys already in the tree, every third one to be removed.
        for i in (0..n).step_by(3) {
            trees.main.insert(format!("t{i:06}"), "old").unwrap();
        }
        let ov = Arc::new(Overlay::new(0));
        ov.put(
            1,
            (0..n).map(|i| {
                let v = (i % 3 != 0).then(|| format!("v{i}").into_bytes());
                (format!("t{i:06}").into_bytes(), v)
            }),
        );
        let split = split_key(&ov.lock().map).expect("a round this large is split");
        assert_eq!(split, format!("t{:06}", n / 2).into_bytes());
        let helper = Helper::spawn(trees.clone(), ov.clone()).unwrap();
        assert!(
            ov.apply_round(&trees, Some(&helper), &mut MarkTimer::due_now())
                .unwrap()
        );
        assert_eq!(ov.lock().pending(), 0);
        for i in 0..n {
            let got = trees.main.get(format!("t{i:06}")).unwrap();
            let want = (i % 3 != 0).then(|| format!("v{i}"));
            assert_eq!(
                got.map(|v| String::from_utf8(v.to_vec()).unwrap()),
                want,
                "key {i}"
            );
        }
        // The task keys, and the applied mark (due, so written by the round).
        assert_eq!(trees.main.scan_prefix(b"t").count(), n - n.div_ceil(3));
        let mark = trees
            .main
            .get(keys::META_APPLIED)
            .unwrap()
            .expect("the mark");
        assert_eq!(codec::decode::<u64>(&mark).unwrap(), 1);
        assert_eq!(trees.main.len(), n - n.div_ceil(3) + 1);
        // A small round is not split.
        ov.put(2, [(b"tx".to_vec(), Some(b"1".to_vec()))]);
        assert_eq!(split_key(&ov.lock().map), None);
    }

    /// A commit that finds too many key writes not yet in the tree waits,
    /// and goes on once the round under way has written enough of them,
    /// before that round ends.
    #[test]
    fn a_commit_waiting_for_room_goes_on_as_the_round_writes_before_it_ends() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let trees = Trees::open(db).unwrap();
        let ov = Arc::new(Overlay::new(0));
        let key = |i: usize| format!("t{i:07}").into_bytes();
        let n = MAX_PENDING + 2 * PROGRESS_KEYS;
        ov.put(1, (0..n).map(|i| (key(i), Some(b"v".to_vec()))));
        let Round::Apply(round) = ov.begin_round() else {
            panic!("nothing to apply")
        };
        let (tx, rx) = crossbeam_channel::bounded(1);
        let waiter = {
            let ov = ov.clone();
            std::thread::spawn(move || {
                ov.wait_for_room();
                tx.send(()).unwrap();
            })
        };
        // Until the waiter has counted itself; from then on it can only
        // pass once keys are written, and none is yet.
        let start = std::time::Instant::now();
        while ov.room_waiters.load(Ordering::SeqCst) == 0 {
            assert!(start.elapsed().as_secs() < 30, "the commit never waited");
            std::thread::yield_now();
        }
        assert!(rx.try_recv().is_err(), "room before anything was written");
        assert_eq!(ov.unwritten(&ov.lock()), n);
        // The round writes its first 2 * PROGRESS_KEYS keys: exactly
        // MAX_PENDING remain, which is room.
        let upto = key(2 * PROGRESS_KEYS);
        apply_range(
            &trees,
            &round.writes,
            (Bound::Unbounded, Bound::Excluded(&upto)),
            Keys::All,
            &ov,
        )
        .unwrap();
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("the commit was woken by the round's progress");
        waiter.join().unwrap();
        assert!(ov.lock().applying.is_some(), "the round has not ended");
        assert_eq!(ov.unwritten(&ov.lock()), MAX_PENDING);
        assert_eq!(trees.main.len(), 2 * PROGRESS_KEYS);
        // The rest, and the round's end: nothing is left unwritten.
        apply_range(
            &trees,
            &round.writes,
            (Bound::Included(&upto), Bound::Unbounded),
            Keys::All,
            &ov,
        )
        .unwrap();
        ov.end_round(round.version, round.record);
        assert_eq!(ov.unwritten(&ov.lock()), 0);
        assert_eq!(ov.lock().pending(), 0);
        assert_eq!(trees.main.len(), n);
    }

    /// While a round writes its map to the tree, readers still see it, and
    /// the commits made meanwhile shadow it; once it ends, only those remain.
    #[test]
    fn a_round_takes_everything_pending_and_readers_see_both_maps() {
        let ov = Overlay::new(0);
        assert!(matches!(ov.begin_round(), Round::Idle));
        put(
            &ov,
            1,
            &[("ta", Some("1")), ("tb", Some("1")), ("tc", Some("1"))],
        );
        put(&ov, 2, &[("tb", Some("2"))]);
        let Round::Apply(round) = ov.begin_round() else {
            panic!("nothing to apply")
        };
        assert_eq!(
            (round.record, round.writes.len()),
            (2, 3),
            "one write per key, the latest"
        );
        assert_eq!(ov.lock().pending(), 3);
        // Commits during the round.
        put(&ov, 3, &[("tb", None), ("td", Some("3"))]);
        assert_eq!(
            value(&ov, "ta"),
            Some(Some("1".into())),
            "the round's write"
        );
        assert_eq!(value(&ov, "tb"), Some(None), "a newer removal shadows it");
        assert_eq!(value(&ov, "td"), Some(Some("3".into())));
        assert_eq!(value(&ov, "x"), None);
        let keys: Vec<_> = ov
            .prefix(b"t")
            .into_iter()
            .map(|(k, v)| (String::from_utf8(k).unwrap(), v.is_some()))
            .collect();
        assert_eq!(
            keys,
            [("ta", true), ("tb", false), ("tc", true), ("td", true)]
                .map(|(k, v)| (k.to_string(), v))
        );
        ov.end_round(round.version, round.record);
        assert_eq!(
            value(&ov, "ta"),
            None,
            "written to the tree: no longer pending"
        );
        assert_eq!(value(&ov, "tb"), Some(None));
        assert_eq!(ov.lock().pending(), 2);
        // The next round takes the rest; then only the mark is behind.
        let Round::Apply(next) = ov.begin_round() else {
            panic!("the newer writes are pending")
        };
        assert_eq!(next.record, 3);
        ov.end_round(next.version, next.record);
        assert!(matches!(ov.begin_round(), Round::Mark(3)));
        ov.marked(3);
        assert!(matches!(ov.begin_round(), Round::Idle));
        assert!(ov.wait_marked(3));
    }
}
