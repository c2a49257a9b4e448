//! Counters per task kind, folded from the events as they are committed:
//! tasks enqueued, merged (compaction), started, attempts by outcome, tasks
//! finished by final status, removed and retried, and histograms of attempt
//! durations and of the wait from enqueue to first start.
//!
//! A commit carries the new counts of every kind its events touched (one
//! `c` key per kind, see `keys`) among its key writes, so the counts are as
//! atomic and as durable as the events they count, survive restarts, and
//! are the same whether a daemon or a command made the change. Replaying the
//! log from the event where counting began gives the same counts: `verify`
//! checks it ([`ticks`] is the one fold both use).
//!
//! Counting began with event `since` (`mcounted`): 1 for a data dir created
//! by a build that counts, else the first event written after the first
//! open by such a build.
//!
//! The stored records hold maps keyed by name, so that a later build can
//! count more without changing them: new names are new entries.

use std::collections::BTreeMap;

use bincode::{Decode, Encode};

use crate::store::event::{EventKind, INTERRUPTED};
use crate::task::{Status, Task};

/// One kind's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode)]
pub struct KindCounts {
    /// Counter name (see the constants below) → count.
    pub values: BTreeMap<String, u64>,
    /// Histogram name → histogram.
    pub histograms: BTreeMap<String, Histogram>,
}

/// Observations in milliseconds, bucketed by [`BOUNDS_MS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode)]
pub struct Histogram {
    pub count: u64,
    pub sum_ms: u64,
    /// Observations per bucket, not cumulative: `buckets[i]` counts those
    /// at most `BOUNDS_MS[i]` and above the bound before; one more entry
    /// counts those above the last bound. A later build that wants other
    /// bounds must use another histogram name.
    pub buckets: Vec<u64>,
}

/// The upper bounds of the histograms' buckets, in milliseconds: 5 ms to
/// one hour.
pub const BOUNDS_MS: [u64; 18] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000,
    600_000, 1_800_000, 3_600_000,
];

impl Histogram {
    pub fn observe(&mut self, ms: u64) {
        if self.buckets.len() != BOUNDS_MS.len() + 1 {
            self.buckets.resize(BOUNDS_MS.len() + 1, 0);
        }
        let i = BOUNDS_MS
            .iter()
            .position(|b| ms <= *b)
            .unwrap_or(BOUNDS_MS.len());
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
    }

    /// Cumulative counts per bound (Prometheus's `le` buckets), without `+Inf`.
    pub fn cumulative(&self) -> Vec<(u64, u64)> {
        let mut total = 0;
        BOUNDS_MS
            .iter()
            .enumerate()
            .map(|(i, b)| {
                total += self.buckets.get(i).copied().unwrap_or(0);
                (*b, total)
            })
            .collect()
    }
}

/// Every kind's counts.
pub type Counts = BTreeMap<String, KindCounts>;

/// The store's counts and where counting began.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counting {
    pub counts: Counts,
    /// The first event counted.
    pub since: u64,
    /// Whether `since` is stored (`mcounted`); if not, the next commit that
    /// counts stores it.
    pub stored: bool,
}

/// Tasks enqueued (every new task: singles, group parents and children,
/// follow-ups).
pub const ENQUEUED: &str = "enqueued";
/// Enqueues merged into a waiting task instead (compaction).
pub const MERGED: &str = "merged";
/// Attempts started.
pub const STARTED: &str = "started";
/// Attempts that ended: `attempt.succeeded`, `attempt.failed` (also those
/// a restart found interrupted, and those a stop interrupted at the end of
/// its grace period), `attempt.requeued` (repeat or keep).
pub const ATTEMPT_SUCCEEDED: &str = "attempt.succeeded";
pub const ATTEMPT_FAILED: &str = "attempt.failed";
pub const ATTEMPT_REQUEUED: &str = "attempt.requeued";
/// Tasks that went to the history: `finished.` and their final status
/// (`finished.succeeded`, `finished.failed` for a dead letter, ...).
pub const FINISHED: &str = "finished.";
pub const REMOVED: &str = "removed";
pub const RETRIED: &str = "retried";
/// Attempt durations: from start to its end, for attempts that ended while
/// the process ran (those a stop interrupted too; not those a restart
/// found interrupted).
pub const ATTEMPT_MS: &str = "attempt_ms";
/// The wait of a task from its enqueue to its first start.
pub const WAIT_MS: &str = "wait_ms";

/// One change to a kind's counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tick {
    Add(String),
    Observe(&'static str, u64),
}

/// What an event adds to the counts of its task's kind. `task` is the task
/// as it was before the event (for `Enqueued`, the new task).
pub fn ticks(task: &Task, at: u64, ev: &EventKind) -> Vec<Tick> {
    let add = |name: &str| Tick::Add(name.to_string());
    let ran = |t: &Task| match (t.status, t.started_at) {
        (Status::Running, Some(s)) => Some(Tick::Observe(ATTEMPT_MS, at.saturating_sub(s))),
        _ => None,
    };
    match ev {
        EventKind::Enqueued { .. } => vec![add(ENQUEUED)],
        EventKind::Merged { .. } => vec![add(MERGED)],
        EventKind::Started { .. } => {
            let mut v = vec![add(STARTED)];
            if task.attempts == 0 {
                v.push(Tick::Observe(WAIT_MS, at.saturating_sub(task.queued_at)));
            }
            v
        }
        EventKind::Succeeded { .. } => [Some(add(ATTEMPT_SUCCEEDED)), ran(task)]
            .into_iter()
            .flatten()
            .collect(),
        EventKind::Failed { message, .. } => {
            let mut v = vec![add(ATTEMPT_FAILED)];
            if message != INTERRUPTED {
                v.extend(ran(task));
            }
            v
        }
        EventKind::Requeued { .. } => [Some(add(ATTEMPT_REQUEUED)), ran(task)]
            .into_iter()
            .flatten()
            .collect(),
        EventKind::MovedToHistory { status, .. } => {
            vec![Tick::Add(format!("{FINISHED}{}", status.as_str()))]
        }
        EventKind::Removed { .. } => vec![add(REMOVED)],
        EventKind::Retried { .. } | EventKind::RetriedAnew { .. } => vec![add(RETRIED)],
        _ => Vec::new(),
    }
}

/// Applies `ticks` to `counts`.
pub fn apply(counts: &mut KindCounts, ticks: Vec<Tick>) {
    for t in ticks {
        match t {
            Tick::Add(name) => *counts.values.entry(name).or_default() += 1,
            Tick::Observe(name, ms) => counts
                .histograms
                .entry(name.to_string())
                .or_default()
                .observe(ms),
        }
    }
}

/// The differences between two sets of counts, for `verify`.
pub fn diff(log: &Counts, state: &Counts) -> Vec<String> {
    let kinds: std::collections::BTreeSet<&String> = log.keys().chain(state.keys()).collect();
    let empty = KindCounts::default();
    kinds
        .into_iter()
        .filter_map(|k| {
            let (a, b) = (log.get(k).unwrap_or(&empty), state.get(k).unwrap_or(&empty));
            (a != b)
                .then(|| format!("counters of kind '{k}': the log says {a:?}, the state has {b:?}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_buckets() {
        let mut h = Histogram::default();
        for ms in [0, 5, 6, 99, 100, 4_000_000] {
            h.observe(ms);
        }
        assert_eq!(h.count, 6);
        assert_eq!(h.sum_ms, 4_000_210);
        let c = h.cumulative();
        assert_eq!(c[0], (5, 2)); // 0 and 5
        assert_eq!(c[1], (10, 3)); // and 6
        assert_eq!(c[4], (100, 5)); // and 99, 100
        assert_eq!(c[BOUNDS_MS.len() - 1], (3_600_000, 5)); // not 4,000,000
        assert_eq!(h.buckets[BOUNDS_MS.len()], 1);
    }
}
