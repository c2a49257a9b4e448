//! A queue's status string, as addon-operator prints it in `queue list`.

use std::time::Duration;

use crate::units::{format_duration, format_size};

/// What a queue is doing, as the scheduler knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueActivity {
    /// Nothing to do (or the engine is not running).
    Idle,
    /// The head task's handler runs (or a group parent's children run).
    Running,
    /// The head task is ready but every worker is busy (it starts when one
    /// is free), or it is handed to the pool and no worker has picked it up
    /// yet.
    WaitingForWorker { since_ms: u64 },
    /// The head failed and waits for its retry.
    SleepAfterFail { until_ms: u64, total_ms: u64 },
    /// The queue waits before its next run (a handler's delay, Keep).
    Sleep { total_ms: u64 },
    /// The head asked to run again; it waits for a worker, or for the
    /// repeat interval since its last start.
    Repeat,
    /// The engine is stopping.
    Stop,
    /// Nothing starts: less than the disk reserve is free.
    Paused { free: u64, reserve: u64 },
    /// The head (or the group it holds for) is being cancelled: its
    /// handlers were asked to stop.
    Cancelling,
}

fn whole_secs(ms: u64) -> String {
    format!("{}s", ms / 1000)
}

/// The status text at time `now_ms`.
pub fn render(activity: &QueueActivity, now_ms: u64) -> String {
    match activity {
        QueueActivity::Idle => String::new(),
        QueueActivity::Running => "run first task".into(),
        QueueActivity::WaitingForWorker { since_ms } => {
            format!(
                "waiting for task {}",
                whole_secs(now_ms.saturating_sub(*since_ms))
            )
        }
        QueueActivity::SleepAfterFail { until_ms, total_ms } => format!(
            "sleep after fail for {} ({} left of {} delay)",
            format_duration(Duration::from_millis(*total_ms)),
            whole_secs(until_ms.saturating_sub(now_ms)),
            whole_secs(*total_ms)
        ),
        QueueActivity::Sleep { total_ms } => {
            format!(
                "sleep for {}",
                format_duration(Duration::from_millis(*total_ms))
            )
        }
        QueueActivity::Repeat => "repeat head task".into(),
        QueueActivity::Stop => "stop".into(),
        QueueActivity::Cancelling => "cancel first task".into(),
        QueueActivity::Paused { free, reserve } => format!(
            "paused: disk nearly full ({} free, {} kept in reserve)",
            format_size(*free),
            format_size(*reserve)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_read_like_addon_operators() {
        assert_eq!(render(&QueueActivity::Idle, 0), "");
        assert_eq!(render(&QueueActivity::Running, 0), "run first task");
        assert_eq!(
            render(&QueueActivity::WaitingForWorker { since_ms: 1_000 }, 21_500),
            "waiting for task 20s"
        );
        assert_eq!(
            render(
                &QueueActivity::SleepAfterFail {
                    until_ms: 21_400,
                    total_ms: 21_400
                },
                20_000
            ),
            "sleep after fail for 21.4s (1s left of 21s delay)"
        );
        assert_eq!(
            render(&QueueActivity::Sleep { total_ms: 5_000 }, 0),
            "sleep for 5s"
        );
        assert_eq!(render(&QueueActivity::Repeat, 0), "repeat head task");
        assert_eq!(render(&QueueActivity::Stop, 0), "stop");
        assert_eq!(render(&QueueActivity::Cancelling, 0), "cancel first task");
    }
}
