//! `berth log`: an event as one timeline entry (time, number, name, task,
//! details), the filters that select entries, and the entry's text line
//! and JSON object.

use serde::{Deserialize, Serialize};

use crate::store::event::{Event, EventKind};
use crate::store::order::Placement;
use crate::units::{format_duration, format_time};

/// One event as the timeline shows it (also its wire form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    /// Milliseconds since the epoch.
    pub at: u64,
    /// `EventKind::name`.
    pub event: String,
    pub task: u64,
    /// The queue the event puts the task in (enqueued, placed), if it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    pub details: String,
}

fn placement(p: &Placement) -> Option<String> {
    match p {
        Placement::Last => None,
        Placement::First => Some("at the head".into()),
        Placement::After(id) => Some(format!("after task {id}")),
        Placement::Before(id) => Some(format!("before task {id}")),
    }
}

/// Text on one line: line breaks shown as `\n`.
fn one_line(text: &str) -> String {
    text.replace('\n', "\\n")
}

impl Entry {
    pub fn of(ev: &Event) -> Entry {
        let mut queue = None;
        let details = match &ev.kind {
            EventKind::Enqueued { task, placement: p } => {
                queue = Some(task.queue.clone());
                let mut d = format!(
                    "queue {}, kind {}, name {}",
                    task.queue, task.kind, task.name
                );
                match (p, task.parent) {
                    (None, Some(parent)) => d.push_str(&format!(", waits for group {parent}")),
                    (None, None) => d.push_str(", in no queue"),
                    (Some(p), _) => {
                        if let Some(w) = placement(p) {
                            d.push_str(&format!(", {w}"));
                        }
                    }
                }
                if !task.children.is_empty() {
                    d.push_str(&format!(", group of {}", task.children.len()));
                }
                d
            }
            EventKind::Placed {
                queue: q,
                placement: p,
                ..
            } => {
                queue = Some(q.clone());
                match placement(p) {
                    Some(w) => format!("into queue {q}, {w}"),
                    None => format!("into queue {q}"),
                }
            }
            EventKind::Started { .. } => String::new(),
            EventKind::Succeeded { result, .. } => match result {
                Some(r) => format!("result of {} bytes", r.bytes.len()),
                None => String::new(),
            },
            EventKind::Failed {
                message, delay_ms, ..
            } => match delay_ms {
                Some(d) => format!(
                    "{} (retry in {})",
                    one_line(message),
                    format_duration(std::time::Duration::from_millis(*d))
                ),
                None => one_line(message),
            },
            EventKind::Requeued { retry_at, .. } => match retry_at {
                Some(t) => format!("waits until {}", format_time(*t)),
                None => String::new(),
            },
            EventKind::GroupUpdated {
                name,
                failures,
                message,
                ..
            } => {
                let mut d = format!("name {name}, failures {failures}");
                if let Some(m) = message {
                    d.push_str(&format!(", {}", one_line(m)));
                }
                d
            }
            EventKind::Removed { .. } | EventKind::Cancelled { .. } | EventKind::Expired { .. } => {
                String::new()
            }
            EventKind::MovedToHistory { status, .. } => format!("status {}", status.as_str()),
            EventKind::Retried { placement: p, .. }
            | EventKind::RetriedAnew { placement: p, .. } => placement(p).unwrap_or_default(),
            EventKind::AttemptLogged { log, .. } => {
                let mut d = format!("attempt {}: {}", log.attempt, log.outcome.word());
                if let Some(c) = log.exit_code {
                    d.push_str(&format!(", exit {c}"));
                }
                if let Some(s) = log.signal {
                    d.push_str(&format!(", signal {s}"));
                }
                if let Some(m) = log.outcome.message() {
                    d.push_str(&format!(": {}", one_line(m)));
                }
                d
            }
            EventKind::Merged { payload, .. } => {
                format!("new payload of {} bytes", payload.bytes.len())
            }
        };
        Entry {
            seq: ev.seq,
            at: ev.at,
            event: ev.kind.name().to_string(),
            task: ev.kind.task_id(),
            queue,
            details,
        }
    }

    /// The text line (with its newline): time, event number, name, task, details.
    pub fn text(&self) -> String {
        let line = format!(
            "{}  {:>7}  {:<16}  {:>7}  {}",
            format_time(self.at),
            self.seq,
            self.event,
            self.task,
            self.details
        );
        format!("{}\n", line.trim_end())
    }

    /// The JSON object (one line): the text line's fields, in its order.
    pub fn json(&self) -> String {
        #[derive(Serialize)]
        struct Line<'a> {
            time: String,
            seq: u64,
            event: &'a str,
            task: u64,
            details: &'a str,
        }
        let line = Line {
            time: format_time(self.at),
            seq: self.seq,
            event: &self.event,
            task: self.task,
            details: &self.details,
        };
        serde_json::to_string(&line).unwrap_or_default()
    }
}

/// Which entries `berth log` prints: every filter given must match.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub task: Option<u64>,
    pub queue: Option<String>,
    /// At or after this time (ms since the epoch).
    pub since_ms: Option<u64>,
    /// At or before this time.
    pub until_ms: Option<u64>,
    /// Each task's queue as the entries so far say (only with `queue`).
    queues: std::collections::HashMap<u64, String>,
}

impl Filter {
    pub fn new(
        task: Option<u64>,
        queue: Option<String>,
        since_ms: Option<u64>,
        until_ms: Option<u64>,
    ) -> Filter {
        Filter {
            task,
            queue,
            since_ms,
            until_ms,
            queues: Default::default(),
        }
    }

    /// Takes `ids` as tasks in the queue the filter selects: a timeline
    /// that begins at a checkpoint does not hold the `enqueued` and
    /// `placed` events of the tasks that checkpoint's state holds, so
    /// their queue comes from that state (`ops::log_page`'s `seed`).
    pub fn seed(&mut self, ids: &[u64]) {
        if let Some(q) = &self.queue {
            for id in ids {
                self.queues.insert(*id, q.clone());
            }
        }
    }

    /// Whether `e` is selected. Entries must come in order: a task's queue
    /// is the one its last `enqueued` or `placed` entry named, and an
    /// entry about a task is in that queue.
    pub fn selects(&mut self, e: &Entry) -> bool {
        let in_queue = match &self.queue {
            None => true,
            Some(want) => {
                if e.event == "removed" {
                    self.queues.remove(&e.task).as_ref() == Some(want)
                } else {
                    if let Some(q) = &e.queue {
                        self.queues.insert(e.task, q.clone());
                    }
                    self.queues.get(&e.task) == Some(want)
                }
            }
        };
        in_queue
            && self.task.is_none_or(|t| t == e.task)
            && self.since_ms.is_none_or(|t| e.at >= t)
            && self.until_ms.is_none_or(|t| e.at <= t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::Status;

    fn entry(seq: u64, event: &str, task: u64, queue: Option<&str>) -> Entry {
        Entry {
            seq,
            at: 1_796_040_000_000 + seq * 250,
            event: event.into(),
            task,
            queue: queue.map(str::to_string),
            details: String::new(),
        }
    }

    #[test]
    fn a_line_has_time_number_name_task_and_details() {
        let ev = Event {
            seq: 12,
            at: 1_796_040_000_250,
            kind: EventKind::Failed {
                id: 4,
                message: "Errors:\n- mcplay: boom".into(),
                delay_ms: Some(5_000),
            },
        };
        let e = Entry::of(&ev);
        assert_eq!(
            e.text(),
            "2026-11-30T12:00:00.250Z       12  failed                  4  \
             Errors:\\n- mcplay: boom (retry in 5s)\n"
        );
        assert!(
            e.json()
                .starts_with(r#"{"time":"2026-11-30T12:00:00.250Z","seq":12,"event":"failed","#),
            "{}",
            e.json()
        );
        let moved = Entry::of(&Event {
            seq: 13,
            at: 0,
            kind: EventKind::MovedToHistory {
                id: 4,
                status: Status::Failed,
            },
        });
        assert_eq!(moved.details, "status failed");
    }

    #[test]
    fn the_queue_filter_follows_enqueued_and_placed() {
        let mut f = Filter::new(None, Some("parallel_queue_0".into()), None, None);
        let picked: Vec<u64> = [
            entry(1, "enqueued", 1, Some("main")),
            entry(2, "enqueued", 2, Some("main")),
            entry(3, "placed", 2, Some("parallel_queue_0")),
            entry(4, "started", 2, None),
            entry(5, "started", 1, None),
            entry(6, "removed", 2, None),
            entry(7, "started", 2, None),
        ]
        .iter()
        .filter(|e| f.selects(e))
        .map(|e| e.seq)
        .collect();
        assert_eq!(picked, vec![3, 4, 6]);
        // A timeline from a checkpoint: its tasks' queues are seeded, and
        // a later event that names another queue still moves the task.
        let mut f = Filter::new(None, Some("main".into()), None, None);
        f.seed(&[7, 8]);
        let picked: Vec<u64> = [
            entry(10, "started", 7, None),
            entry(11, "started", 9, None),
            entry(12, "placed", 8, Some("parallel_queue_0")),
            entry(13, "started", 8, None),
        ]
        .iter()
        .filter(|e| f.selects(e))
        .map(|e| e.seq)
        .collect();
        assert_eq!(picked, vec![10]);
        // Without a queue filter, a seed selects nothing more.
        let mut f = Filter::new(Some(9), None, None, None);
        f.seed(&[7]);
        assert!(!f.selects(&entry(10, "started", 7, None)));
        let mut f = Filter::new(Some(1), None, Some(1_796_040_000_500), None);
        assert!(!f.selects(&entry(1, "enqueued", 1, Some("main"))));
        assert!(f.selects(&entry(5, "started", 1, None)));
        assert!(!f.selects(&entry(5, "started", 2, None)));
    }
}
