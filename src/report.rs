//! `queue list`: a snapshot of the queue set and its rendering in
//! addon-operator's text format and as JSON.
//!
//! Text, per non-empty queue (all queues with `show_empty`):
//! `Queue 'main': length 31, status: 'run first task'`, a blank line, one
//! `%2d. <description>` line per task, a blank line; then `Summary:` with the
//! main queue, the other queues and the total. `main` comes first, the other
//! queues follow in natural name order (`parallel_queue_2` before `_10`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::budget::{Blob, Budget};
use crate::queues::{MAIN, natural_cmp, parallel_queue};
use crate::store::Store;
use crate::task::{Status, Task};
use crate::units::{format_age, format_time};

/// One queue as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub name: String,
    pub status: String,
    /// The tasks, head first (the first ones only when the list was limited).
    pub tasks: Vec<QueueTask>,
    /// How many tasks the queue holds.
    pub length: usize,
}

/// One task in a queue, as `queue list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueTask {
    pub id: u64,
    /// addon-operator's line: `Kind:queue:name[:description][:failures N[:message]]`.
    pub description: String,
    pub kind: String,
    pub name: String,
    /// `queued`, `running`, ..., or `corrupt` when its record cannot be read.
    pub status: String,
    pub attempts: u32,
    pub failures: u32,
}

impl QueueTask {
    fn of(id: u64, task: Result<Option<Task>, crate::store::ReadError>) -> QueueTask {
        let broken = |description: String| QueueTask {
            id,
            description,
            kind: String::new(),
            name: String::new(),
            status: "corrupt".into(),
            attempts: 0,
            failures: 0,
        };
        match task {
            Ok(Some(t)) => QueueTask {
                id,
                description: t.description_line(),
                status: t.status.as_str().into(),
                attempts: t.attempts,
                failures: t.failures,
                kind: t.kind,
                name: t.name,
            },
            Ok(None) => broken(format!(
                "<task {id} is in the queue but its record is missing>"
            )),
            Err(e) => broken(format!("<corrupt task {id}: {e}>")),
        }
    }
}

/// Reads the queue set from the store: `main`, the parallel queues, and
/// every other non-empty queue. `status` gives each queue's status string.
pub fn snapshot(
    store: &Store,
    parallel_queues: usize,
    limit: usize,
    status: &dyn Fn(&str) -> String,
) -> Vec<QueueView> {
    let names = store.queues().into_iter().map(|(q, _)| q);
    views(
        parallel_queues,
        names,
        limit,
        &|q| store.queue_ids(q),
        &|id| store.live_task(id),
        status,
    )
}

/// The queue set of a replayed state (`berth replay`), as [`snapshot`]
/// makes it of a store: the same queues, in the same order, with the same
/// lines. A replayed queue has no live status: every status is empty, as
/// without a daemon.
pub fn model_views(model: &crate::store::verify::Model, parallel_queues: usize) -> Vec<QueueView> {
    views(
        parallel_queues,
        model.queues.keys().cloned(),
        usize::MAX,
        &|q| {
            model
                .queues
                .get(q)
                .map(|ids| ids.iter().copied().collect())
                .unwrap_or_default()
        },
        &|id| Ok(model.live.get(&id).cloned()),
        &|_| String::new(),
    )
}

/// The queue set: `main`, the parallel queues, and the other non-empty
/// queues `nonempty` names, each with its tasks (`ids`, head first, read
/// with `task`) and its status.
fn views(
    parallel_queues: usize,
    nonempty: impl Iterator<Item = String>,
    limit: usize,
    ids: &dyn Fn(&str) -> Vec<u64>,
    task: &dyn Fn(u64) -> Result<Option<Task>, crate::store::ReadError>,
    status: &dyn Fn(&str) -> String,
) -> Vec<QueueView> {
    let mut names: Vec<String> = vec![MAIN.to_string()];
    names.extend((0..parallel_queues).map(parallel_queue));
    for q in nonempty {
        if !names.contains(&q) {
            names.push(q);
        }
    }
    names[1..].sort_by(|a, b| natural_cmp(a, b));
    names
        .into_iter()
        .map(|name| {
            let ids = ids(&name);
            let tasks = ids
                .iter()
                .take(limit)
                .map(|id| QueueTask::of(*id, task(*id)))
                .collect();
            QueueView {
                status: status(&name),
                name,
                tasks,
                length: ids.len(),
            }
        })
        .collect()
}

/// The queue set of a data dir that does not exist: `main` and the parallel
/// queues, all empty.
pub fn empty_views(parallel_queues: usize) -> Vec<QueueView> {
    std::iter::once(MAIN.to_string())
        .chain((0..parallel_queues).map(parallel_queue))
        .map(|name| QueueView {
            name,
            status: String::new(),
            tasks: Vec::new(),
            length: 0,
        })
        .collect()
}

/// Queue views to and from JSON (the wire form of `queue list`).
pub fn views_to_json(views: &[QueueView]) -> Value {
    json!(
        views
            .iter()
            .map(|v| json!({"name": v.name, "status": v.status, "tasks": v.tasks, "length": v.length}))
            .collect::<Vec<_>>()
    )
}

pub fn views_from_json(v: &Value) -> Result<Vec<QueueView>, String> {
    let arr = v.as_array().ok_or("queue list: expected an array")?;
    arr.iter()
        .map(|q| {
            let s = |k: &str| {
                q[k].as_str()
                    .map(str::to_string)
                    .ok_or(format!("queue list: missing {k}"))
            };
            let tasks: Vec<QueueTask> = serde_json::from_value(q["tasks"].clone())
                .map_err(|e| format!("queue list: tasks: {e}"))?;
            let length = match &q["length"] {
                Value::Null => tasks.len(),
                n => n.as_u64().ok_or("queue list: length is not a count")? as usize,
            };
            if length < tasks.len() {
                return Err("queue list: length is less than the tasks listed".into());
            }
            Ok(QueueView {
                name: s("name")?,
                status: s("status")?,
                tasks,
                length,
            })
        })
        .collect()
}

fn plural(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {many}")
    }
}

struct Summary {
    main: usize,
    others: usize,
    active: usize,
    empty: usize,
    other_tasks: usize,
}

fn summarize(queues: &[QueueView]) -> Summary {
    let main = queues
        .iter()
        .find(|q| q.name == MAIN)
        .map_or(0, |q| q.length);
    let others: Vec<_> = queues.iter().filter(|q| q.name != MAIN).collect();
    Summary {
        main,
        others: others.len(),
        active: others.iter().filter(|q| q.length > 0).count(),
        empty: others.iter().filter(|q| q.length == 0).count(),
        other_tasks: others.iter().map(|q| q.length).sum(),
    }
}

/// addon-operator's text format.
pub fn render_text(queues: &[QueueView], show_empty: bool) -> String {
    let mut out = String::new();
    for q in queues {
        if q.length == 0 && !show_empty {
            continue;
        }
        out.push_str(&format!(
            "Queue '{}': length {}, status: '{}'\n\n",
            q.name, q.length, q.status
        ));
        for (i, t) in q.tasks.iter().enumerate() {
            out.push_str(&format!("{:2}. {}\n", i + 1, t.description));
        }
        if q.length > q.tasks.len() {
            out.push_str(&format!(
                "... and {} more (queue list --all lists them)\n",
                q.length - q.tasks.len()
            ));
        }
        if q.length > 0 {
            out.push('\n');
        }
    }
    let s = summarize(queues);
    out.push_str("Summary:\n");
    if s.main == 0 {
        out.push_str("- 'main' queue: empty.\n");
    } else {
        out.push_str(&format!(
            "- 'main' queue: {}.\n",
            plural(s.main, "task", "tasks")
        ));
    }
    out.push_str(&format!(
        "- {} ({} active, {} empty): {}.\n",
        plural(s.others, "other queue", "other queues"),
        s.active,
        s.empty,
        plural(s.other_tasks, "task", "tasks")
    ));
    let total = s.main + s.other_tasks;
    if total == 0 {
        out.push_str("- no tasks to handle.\n");
    } else {
        out.push_str(&format!(
            "- total {} to handle.\n",
            plural(total, "task", "tasks")
        ));
    }
    out
}

/// The JSON form: `{"active": [...], "empty": [...], "summary": {...}}`.
pub fn render_json(queues: &[QueueView]) -> serde_json::Value {
    let view = |q: &QueueView| {
        let mut v = json!({
            "name": q.name,
            "tasksCount": q.length,
            "status": q.status,
            "tasks": q.tasks.iter().enumerate()
                .map(|(i, t)| json!({
                    "index": i + 1,
                    "description": t.description,
                    "id": t.id,
                    "kind": t.kind,
                    "name": t.name,
                    "status": t.status,
                    "attempts": t.attempts,
                    "failures": t.failures,
                }))
                .collect::<Vec<_>>(),
        });
        // Only a limited list says how many it lists (see `queue list --all`).
        if q.tasks.len() < q.length {
            v["tasksListed"] = json!(q.tasks.len());
        }
        v
    };
    let s = summarize(queues);
    json!({
        "active": queues.iter().filter(|q| q.length > 0).map(view).collect::<Vec<_>>(),
        "empty": queues.iter().filter(|q| q.length == 0).map(view).collect::<Vec<_>>(),
        "summary": {
            "mainQueueTasks": s.main,
            "otherQueues": {"active": s.active, "empty": s.empty, "tasks": s.other_tasks},
            "totalTasks": s.main + s.other_tasks,
        }
    })
}

/// A stored payload or result as JSON: decoded (inflated within `budget`),
/// or `{"error": ...}` when it cannot be.
fn blob_json(b: &Blob, what: &'static str, budget: &Budget) -> Value {
    match b.to_json(what, budget) {
        Ok(v) => v,
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// The task's fields, with `blob` turning its payload and result into JSON.
fn task_fields(t: &Task, blob: impl Fn(&Blob, &'static str) -> Value) -> Value {
    json!({
        "id": t.id,
        "kind": t.kind,
        "queue": t.queue,
        "name": t.name,
        "description": t.description,
        "weight": t.weight,
        "status": t.status.as_str(),
        "failures": t.failures,
        "attempts": t.attempts,
        "last_failure": t.last_failure,
        "tags": t.tags,
        "target": t.target,
        "compaction_key": t.compaction_key,
        "queued_at": t.queued_at,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "retry_at": t.retry_at,
        "parent": t.parent,
        "children": &*t.children,
        "payload_compressed": t.payload.compressed,
        "payload": blob(&t.payload, "payload"),
        "result": t.result.as_ref().map(|r| blob(r, "result")),
        "ttl_ms": t.ttl_ms,
        // When it expires unless started by then; for a group parent the
        // caller, which can read the children, corrects it (`task_show`).
        "expires_at": crate::ttl::expires_at(t, false),
    })
}

/// A whole task as JSON, payload and result decoded; a payload or result
/// that cannot be decoded shows as `{"error": ...}` instead of failing.
pub fn task_json(t: &Task, budget: &Budget) -> Value {
    task_fields(t, |b, what| blob_json(b, what, budget))
}

/// The wire key of a blob sent compressed.
const GZIP_BASE64: &str = "gzip_base64";

/// [`task_json`] as the daemon sends it (`task_show`), without inflating
/// anything: a payload or result stored compressed goes as
/// `{"gzip_base64": "<the stored gzip bytes, base64>"}`, flagged by
/// `payload_compressed` and `result_compressed`; `max_decompressed` is the
/// daemon's limit. [`task_from_wire`] makes [`task_json`]'s value of it.
pub fn task_wire(t: &Task, budget: &Budget) -> Value {
    let mut j = task_fields(t, |b, what| {
        if b.compressed {
            json!({GZIP_BASE64: BASE64.encode(&b.bytes)})
        } else {
            blob_json(b, what, budget)
        }
    });
    if let Some(m) = j.as_object_mut() {
        let compressed = t.result.as_ref().is_some_and(|r| r.compressed);
        m.insert("result_compressed".into(), json!(compressed));
        m.insert("max_decompressed".into(), json!(budget.max_decompressed));
    }
    j
}

/// What [`task_wire`] sent, as [`task_json`] would have made it: compressed
/// blobs are inflated here (never past the daemon's `max_decompressed`) and
/// the wire-only fields dropped.
pub fn task_from_wire(mut j: Value) -> Value {
    let Some(m) = j.as_object_mut() else {
        return j;
    };
    let budget = Budget {
        max_decompressed: m
            .remove("max_decompressed")
            .and_then(|v| v.as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(Budget::default().max_decompressed),
        ..Budget::default()
    };
    let result_compressed = m.remove("result_compressed") == Some(Value::Bool(true));
    let payload_compressed = m.get("payload_compressed") == Some(&Value::Bool(true));
    for (what, compressed) in [
        ("payload", payload_compressed),
        ("result", result_compressed),
    ] {
        if !compressed {
            continue;
        }
        let bytes = m
            .get(what)
            .and_then(|v| v.get(GZIP_BASE64))
            .and_then(Value::as_str)
            .and_then(|s| BASE64.decode(s).ok());
        let v = match bytes {
            Some(bytes) => blob_json(
                &Blob {
                    compressed: true,
                    bytes,
                },
                what,
                &budget,
            ),
            None => json!({"error": format!("the daemon sent a malformed compressed {what}")}),
        };
        m.insert(what.into(), v);
    }
    j
}

/// A whole task as text, one `key: value` line per field, payload last.
/// `j` is what [`task_json`] made (locally or in a daemon).
pub fn task_text(j: &serde_json::Value, now_ms: u64) -> String {
    let mut out = String::new();
    let order = [
        "id",
        "kind",
        "queue",
        "name",
        "description",
        "weight",
        "status",
        "failures",
        "attempts",
        "last_failure",
        "tags",
        "target",
        "compaction_key",
        "queued_at",
        "started_at",
        "finished_at",
        "retry_at",
        "ttl_ms",
        "expires_at",
        "parent",
        "children",
        "payload_compressed",
    ];
    for k in order {
        let v = &j[k];
        let text = match v {
            serde_json::Value::Null => continue,
            serde_json::Value::Number(n) if k == "ttl_ms" => {
                let ttl = n.as_u64().map(std::time::Duration::from_millis);
                let text = ttl.map_or_else(|| n.to_string(), crate::units::format_duration);
                out.push_str(&format!("ttl: {text}\n"));
                continue;
            }
            serde_json::Value::Number(n)
                if k == "expires_at" && n.as_u64().is_some_and(|ms| ms <= now_ms) =>
            {
                let ms = n.as_u64().unwrap_or_default();
                format!(
                    "{} ({} ago; due to expire: it was not started within its TTL, and a \
                     running daemon expires it at its next step)",
                    format_time(ms),
                    format_age(ms, now_ms)
                )
            }
            serde_json::Value::Number(n) if k.ends_with("_at") => match n.as_u64() {
                Some(ms) if ms <= now_ms => {
                    format!("{} ({} ago)", format_time(ms), format_age(ms, now_ms))
                }
                Some(ms) => format!("{} (in {})", format_time(ms), format_age(now_ms, ms)),
                None => n.to_string(),
            },
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(a) if a.is_empty() => continue,
            other => other.to_string(),
        };
        out.push_str(&format!("{k}: {text}\n"));
    }
    for k in ["payload", "result"] {
        if !j[k].is_null() {
            let pretty = serde_json::to_string_pretty(&j[k]).unwrap_or_default();
            out.push_str(&format!("{k}: {pretty}\n"));
        }
    }
    out
}

/// Where a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    /// In a queue (its position is set).
    Queue,
    /// Live but in no queue: a group child waiting for its parent.
    Waiting,
    /// Finished, in the history.
    History,
}

/// One task as `task list` shows it: plain fields, no payload or result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    pub id: u64,
    pub queue: String,
    pub kind: String,
    pub name: String,
    pub description: Option<String>,
    pub status: String,
    pub place: Place,
    /// 1 for the head of its queue.
    pub position: Option<usize>,
    /// A failed task in the history: it used up its attempts.
    pub dead_letter: bool,
    pub attempts: u32,
    pub failures: u32,
    pub last_failure: Option<String>,
    pub queued_at: u64,
    pub started_at: Option<u64>,
    pub finished_at: Option<u64>,
    pub retry_at: Option<u64>,
    pub parent: Option<u64>,
    pub children: Vec<u64>,
    pub tags: Vec<String>,
    pub target: Option<String>,
    /// Why a waiting task does not run on this node (`for node edge-2`,
    /// `needs tag gpu`; see `routing`); None when it does, or when the node
    /// is not known (no daemon ever ran on the data dir).
    #[serde(default)]
    pub waiting_for: Option<String>,
    /// For a finished task that ran: how long its last attempt took, from
    /// its start by the engine to its end (ms). A task cancelled while it
    /// waited (for its retry, say) finished after that attempt had ended:
    /// its end is then the attempt's log's (`ops::list`).
    #[serde(default)]
    pub took_ms: Option<u64>,
}

impl TaskRow {
    pub fn new(t: Task, place: Place, position: Option<usize>) -> TaskRow {
        TaskRow::of(&t, place, position)
    }

    /// The row of a task it only borrows (its payload and result are not copied).
    pub fn of(t: &Task, place: Place, position: Option<usize>) -> TaskRow {
        TaskRow {
            dead_letter: place == Place::History && t.status == Status::Failed,
            status: t.status.as_str().into(),
            id: t.id,
            queue: t.queue.clone(),
            kind: t.kind.clone(),
            name: t.name.clone(),
            description: t.description.clone(),
            place,
            position,
            attempts: t.attempts,
            failures: t.failures,
            last_failure: t.last_failure.clone(),
            queued_at: t.queued_at,
            started_at: t.started_at,
            finished_at: t.finished_at,
            retry_at: t.retry_at,
            parent: t.parent,
            children: t.children.to_vec(),
            tags: t.tags.clone(),
            target: t.target.clone(),
            waiting_for: None,
            took_ms: match (place, t.started_at, t.finished_at) {
                (Place::History, Some(s), Some(f)) => Some(f.saturating_sub(s)),
                _ => None,
            },
        }
    }

    /// Whether the row has the status word `s` (see `ops::TaskFilter::statuses`).
    pub fn is(&self, s: &str) -> bool {
        match s {
            "dead" => self.dead_letter,
            "waiting" => self.place == Place::Waiting,
            "live" => self.place != Place::History,
            "history" => self.place == Place::History,
            "elsewhere" => self.waiting_for.is_some(),
            status => self.status == status,
        }
    }
}

/// `task list`'s table: one line per task, the columns as wide as their
/// widest cell; the last message is cut to fit `width` (a terminal's), or
/// shown whole when there is no width (a pipe).
pub fn render_task_table(rows: &[TaskRow], now_ms: u64, width: Option<usize>) -> String {
    const HEAD: [&str; 9] = [
        "ID", "QUEUE", "KIND", "NAME", "STATUS", "ATTEMPTS", "FAILURES", "WHEN", "MESSAGE",
    ];
    let cells: Vec<[String; 9]> = rows.iter().map(|r| task_cells(r, now_ms)).collect();
    let mut widths = HEAD.map(str::len);
    for c in &cells {
        for (w, cell) in widths.iter_mut().zip(c.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |c: &[String; 9]| {
        let mut l = String::new();
        for (i, cell) in c.iter().enumerate().take(8) {
            // Numbers right-aligned, text left-aligned.
            match i {
                0 | 5 | 6 => l.push_str(&format!("{:>w$}  ", cell, w = widths[i])),
                _ => l.push_str(&format!("{:<w$}  ", cell, w = widths[i])),
            }
        }
        let room = width.map(|w| w.saturating_sub(l.chars().count()));
        l.push_str(&cut(&c[8], room));
        l.trim_end().to_string() + "\n"
    };
    let mut out = line(&HEAD.map(String::from));
    for c in &cells {
        out.push_str(&line(c));
    }
    out
}

/// The widest a name gets in `task list`'s table.
const NAME_WIDTH: usize = 40;

fn task_cells(r: &TaskRow, now_ms: u64) -> [String; 9] {
    let status = if r.dead_letter {
        "dead".to_string()
    } else if r.place == Place::Waiting {
        "waiting".to_string()
    } else {
        r.status.clone()
    };
    let age = |ms| format_age(ms, now_ms);
    let when = match (r.place, r.took_ms, r.finished_at) {
        (Place::History, Some(took), Some(f)) => format!(
            "{} ago, took {}",
            age(f),
            crate::units::format_duration(std::time::Duration::from_millis(took))
        ),
        (Place::History, _, Some(f)) => format!("{} ago", age(f)),
        (_, Some(s), _) if r.status == "running" => format!("running {}", age(s)),
        (_, _, _) if r.waiting_for.is_some() => match r.position {
            Some(p) => format!("#{p}, {}", r.waiting_for.as_deref().unwrap_or_default()),
            None => r.waiting_for.clone().unwrap_or_default(),
        },
        (Place::Queue, _, _) => match (r.position, r.retry_at) {
            (_, Some(t)) if t > now_ms => format!("retry in {}", format_age(now_ms, t)),
            (Some(1), _) => format!("head, queued {} ago", age(r.queued_at)),
            (Some(p), _) => format!("#{p}, queued {} ago", age(r.queued_at)),
            (None, _) => format!("queued {} ago", age(r.queued_at)),
        },
        _ => format!("queued {} ago", age(r.queued_at)),
    };
    // Long names (a group's lists its children) are cut in the table; the
    // JSON has them whole.
    let name = cut(&r.name, Some(NAME_WIDTH));
    let message = one_line(r.last_failure.as_deref().unwrap_or_default());
    [
        r.id.to_string(),
        r.queue.clone(),
        r.kind.clone(),
        name,
        status,
        r.attempts.to_string(),
        r.failures.to_string(),
        when,
        message,
    ]
}

/// A message on one row: its lines (a group's `Errors:` and one line per
/// failed child) joined with a space, blank ones left out. The table
/// shows this whole into a pipe and cuts it to a terminal's width.
fn one_line(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join(" ")
}

/// `text` cut to `room` characters (with `…` when cut); whole without a limit.
fn cut(text: &str, room: Option<usize>) -> String {
    match room {
        Some(n) if text.chars().count() > n => {
            let mut s: String = text.chars().take(n.saturating_sub(1)).collect();
            s.push('…');
            s
        }
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, status: &str, tasks: &[&str]) -> QueueView {
        QueueView {
            name: name.into(),
            status: status.into(),
            tasks: tasks
                .iter()
                .enumerate()
                .map(|(i, d)| QueueTask {
                    id: i as u64 + 1,
                    description: d.to_string(),
                    kind: String::new(),
                    name: String::new(),
                    status: "queued".into(),
                    attempts: 0,
                    failures: 0,
                })
                .collect(),
            length: tasks.len(),
        }
    }

    /// A queue listed in part says how long it is, how many it leaves out,
    /// and the summary counts every task; JSON says how many it lists.
    #[test]
    fn a_limited_list_counts_what_it_leaves_out() {
        let mut big = q("main", "", &["A:main:a", "B:main:b"]);
        big.length = 1_000_002;
        let text = render_text(&[big.clone()], false);
        assert!(text.starts_with("Queue 'main': length 1000002, status: ''\n\n 1. A:main:a\n 2. B:main:b\n... and 1000000 more (queue list --all lists them)\n\n"), "{text}");
        assert!(text.contains("- 'main' queue: 1000002 tasks."), "{text}");
        let j = render_json(&[big.clone()]);
        assert_eq!(j["active"][0]["tasksCount"], 1_000_002);
        assert_eq!(j["active"][0]["tasksListed"], 2);
        assert_eq!(j["summary"]["totalTasks"], 1_000_002);
        // The wire form keeps the length; a whole list has no tasksListed.
        let back = views_from_json(&views_to_json(&[big.clone()])).unwrap();
        assert_eq!(back[0].length, 1_000_002);
        let whole = q("main", "", &["A:main:a"]);
        assert!(
            render_json(&[whole])["active"][0]
                .get("tasksListed")
                .is_none()
        );
        // A wire form that lists more than its length is refused.
        let mut bad = views_to_json(&[big]);
        bad[0]["length"] = serde_json::json!(1);
        assert!(views_from_json(&bad).is_err());
    }

    #[test]
    fn text_matches_addon_operator() {
        let queues = vec![
            q(
                "main",
                "run first task",
                &[
                    "ModuleRun:main:a:doStartup",
                    "ConvergeModules:main:::Operator-Startup",
                ],
            ),
            q(
                "parallel_queue_0",
                "waiting for task 20s",
                &["ModuleRun:parallel_queue_0:b"],
            ),
            q("parallel_queue_1", "", &[]),
        ];
        let expected = "\
Queue 'main': length 2, status: 'run first task'

 1. ModuleRun:main:a:doStartup
 2. ConvergeModules:main:::Operator-Startup

Queue 'parallel_queue_0': length 1, status: 'waiting for task 20s'

 1. ModuleRun:parallel_queue_0:b

Summary:
- 'main' queue: 2 tasks.
- 2 other queues (1 active, 1 empty): 1 task.
- total 3 tasks to handle.
";
        assert_eq!(render_text(&queues, false), expected);
        assert!(
            render_text(&queues, true)
                .contains("Queue 'parallel_queue_1': length 0, status: ''\n\n")
        );
    }

    #[test]
    fn empty_set_says_so() {
        let queues = vec![q("main", "", &[]), q("parallel_queue_0", "", &[])];
        assert_eq!(
            render_text(&queues, false),
            "Summary:\n- 'main' queue: empty.\n- 1 other queue (0 active, 1 empty): 0 tasks.\n- no tasks to handle.\n"
        );
    }

    #[test]
    fn json_has_the_documented_shape() {
        let queues = vec![
            q("main", "run first task", &["A:main:x"]),
            q("other", "", &[]),
        ];
        let j = render_json(&queues);
        assert_eq!(j["active"][0]["name"], "main");
        assert_eq!(j["active"][0]["tasksCount"], 1);
        assert_eq!(j["active"][0]["tasks"][0]["index"], 1);
        assert_eq!(j["active"][0]["tasks"][0]["description"], "A:main:x");
        assert_eq!(j["empty"][0]["name"], "other");
        assert_eq!(j["summary"]["mainQueueTasks"], 1);
        assert_eq!(j["summary"]["otherQueues"]["empty"], 1);
        assert_eq!(j["summary"]["totalTasks"], 1);
    }

    fn task_with(payload: Value, result: Option<Blob>, budget: &Budget) -> Task {
        let spec = crate::task::TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: "n".into(),
            payload,
            ..Default::default()
        };
        let mut t = spec.into_task(1, budget).unwrap();
        t.result = result;
        t
    }

    /// A multi-line message (a group's `Errors:` list) is one row: whole
    /// into a pipe, lines joined with a space; on a terminal the same text
    /// cut to the width.
    #[test]
    fn a_multi_line_message_stays_on_its_row() {
        let mut t = task_with(json!(null), None, &Budget::default());
        t.id = 4;
        t.status = Status::Failed;
        t.last_failure = Some("Errors:\n- f-a: helm upgrade failed: boom\n\n- f-b: x\n".into());
        let rows = [TaskRow::of(&t, Place::History, None)];
        let pipe = render_task_table(&rows, 10, None);
        let row = pipe.lines().nth(1).unwrap();
        assert!(
            row.ends_with("  Errors: - f-a: helm upgrade failed: boom - f-b: x"),
            "{pipe}"
        );
        assert_eq!(pipe.lines().count(), 2, "{pipe}");
        let head_width = row.len() - "Errors: - f-a: helm upgrade failed: boom - f-b: x".len();
        let tty = render_task_table(&rows, 10, Some(head_width + 12));
        assert!(
            tty.lines().nth(1).unwrap().ends_with("  Errors: - f…"),
            "{tty}"
        );
    }

    /// Through the wire as the socket carries it: one JSON line.
    fn over_the_wire(t: &Task, budget: &Budget) -> Value {
        let line = serde_json::to_string(&task_wire(t, budget)).unwrap();
        task_from_wire(serde_json::from_str(&line).unwrap())
    }

    #[test]
    fn the_wire_form_reads_back_exactly_as_task_json() {
        let b = Budget::default();
        let big = json!(vec!["some status text"; 20_000]);
        let bomb = Blob {
            compressed: true,
            bytes: crate::budget::gzip(&vec![b' '; (64 << 20) + 1]),
        };
        let bad = Blob {
            compressed: true,
            bytes: b"not gzip".to_vec(),
        };
        let cases = [
            task_with(json!({"a": 1}), None, &b),
            task_with(big.clone(), Blob::from_json("result", &big, &b).ok(), &b),
            task_with(
                json!(null),
                Blob::from_json("result", &json!("ok"), &b).ok(),
                &b,
            ),
            task_with(json!({"gzip_base64": "not a blob"}), Some(bomb), &b),
            task_with(json!(1), Some(bad), &b),
        ];
        for t in &cases {
            let local = task_json(t, &b);
            let wire = over_the_wire(t, &b);
            assert_eq!(wire, local);
            assert_eq!(task_text(&wire, 0), task_text(&local, 0));
            assert_eq!(
                serde_json::to_string_pretty(&wire).unwrap(),
                serde_json::to_string_pretty(&local).unwrap()
            );
        }
        assert!(cases[1].payload.compressed);
        assert_eq!(task_json(&cases[1], &b)["result"], big);
        assert!(
            task_json(&cases[3], &b)["result"]["error"]
                .as_str()
                .unwrap()
                .contains("inflates past the 64 MiB decompression limit")
        );
        // The daemon sends the compressed bytes, not the inflated text.
        let sent = serde_json::to_string(&task_wire(&cases[3], &b)).unwrap();
        assert!(sent.len() < 1 << 20, "{} bytes", sent.len());
    }

    #[test]
    fn the_wire_form_uses_the_daemons_limit_and_survives_garbage() {
        // A daemon with a 1 MiB limit: the CLI inflates no more than that.
        let b = Budget {
            compress_over: 1024,
            max_object: 1 << 20,
            max_decompressed: 1 << 20,
        };
        let text = json!("x".repeat(3 << 19));
        let blob = Blob {
            compressed: true,
            bytes: crate::budget::gzip(&serde_json::to_vec(&text).unwrap()),
        };
        let t = task_with(json!(null), Some(blob), &b);
        assert_eq!(
            over_the_wire(&t, &b)["result"]["error"],
            "compressed result inflates past the 1 MiB decompression limit"
        );
        let roomy = Budget {
            max_decompressed: 2 << 20,
            ..b
        };
        assert_eq!(over_the_wire(&t, &roomy)["result"], text);
        for garbage in [
            json!([1, 2]),
            json!({"payload_compressed": true, "payload": 5, "result_compressed": true}),
            json!({"payload_compressed": true, "payload": {"gzip_base64": "@@"}}),
            json!({"max_decompressed": "lots"}),
        ] {
            let _ = task_from_wire(garbage);
        }
        let v =
            task_from_wire(json!({"payload_compressed": true, "payload": {"gzip_base64": "@@"}}));
        assert_eq!(
            v["payload"]["error"],
            "the daemon sent a malformed compressed payload"
        );
    }
}
