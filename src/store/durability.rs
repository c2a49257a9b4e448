//! When a write is acknowledged.
//!
//! `sync`: a commit returns only once a flush that began after its record was
//! written (and its key writes published) has finished. Concurrent
//! committers share flushes (group commit): one of them leads and flushes
//! everything published so far, the others wait for it, so N producers cost
//! about one flush and fsync per round, not N. Before it flushes, the leader
//! waits (at most `GATHER`, 300 µs) for the transactions under way, the ones the
//! engine announced, and the committers the last flush released that are
//! expected back (learned from the release before: see `State::returning`).
//!
//! `batched`: a commit returns once its record is written in sled's memory
//! (and, with the write-ahead log, in its pending buffer); a background
//! thread flushes every `interval`. A crash loses at most the commits of
//! the last interval plus one flush.
//!
//! A flush here is whatever the store passes in (`Store::flush_now`): by
//! default sled's flush and then the `fdatasync` of its files (`files`);
//! with the write-ahead log (`wal`), one `pwrite` and one `fdatasync`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread::Thread;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    #[default]
    Sync,
    Batched {
        interval: Duration,
    },
}

#[derive(Debug, Default)]
struct State {
    /// Transactions published (a ticket counter).
    written: u64,
    /// A leader is flushing now.
    flushing: bool,
    /// How long the flushes took.
    flush_stats: FlushStats,
    /// Transactions begun but not yet published or dropped.
    in_flight: usize,
    /// Transactions announced but not begun yet (`coming`): the completions
    /// of an engine's jobs, from their launch to the step that records them.
    coming: usize,
    /// When the last one was announced or renewed (`still_coming`, as a job
    /// ends): announcements older than
    /// [`GATHER`] are not waited for (one never taken cannot hold flushes).
    coming_at: Option<Instant>,
    /// When the last flush ended (its committers were released).
    released_at: Option<Instant>,
    /// The committers waiting for the flush under way to end (woken with
    /// `unpark` when it has).
    waiting: Vec<Thread>,
    /// Transactions begun within [`GATHER`] of that.
    begun_since_release: usize,
    /// How many the next flush leader waits to see begin within [`GATHER`]
    /// of the last release: as many as began within it after the release
    /// before (at most as many as the last flush released). See
    /// [`State::returning`].
    expect_back: usize,
}

impl State {
    /// Whether a flush leader should wait for a transaction under way.
    fn under_way(&self, now: Instant) -> bool {
        self.in_flight > 0 || self.coming_until(now).is_some() || self.returning(now)
    }

    /// Whether committers a flush released are expected to begin again
    /// before the next flush: producers that commit one after another
    /// (each waits for its commit, then begins the next) come back within
    /// [`GATHER`] of their release, while the next leader, released by an
    /// earlier flush, is already waiting. Without waiting for them, N such
    /// producers settle into two cohorts, each flush carrying half of them.
    /// The expectation is learned, one release to the next, so committers
    /// that do not come back (one-off clients) hold no flush: the number
    /// begun within [`GATHER`] of a release is what the leader after the
    /// next release waits for.
    fn returning(&self, now: Instant) -> bool {
        self.begun_since_release < self.expect_back
            && self.released_at.is_some_and(|at| now < at + GATHER)
    }

    /// A transaction has begun.
    fn begin(&mut self, now: Instant) {
        self.in_flight += 1;
        if self.released_at.is_some_and(|at| now < at + GATHER) {
            self.begun_since_release += 1;
        }
    }

    /// A flush that made `released` tickets durable has ended.
    fn released(&mut self, released: u64, now: Instant) {
        self.expect_back = self
            .begun_since_release
            .min(usize::try_from(released).unwrap_or(usize::MAX));
        self.begun_since_release = 0;
        self.released_at = Some(now);
    }

    /// Until when the announced transactions are waited for: None when
    /// none is, or the last announcement is [`GATHER`] old.
    fn coming_until(&self, now: Instant) -> Option<Instant> {
        let until = self.coming_at? + GATHER;
        (self.coming > 0 && until > now).then_some(until)
    }
}

/// How long a flush leader waits for transactions already under way, so
/// that one flush carries them too.
const GATHER: Duration = Duration::from_micros(300);

/// The group-commit rendezvous.
///
/// The flush leader gathering transactions waits on the condition variable
/// `gathered` (none is under way any more). The committers waiting for
/// durability park, each in `State::waiting`; the leader unparks them when
/// its flush has ended, and a woken committer reads `ended` and `durable`
/// without taking the lock. (With a condition
/// variable, every woken committer took the lock again on its way out:
/// eight producers woken at once queued on it, a context switch more per
/// commit.)
#[derive(Debug, Default)]
pub struct GroupCommit {
    state: Mutex<State>,
    gathered: Condvar,
    /// Every transaction up to this ticket is on disk; written under the
    /// lock.
    durable: AtomicU64,
    /// Flushes ended (for the waiting committers, tests and metrics),
    /// raised under the lock.
    ended: AtomicU64,
}

impl GroupCommit {
    /// Records that a transaction has begun.
    pub fn begin(&self) {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .begin(Instant::now());
    }

    /// Records that a begun transaction was dropped without writing.
    pub fn abandon(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.in_flight = st.in_flight.saturating_sub(1);
        self.note_gathered(&st);
    }

    /// Wakes a gathering flush leader once no transaction is under way.
    fn note_gathered(&self, st: &State) {
        if !st.under_way(Instant::now()) && st.flushing {
            self.gathered.notify_all();
        }
    }

    /// Announces `n` transactions that will begin soon (the completions of
    /// jobs just handed to the pool: the engine's step that records them),
    /// so that a flush leader gathering the transactions under way waits
    /// for them too (at most `GATHER`, 300 µs, after the last announcement).
    pub fn coming(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.coming += n;
        st.coming_at = Some(Instant::now());
    }

    /// An announced transaction is about to begin (a job finished and sent
    /// its completion): announcements are waited for again from now on,
    /// however long the job ran.
    pub fn still_coming(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.coming > 0 {
            st.coming_at = Some(Instant::now());
        }
    }

    /// Until when a flush would wait for the announced transactions (see
    /// [`GroupCommit::coming`]): None when none is announced, or the last
    /// announcement is older than `GATHER` (300 µs).
    pub fn coming_until(&self) -> Option<Instant> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.coming_until(Instant::now())
    }

    /// `n` announced transactions have begun (or will not come).
    pub fn arrived(&self, n: usize) {
        if n == 0 {
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.coming = st.coming.saturating_sub(n);
        self.note_gathered(&st);
    }

    /// Records that a begun transaction's record is written and its key
    /// writes are visible (published); returns its ticket. Call it right
    /// after, under the store's write lock.
    pub fn published(&self) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.written += 1;
        st.in_flight = st.in_flight.saturating_sub(1);
        self.note_gathered(&st);
        st.written
    }

    /// Returns once `ticket` is durable, flushing with `flush` if nobody else is.
    pub fn wait_durable(
        &self,
        ticket: u64,
        flush: impl Fn() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if self.durable.load(Ordering::Acquire) >= ticket {
                return Ok(());
            }
            if !st.flushing {
                st.flushing = true;
                // Let transactions already under way join this flush.
                let deadline = Instant::now() + GATHER;
                while st.under_way(Instant::now()) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    st = self
                        .gathered
                        .wait_timeout(st, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                let target = st.written;
                drop(st);
                let began = Instant::now();
                let result = flush();
                let took = began.elapsed();
                st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                st.flushing = false;
                st.flush_stats.record(took, result.is_ok());
                if result.is_ok() {
                    let durable = self.durable.load(Ordering::Relaxed);
                    st.released(target.saturating_sub(durable), Instant::now());
                    self.durable.store(durable.max(target), Ordering::Release);
                }
                self.ended.fetch_add(1, Ordering::Release);
                let waiting = std::mem::take(&mut st.waiting);
                drop(st);
                for committer in waiting {
                    committer.unpark();
                }
                result?;
                st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                continue;
            }
            // A flush ends under the lock: read here, `ended` changes only
            // once this committer is in the list that flush wakes.
            let seen = self.ended.load(Ordering::Relaxed);
            st.waiting.push(std::thread::current());
            drop(st);
            // `park` may return for nothing (or for an old `unpark`).
            while self.ended.load(Ordering::Acquire) == seen {
                std::thread::park();
            }
            if self.durable.load(Ordering::Acquire) >= ticket {
                return Ok(());
            }
            // The flush failed, or began before this ticket was published.
            st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Flushes everything published so far (used by the batched flusher).
    pub fn flush_all(&self, flush: impl Fn() -> std::io::Result<()>) -> std::io::Result<()> {
        let ticket = self.state.lock().unwrap_or_else(|p| p.into_inner()).written;
        self.wait_durable(ticket, flush)
    }

    /// The ticket of the last published transaction.
    pub fn written(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).written
    }

    /// Whether transactions are waiting for a flush.
    pub fn pending(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.written > self.durable.load(Ordering::Acquire)
    }

    pub fn flushes(&self) -> u64 {
        self.ended.load(Ordering::Acquire)
    }

    /// How long the flushes took (for metrics).
    pub fn flush_stats(&self) -> FlushStats {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .flush_stats
            .clone()
    }
}

/// The upper bounds of the flush duration histogram's buckets, in seconds.
pub const FLUSH_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The durations of the flushes since the store was opened (the
/// write-ahead log's write and `fdatasync`), in memory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlushStats {
    pub count: u64,
    pub failed: u64,
    pub sum_seconds: f64,
    /// Per bucket of [`FLUSH_BOUNDS`], not cumulative; then those above.
    pub buckets: [u64; FLUSH_BOUNDS.len() + 1],
}

impl FlushStats {
    fn record(&mut self, took: Duration, ok: bool) {
        let s = took.as_secs_f64();
        let i = FLUSH_BOUNDS
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(FLUSH_BOUNDS.len());
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_seconds += s;
        if !ok {
            self.failed += 1;
        }
    }

    /// Cumulative counts per bound (without `+Inf`).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut total = 0;
        FLUSH_BOUNDS
            .iter()
            .zip(self.buckets)
            .map(|(b, n)| {
                total += n;
                (*b, total)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Whether a flush would wait, right after the last announcement (so
    /// that a slow machine does not age it meanwhile).
    fn under_way(gc: &GroupCommit) -> bool {
        let st = gc.state.lock().unwrap();
        st.under_way(latest(&st))
    }

    /// Whether a flush would wait once `GATHER` has passed since then.
    fn aged(gc: &GroupCommit) -> bool {
        let st = gc.state.lock().unwrap();
        st.under_way(latest(&st) + GATHER)
    }

    fn latest(st: &State) -> Instant {
        st.coming_at.unwrap_or_else(Instant::now)
    }

    #[test]
    fn an_announced_transaction_is_waited_for_until_it_begins_or_grows_old() {
        let gc = GroupCommit::default();
        assert!(!under_way(&gc));
        gc.coming(2);
        assert!(under_way(&gc));
        gc.arrived(1);
        assert!(under_way(&gc), "one is still coming");
        // It begins: a transaction under way, then published.
        gc.begin();
        gc.arrived(1);
        assert!(under_way(&gc));
        gc.published();
        assert!(!under_way(&gc));
        // One that never comes holds nobody past `GATHER`.
        gc.coming(1);
        assert!(under_way(&gc) && !aged(&gc));
        // Until its job ends (however long it ran): then it is waited for
        // again, from then on.
        let long_ago = Instant::now().checked_sub(GATHER * 2);
        gc.state.lock().unwrap().coming_at = long_ago;
        assert!(!gc.state.lock().unwrap().under_way(Instant::now()));
        gc.still_coming();
        assert!(gc.state.lock().unwrap().coming_at > long_ago);
        assert!(under_way(&gc) && !aged(&gc));
        // `arrived` of more than were announced (the engine's loop ending)
        // leaves nothing behind.
        gc.arrived(usize::MAX);
        assert_eq!(gc.state.lock().unwrap().coming, 0);
    }

    #[test]
    fn committers_that_came_back_after_a_release_are_waited_for_after_the_next() {
        let t0 = Instant::now();
        let mut st = State::default();
        // The first release: nothing learned yet, nobody is waited for.
        st.released(8, t0);
        assert!(!st.returning(t0));
        // Five of the eight begin again within GATHER, three after it.
        for _ in 0..5 {
            st.begin(t0 + GATHER / 2);
        }
        for _ in 0..3 {
            st.begin(t0 + GATHER * 2);
        }
        // The next release: five are expected back, within GATHER of it.
        let t1 = t0 + GATHER * 3;
        st.released(8, t1);
        assert!(st.returning(t1));
        for _ in 0..4 {
            st.begin(t1 + GATHER / 4);
        }
        assert!(st.returning(t1 + GATHER / 4), "one more is expected");
        assert!(st.under_way(t1 + GATHER / 4) && st.in_flight == 12);
        assert!(
            !st.returning(t1 + GATHER),
            "nobody is waited for past GATHER"
        );
        st.begin(t1 + GATHER / 4);
        assert!(!st.returning(t1 + GATHER / 4), "all five are back");
        // Never more than the last flush released.
        let t2 = t1 + GATHER * 3;
        st.released(2, t2);
        assert_eq!(st.expect_back, 2);
        // Committers that do not come back (one-off clients) hold no flush:
        // a release after which nobody began teaches the next to expect none.
        let t3 = t2 + GATHER * 3;
        st.released(2, t3);
        assert_eq!(st.expect_back, 0);
        assert!(!st.returning(t3));
    }

    #[test]
    fn the_loop_gathers_until_an_announcement_arrives_or_grows_old() {
        let gc = GroupCommit::default();
        assert_eq!(gc.coming_until(), None, "nothing announced");
        let before = Instant::now();
        gc.coming(3);
        let until = gc.coming_until().expect("announced just now");
        assert!(until >= before + GATHER && until <= Instant::now() + GATHER);
        gc.arrived(3);
        assert_eq!(gc.coming_until(), None, "all arrived");
        // An announcement older than `GATHER` holds nobody.
        gc.coming(1);
        gc.state.lock().unwrap().coming_at = Instant::now().checked_sub(GATHER * 2);
        assert_eq!(gc.coming_until(), None);
    }

    #[test]
    fn every_commit_is_on_disk_when_its_wait_returns() {
        // A pretend disk: `memory` counts transactions published, a flush copies it to `disk`.
        let gc = Arc::new(GroupCommit::default());
        let memory = Arc::new(Mutex::new(0u64));
        let disk = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..16)
            .map(|_| {
                let (gc, memory, disk) = (gc.clone(), memory.clone(), disk.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let (mine, ticket) = {
                            let mut m = memory.lock().unwrap();
                            *m += 1;
                            (*m, gc.published())
                        };
                        gc.wait_durable(ticket, || {
                            let now = *memory.lock().unwrap();
                            std::thread::yield_now();
                            disk.fetch_max(now, Ordering::SeqCst);
                            Ok(())
                        })
                        .unwrap();
                        assert!(disk.load(Ordering::SeqCst) >= mine);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(!gc.pending());
        assert_eq!(disk.load(Ordering::SeqCst), 800);
    }

    #[test]
    fn a_failed_flush_is_reported_and_a_later_one_can_succeed() {
        let gc = GroupCommit::default();
        let t = gc.published();
        let err = gc
            .wait_durable(t, || Err(std::io::Error::other("disk gone")))
            .unwrap_err();
        assert_eq!(err.to_string(), "disk gone");
        assert!(gc.pending());
        gc.wait_durable(t, || Ok(())).unwrap();
        assert!(!gc.pending());
    }
}
