//! Attempt logs: how each attempt of a task went (its start and end, its
//! outcome, its exit code or signal, and the last bytes of its stdout and
//! stderr), stored under `o` ‖ task id ‖ attempt number (see `keys`).
//!
//! A log is written by the `AttemptLogged` event, in the transaction that
//! records the attempt's outcome (the engine's `complete`, and recovery's
//! `interrupted` at open). A task keeps the logs of its last
//! [`KEEP_ATTEMPTS`] attempts: the event that adds one drops the oldest
//! beyond that ([`to_drop`], the one rule the store and `verify`'s model
//! both follow). `Removed` drops all of a task's logs.

use std::collections::BTreeSet;

use bincode::{Decode, Encode};

use crate::budget::{Blob, Budget, BudgetError};

/// How many attempt logs a task keeps: the last ones, by attempt number.
pub const KEEP_ATTEMPTS: usize = 20;

/// The most of each stream (stdout, stderr) an attempt log keeps: its last
/// bytes. A budget with a small `max_object` keeps less (a quarter of it).
pub const TAIL_KEEP: usize = 64 * 1024;

/// One attempt of a task, as recorded when it ended.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct AttemptLog {
    /// 1 for the first attempt (`BERTH_ATTEMPT`, the task's `attempts`).
    pub attempt: u32,
    /// Milliseconds since the epoch: when the attempt's handler began (a
    /// worker took it: its `started` event, or a moment later); for an attempt that never ran (cancelled before a worker
    /// took it), when it ended; for an interrupted one, its `started`
    /// event.
    pub started_at: u64,
    /// When its outcome was recorded (for an interrupted attempt: when
    /// recovery found it).
    pub ended_at: u64,
    pub outcome: AttemptOutcome,
    /// The exit code of the last process the attempt ran (a command
    /// handler's pre, command or post); None for a library handler, a
    /// process killed by a signal, or an interrupted attempt.
    pub exit_code: Option<i32>,
    /// The signal that killed that process, if one did.
    pub signal: Option<i32>,
    pub stdout: OutputTail,
    pub stderr: OutputTail,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum AttemptOutcome {
    Succeeded,
    Failed {
        message: String,
    },
    /// Failed because a process ran past its timeout; `message` is the
    /// failure message (`timed out after 10m`).
    TimedOut {
        message: String,
    },
    /// Asked to run again (exit 75).
    Repeat,
    /// Asked to stay at the head and run again after a delay.
    Keep,
    /// Stopped (or its result set aside) by `berth task cancel`.
    Cancelled,
    /// berth stopped while it ran; found by recovery at the next open.
    Interrupted,
}

impl AttemptOutcome {
    /// The outcome's name: `succeeded`, `failed`, `timed out`, `repeat`,
    /// `keep`, `cancelled`, `interrupted`.
    pub fn word(&self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed { .. } => "failed",
            AttemptOutcome::TimedOut { .. } => "timed out",
            AttemptOutcome::Repeat => "repeat",
            AttemptOutcome::Keep => "keep",
            AttemptOutcome::Cancelled => "cancelled",
            AttemptOutcome::Interrupted => "interrupted",
        }
    }

    /// The failure message, for `failed` and `timed out`.
    pub fn message(&self) -> Option<&str> {
        match self {
            AttemptOutcome::Failed { message } | AttemptOutcome::TimedOut { message } => {
                Some(message)
            }
            _ => None,
        }
    }

    /// The outcome from its name and message (the wire form).
    pub fn from_parts(word: &str, message: Option<String>) -> Option<AttemptOutcome> {
        let message = message.unwrap_or_default();
        Some(match word {
            "succeeded" => AttemptOutcome::Succeeded,
            "failed" => AttemptOutcome::Failed { message },
            "timed out" => AttemptOutcome::TimedOut { message },
            "repeat" => AttemptOutcome::Repeat,
            "keep" => AttemptOutcome::Keep,
            "cancelled" => AttemptOutcome::Cancelled,
            "interrupted" => AttemptOutcome::Interrupted,
            _ => return None,
        })
    }
}

/// The end of one output stream of an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Default)]
pub struct OutputTail {
    /// Bytes the stream carried in all.
    pub total: u64,
    /// Its last bytes (raw, gzip-compressed at `compress_over`; see
    /// [`Blob::from_raw`]).
    pub tail: Blob,
}

/// The number of bytes a budget lets each tail keep.
pub fn tail_keep(budget: &Budget) -> usize {
    TAIL_KEEP.min(budget.max_object / 4)
}

impl OutputTail {
    /// The tail of a stream that carried `total` bytes, whose last bytes are
    /// `end`: at most [`tail_keep`] of them, starting at a character
    /// boundary when the text is UTF-8 (at most 3 bytes more are dropped).
    pub fn new(total: u64, end: &[u8], budget: &Budget) -> OutputTail {
        let mut keep = tail_keep(budget).min(end.len());
        loop {
            let mut start = end.len() - keep;
            let limit = (start + 3).min(end.len());
            while start < limit && (end[start] & 0xC0) == 0x80 {
                start += 1;
            }
            if let Ok(tail) = Blob::from_raw("output", end[start..].to_vec(), budget) {
                return OutputTail { total, tail };
            }
            if keep == 0 {
                return OutputTail {
                    total,
                    tail: Blob::default(),
                };
            }
            // A tiny budget: keep less.
            keep /= 2;
        }
    }

    /// The kept bytes.
    pub fn bytes(&self, budget: &Budget) -> Result<Vec<u8>, BudgetError> {
        self.tail.raw_bytes("output", budget)
    }
}

impl AttemptLog {
    /// The log of an attempt that was running when berth stopped.
    pub fn interrupted(attempt: u32, started_at: Option<u64>, now: u64) -> AttemptLog {
        AttemptLog {
            attempt,
            started_at: started_at.unwrap_or(now),
            ended_at: now,
            outcome: AttemptOutcome::Interrupted,
            exit_code: None,
            signal: None,
            stdout: OutputTail::default(),
            stderr: OutputTail::default(),
        }
    }
}

/// The rule for keeping logs: `numbers` are the attempts a task has logs
/// for (the new one included); the ones to drop are the lowest beyond the
/// last [`KEEP_ATTEMPTS`].
pub fn to_drop(numbers: &BTreeSet<u32>) -> Vec<u32> {
    let extra = numbers.len().saturating_sub(KEEP_ATTEMPTS);
    numbers.iter().copied().take(extra).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_keeps_its_last_twenty_attempts() {
        let mut n: BTreeSet<u32> = (1..=20).collect();
        assert!(to_drop(&n).is_empty());
        n.insert(21);
        assert_eq!(to_drop(&n), vec![1]);
        let gaps: BTreeSet<u32> = (1..=30).step_by(1).filter(|x| x % 3 != 0).collect();
        let dropped = to_drop(&gaps);
        assert_eq!(gaps.len() - dropped.len(), KEEP_ATTEMPTS);
        assert!(
            dropped
                .iter()
                .all(|d| gaps.iter().rev().take(20).all(|k| k > d))
        );
    }

    #[test]
    fn a_tail_keeps_the_end_within_the_budget_and_reads_back() {
        let b = Budget::default();
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let t = OutputTail::new(text.len() as u64, &text, &b);
        let back = t.bytes(&b).unwrap();
        assert_eq!(back.len(), TAIL_KEEP);
        assert!(text.ends_with(&back));
        assert_eq!(t.total, text.len() as u64);
        // A small budget keeps a quarter of max_object, compressed or not.
        let small = Budget {
            compress_over: 1024,
            max_object: 8 * 1024,
            max_decompressed: 8 * 1024,
        };
        let t = OutputTail::new(text.len() as u64, &text, &small);
        assert!(t.tail.compressed);
        assert_eq!(t.bytes(&small).unwrap().len(), 2048);
        // Incompressible bytes still fit.
        let mut rng = fastrand::Rng::with_seed(1);
        let noise: Vec<u8> = (0..100_000).map(|_| rng.u8(..)).collect();
        let t = OutputTail::new(100_000, &noise, &small);
        assert!(t.tail.bytes.len() <= small.max_object);
        assert!(noise.ends_with(&t.bytes(&small).unwrap()));
    }

    #[test]
    fn a_tail_starts_at_a_character() {
        let b = Budget {
            compress_over: 1 << 20,
            max_object: 4 * 9,
            max_decompressed: 1 << 20,
        };
        // The last 9 bytes would start inside an 'é' (2 bytes each).
        let text = "éééééééééé".as_bytes().to_vec();
        let t = OutputTail::new(20, &text, &b);
        let back = t.bytes(&b).unwrap();
        assert_eq!(String::from_utf8(back).unwrap(), "éééé");
        let none = OutputTail::new(0, b"", &b);
        assert!(none.bytes(&b).unwrap().is_empty());
    }

    /// `verify` compares the logs whole: a log the log does not know of, a
    /// changed one and a missing one are each reported.
    #[test]
    fn verify_checks_every_attempt_log() {
        use crate::store::{Options, Placement, Store, keys, verify};
        let dir = tempfile::tempdir().unwrap();
        let clock = std::sync::Arc::new(crate::clock::FakeClock::new(1_800_000_000_000));
        let s = Store::open(dir.path(), Options::default(), clock).unwrap();
        let spec = crate::task::TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: "n".into(),
            ..Default::default()
        };
        let id = crate::submit::enqueue_one(&s, spec, Placement::Last).unwrap();
        let mut w = s.write();
        w.start(id).unwrap();
        w.log_attempt(id, AttemptLog::interrupted(1, None, 5))
            .unwrap();
        w.commit().unwrap();
        assert_eq!(verify::verify(&s).unwrap(), Vec::<String>::new());
        s.flush().unwrap();
        // Written behind the log's back (the overlay is empty once applied;
        // a tree write is what a tampered or half-repaired dir would hold).
        let start = std::time::Instant::now();
        while !s.overlay.prefix(&[keys::ATTEMPT]).is_empty() {
            assert!(start.elapsed().as_secs() < 20, "the applier never ran");
            std::thread::yield_now();
        }
        let mut changed = AttemptLog::interrupted(1, None, 6);
        changed.exit_code = Some(3);
        s.trees
            .main
            .insert(keys::attempt_key(id, 1), crate::codec::encode(&changed))
            .unwrap();
        s.trees
            .main
            .insert(keys::attempt_key(id, 7), crate::codec::encode(&changed))
            .unwrap();
        let diffs = verify::verify(&s).unwrap();
        assert_eq!(diffs.len(), 2, "{diffs:#?}");
        assert!(diffs[0].starts_with("attempt 1 of task 1 differs: log "));
        assert_eq!(
            diffs[1],
            "attempt 7 of task 1 is logged in the state but not in the log"
        );
        s.trees.main.remove(keys::attempt_key(id, 1)).unwrap();
        let diffs = verify::verify(&s).unwrap();
        assert_eq!(
            diffs[0],
            "attempt 1 of task 1 is logged in the log but not in the state"
        );
    }

    #[test]
    fn outcomes_round_trip_through_their_names() {
        for o in [
            AttemptOutcome::Succeeded,
            AttemptOutcome::Failed {
                message: "boom".into(),
            },
            AttemptOutcome::TimedOut {
                message: "timed out after 2s".into(),
            },
            AttemptOutcome::Repeat,
            AttemptOutcome::Keep,
            AttemptOutcome::Cancelled,
            AttemptOutcome::Interrupted,
        ] {
            let back = AttemptOutcome::from_parts(o.word(), o.message().map(str::to_string));
            assert_eq!(back, Some(o));
        }
        assert_eq!(AttemptOutcome::from_parts("nope", None), None);
    }
}
