//! `task list`: every task, live and finished, that a filter selects, as
//! rows of plain fields.

use serde::{Deserialize, Serialize};

use super::{Ctx, OpError};
use crate::report::{Place, TaskRow};
use crate::routing::Node;
use crate::store::CorruptRecord;
use crate::task::{Status, Task, check_name};

/// Which tasks `task list` shows. Empty lists select everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TaskFilter {
    pub queues: Vec<String>,
    pub kinds: Vec<String>,
    /// Status words: a task's status (`queued`, `running`, `succeeded`,
    /// `failed`, ...), or `dead` (a dead letter: failed, in the history),
    /// `waiting` (a group child not yet in a queue), `live` (not finished),
    /// `history` (finished).
    pub statuses: Vec<String>,
    /// Only tasks whose last change (finished, else started, else queued) is
    /// at or after this time (ms since the epoch).
    pub since_ms: Option<u64>,
    /// ... at or before this time.
    pub until_ms: Option<u64>,
    /// A name pattern: `*` any run of characters, `?` one character.
    pub name: Option<String>,
    /// Only tasks targeted at one of these nodes (their target names it):
    /// what an export to that node takes.
    pub targets: Vec<String>,
}

/// The most names a filter's list (queues, kinds, targets, statuses) may
/// hold.
pub const MAX_FILTER_NAMES: usize = 1024;

/// The status words a filter accepts.
pub const STATUS_WORDS: [&str; 11] = [
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "expired",
    "dead",
    "waiting",
    "live",
    "history",
    "elsewhere",
];

/// What an error about a filter calls its parts: the command's flags
/// (`--status`), or the request's fields after a prefix (`filter.statuses`
/// for `task_list`, `statuses` for `export`), for a client of the socket.
#[derive(Debug, Clone, Copy)]
pub enum Naming {
    Flags,
    Fields(&'static str),
}

impl Naming {
    pub fn of(self, flag: &str, field: &str) -> String {
        match self {
            Naming::Flags => flag.to_string(),
            Naming::Fields(prefix) => format!("{prefix}{field}"),
        }
    }
}

impl TaskFilter {
    /// Checks the status words, and the names: a queue, kind or node name
    /// that no task can have (`enqueue` refuses it) is an error naming its
    /// flag, not a filter that silently selects nothing.
    /// Its sizes are bounded too, so that no filter makes a list cost more
    /// than the tasks it reads: at most `MAX_FILTER_NAMES` names in a
    /// list, and a name pattern no longer than the longest name.
    pub fn validate(&self) -> Result<(), OpError> {
        self.validate_named(Naming::Flags)
    }

    /// [`TaskFilter::validate`], its errors naming the flags or the
    /// request's fields (`naming`).
    pub fn validate_named(&self, naming: Naming) -> Result<(), OpError> {
        let queue = naming.of("--queue", "queues");
        let kind = naming.of("--kind", "kinds");
        let target = naming.of("--target", "targets");
        let status = naming.of("--status", "statuses");
        for (flag, list) in [
            (&queue, &self.queues),
            (&kind, &self.kinds),
            (&target, &self.targets),
            (&status, &self.statuses),
        ] {
            if list.len() > MAX_FILTER_NAMES {
                return Err(OpError::input(format!(
                    "{flag}: {} given; at most {MAX_FILTER_NAMES} are allowed",
                    list.len()
                )));
            }
        }
        if let Some(p) = &self.name
            && p.len() > crate::task::MAX_NAME
        {
            return Err(OpError::input(format!(
                "{}: the pattern is {} bytes; at most {} are allowed (as in a task's name)",
                naming.of("--name", "name"),
                p.len(),
                crate::task::MAX_NAME
            )));
        }
        for (flag, what, names) in [
            (&queue, "queue", &self.queues),
            (&kind, "kind", &self.kinds),
            (&target, "target node", &self.targets),
        ] {
            for n in names {
                check_name(what, n).map_err(|e| OpError::input(format!("{flag}: {e}")))?;
            }
        }
        for s in &self.statuses {
            if !STATUS_WORDS.contains(&s.as_str()) {
                return Err(OpError::input(format!(
                    "{status}: '{s}' is not a status (use one of: {})",
                    STATUS_WORDS.join(", ")
                )));
            }
        }
        Ok(())
    }

    pub(super) fn selects(&self, row: &TaskRow) -> bool {
        let any = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
        let when = row.finished_at.or(row.started_at).unwrap_or(row.queued_at);
        any(&self.queues, &row.queue)
            && any(&self.kinds, &row.kind)
            && (self.statuses.is_empty() || self.statuses.iter().any(|s| row.is(s)))
            && self.since_ms.is_none_or(|t| when >= t)
            && self.until_ms.is_none_or(|t| when <= t)
            && self.name.as_deref().is_none_or(|p| glob(p, &row.name))
            && (self.targets.is_empty()
                || self
                    .targets
                    .iter()
                    .any(|n| Node::is_target(row.target.as_deref(), n)))
    }
}

/// Every task the filter selects, live ones first (in id order), then the
/// history (in id order). A record that cannot be read is an error naming it.
pub fn task_list(ctx: &Ctx<'_>, filter: &TaskFilter) -> Result<Vec<TaskRow>, OpError> {
    // A command checked it with its flags' names before it sent it.
    filter.validate_named(Naming::Fields("filter."))?;
    let Some(store) = ctx.store else {
        return Ok(Vec::new());
    };
    // Every queued task's position, from one pass over the queues.
    let mut positions = std::collections::HashMap::new();
    for (q, _) in store.queues() {
        for (i, id) in store.queue_ids(&q).into_iter().enumerate() {
            positions.insert(id, i + 1);
        }
    }
    let node = node_of(ctx);
    let mut rows = Vec::new();
    for t in store.live_tasks() {
        let t = t.map_err(corrupt)?;
        let row = match positions.get(&t.id) {
            Some(p) => row_of(&t, Place::Queue, Some(*p), node.as_ref()),
            None => row_of(&t, Place::Waiting, None, node.as_ref()),
        };
        rows.push(row);
    }
    for t in store.history() {
        let t = t.map_err(corrupt)?;
        let mut row = row_of(&t, Place::History, None, None);
        if t.status == Status::Cancelled
            && let Some(started) = t.started_at
        {
            // Cancelled while it waited, its last attempt had ended before:
            // that attempt's log says when (an unreadable log: not known).
            row.took_ms = match store.attempts(t.id) {
                Ok(logs) => logs
                    .last()
                    .map(|l| l.ended_at.min(t.finished_at.unwrap_or(u64::MAX)))
                    .map(|end| end.saturating_sub(started)),
                Err(_) => None,
            };
        }
        rows.push(row);
    }
    rows.retain(|r| filter.selects(r));
    Ok(rows)
}

/// A task's row as `task list` shows it on `node` (which says why a
/// waiting task does not run here), for a filter to select.
pub(super) fn row_of(
    t: &Task,
    place: Place,
    position: Option<usize>,
    node: Option<&Node>,
) -> TaskRow {
    let mut row = TaskRow::of(t, place, position);
    row.waiting_for = node.and_then(|n| not_here(n, t));
    row
}

/// This node: the running daemon's, or, without a daemon, that of the last
/// daemon that ran on the data dir (it records it at start). None if none
/// did: nothing is then said about routing.
pub(super) fn node_of(ctx: &Ctx<'_>) -> Option<Node> {
    match (ctx.engine, ctx.store) {
        (Some(e), _) => Some(e.config().routing()),
        (None, Some(s)) => s.node().ok().flatten(),
        (None, None) => None,
    }
}

/// Why a waiting task does not run on `node` (`for node edge-2`, `needs
/// tag gpu`), if it does not.
fn not_here(node: &Node, t: &Task) -> Option<String> {
    if t.status != Status::Queued {
        return None;
    }
    node.accepts(t).err().map(|why| why.to_string())
}

pub(super) fn corrupt(c: CorruptRecord) -> OpError {
    OpError::runtime(c.to_string())
}

/// `*` matches any run of characters, `?` one character; the rest matches
/// itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic two-pointer match with backtracking to the last `*`.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_stars_and_question_marks() {
        assert!(glob("*", ""));
        assert!(glob("echo", "echo"));
        assert!(!glob("echo", "echo2"));
        assert!(glob("e*o", "echo"));
        assert!(glob("*-crd", "metallb-crd"));
        assert!(!glob("*-crd", "metallb-crds"));
        assert!(glob("m?play", "mcplay"));
        assert!(glob("*a*b*", "xxaxxbxx"));
        assert!(!glob("*a*b", "xxbxxa"));
    }

    #[test]
    fn a_request_s_filter_is_refused_naming_its_fields() {
        // What the socket answers a client that is not the CLI (the CLI
        // checks with its flags' names before it sends).
        let f = TaskFilter {
            statuses: vec!["nope".into()],
            ..Default::default()
        };
        let e = f.validate_named(Naming::Fields("filter.")).unwrap_err();
        assert!(
            e.message
                .starts_with("filter.statuses: 'nope' is not a status"),
            "{e}"
        );
        assert!(
            f.validate()
                .unwrap_err()
                .message
                .starts_with("--status: 'nope'")
        );
        let f = TaskFilter {
            name: Some("*".repeat(513)),
            ..Default::default()
        };
        let e = f.validate_named(Naming::Fields("filter.")).unwrap_err();
        assert!(
            e.message
                .starts_with("filter.name: the pattern is 513 bytes"),
            "{e}"
        );
        let ctx = super::super::Ctx::direct(None, None);
        let e = task_list(
            &ctx,
            &TaskFilter {
                queues: vec!["bad q".into()],
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(e.message.starts_with("filter.queues: queue 'bad q'"), "{e}");
    }

    #[test]
    fn a_filter_larger_than_any_task_needs_is_refused() {
        // A socket request could carry megabytes of them, each read once
        // per task (a pattern of 2 MiB took a daemon's thread for minutes).
        let f = |name: usize, queues: usize| TaskFilter {
            name: Some("*".repeat(name)),
            queues: vec!["main".to_string(); queues],
            ..Default::default()
        };
        assert!(f(512, 1024).validate().is_ok());
        let e = f(513, 1).validate().unwrap_err();
        assert_eq!(e.class, super::super::Class::Input);
        assert_eq!(
            e.message,
            "--name: the pattern is 513 bytes; at most 512 are allowed (as in a task's name)"
        );
        let e = f(1, 1025).validate().unwrap_err();
        assert_eq!(e.message, "--queue: 1025 given; at most 1024 are allowed");
        let statuses = TaskFilter {
            statuses: vec!["live".to_string(); 1025],
            ..Default::default()
        };
        assert!(statuses.validate().is_err());
    }

    #[test]
    fn names_no_task_can_have_are_refused_naming_the_flag() {
        let bad = |f: TaskFilter| f.validate().unwrap_err();
        let e = bad(TaskFilter {
            queues: vec!["bad q".into()],
            ..Default::default()
        });
        assert_eq!(e.class, super::super::Class::Input);
        assert!(
            e.message
                .starts_with("--queue: queue 'bad q' has the character ' '"),
            "{e}"
        );
        let e = bad(TaskFilter {
            queues: vec![String::new()],
            ..Default::default()
        });
        assert!(
            e.message.starts_with("--queue: queue '' must be 1 to 64"),
            "{e}"
        );
        let e = bad(TaskFilter {
            targets: vec!["bad node".into()],
            ..Default::default()
        });
        assert!(
            e.message.starts_with("--target: target node 'bad node'"),
            "{e}"
        );
        let e = bad(TaskFilter {
            kinds: vec!["a/b".into()],
            ..Default::default()
        });
        assert!(e.message.starts_with("--kind: kind 'a/b'"), "{e}");
        // Unknown but possible names are fine: they select nothing.
        let f = TaskFilter {
            queues: vec!["nowhere".into()],
            kinds: vec!["Nope".into()],
            targets: vec!["edge-9".into()],
            ..Default::default()
        };
        assert_eq!(f.validate(), Ok(()));
    }

    #[test]
    fn unknown_status_words_are_refused() {
        let f = TaskFilter {
            statuses: vec!["dead".into(), "zombie".into()],
            ..Default::default()
        };
        let e = f.validate().unwrap_err();
        assert!(e.message.contains("'zombie' is not a status"), "{e}");
    }
}
