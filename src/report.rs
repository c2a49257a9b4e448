//! `queue list`: a snapshot of the queue set and its rendering in
//! addon-operator's text format and as JSON.
//!
//! Text, per non-empty queue (all queues with `show_empty`):
//! `Queue 'main': length 31, status: 'run first task'`, a blank line, one
//! `%2d. <description>` line per task, a blank line; then `Summary:` with the
//! main queue, the other queues and the total. `main` comes first, the other
//! queues follow in natural name order (`parallel_queue_2` before `_10`).

use std::cmp::Ordering;

use serde_json::json;

use crate::store::Store;

pub const MAIN: &str = "main";

/// The name of parallel queue `i`.
pub fn parallel_queue(i: usize) -> String {
    format!("parallel_queue_{i}")
}

/// One queue as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueView {
    pub name: String,
    pub status: String,
    /// Task descriptions, head first.
    pub tasks: Vec<String>,
}

/// Orders names digit runs by value: `q2` < `q10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(c), Some(d)) if c.is_ascii_digit() && d.is_ascii_digit() => {
                let xl = x.iter().take_while(|c| c.is_ascii_digit()).count();
                let yl = y.iter().take_while(|c| c.is_ascii_digit()).count();
                let (xn, yn) = (trim_zeros(&x[..xl]), trim_zeros(&y[..yl]));
                let o = xn.len().cmp(&yn.len()).then_with(|| xn.cmp(yn));
                if o != Ordering::Equal {
                    return o;
                }
                x = &x[xl..];
                y = &y[yl..];
            }
            (Some(c), Some(d)) => {
                if c != d {
                    return c.cmp(d);
                }
                x = &x[1..];
                y = &y[1..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|c| **c == b'0').count();
    &d[n.min(d.len().saturating_sub(1))..]
}

/// Reads the queue set from the store: `main`, the parallel queues, and
/// every other non-empty queue. `status` gives each queue's status string.
pub fn snapshot(
    store: &Store,
    parallel_queues: usize,
    status: &dyn Fn(&str) -> String,
) -> Vec<QueueView> {
    let mut names: Vec<String> = vec![MAIN.to_string()];
    names.extend((0..parallel_queues).map(parallel_queue));
    for (q, _) in store.queues() {
        if !names.contains(&q) {
            names.push(q);
        }
    }
    names[1..].sort_by(|a, b| natural_cmp(a, b));
    names
        .into_iter()
        .map(|name| {
            let tasks = store
                .queue_ids(&name)
                .into_iter()
                .map(|id| match store.live_task(id) {
                    Ok(Some(t)) => t.description_line(),
                    Ok(None) => format!("<task {id} is in the queue but its record is missing>"),
                    Err(e) => format!("<corrupt task {id}: {e}>"),
                })
                .collect();
            QueueView {
                status: status(&name),
                name,
                tasks,
            }
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
        .map_or(0, |q| q.tasks.len());
    let others: Vec<_> = queues.iter().filter(|q| q.name != MAIN).collect();
    Summary {
        main,
        others: others.len(),
        active: others.iter().filter(|q| !q.tasks.is_empty()).count(),
        empty: others.iter().filter(|q| q.tasks.is_empty()).count(),
        other_tasks: others.iter().map(|q| q.tasks.len()).sum(),
    }
}

/// addon-operator's text format.
pub fn render_text(queues: &[QueueView], show_empty: bool) -> String {
    let mut out = String::new();
    for q in queues {
        if q.tasks.is_empty() && !show_empty {
            continue;
        }
        out.push_str(&format!(
            "Queue '{}': length {}, status: '{}'\n\n",
            q.name,
            q.tasks.len(),
            q.status
        ));
        for (i, d) in q.tasks.iter().enumerate() {
            out.push_str(&format!("{:2}. {}\n", i + 1, d));
        }
        if !q.tasks.is_empty() {
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
        json!({
            "name": q.name,
            "tasksCount": q.tasks.len(),
            "status": q.status,
            "tasks": q.tasks.iter().enumerate()
                .map(|(i, d)| json!({"index": i + 1, "description": d}))
                .collect::<Vec<_>>(),
        })
    };
    let s = summarize(queues);
    json!({
        "active": queues.iter().filter(|q| !q.tasks.is_empty()).map(view).collect::<Vec<_>>(),
        "empty": queues.iter().filter(|q| q.tasks.is_empty()).map(view).collect::<Vec<_>>(),
        "summary": {
            "mainQueueTasks": s.main,
            "otherQueues": {"active": s.active, "empty": s.empty, "tasks": s.other_tasks},
            "totalTasks": s.main + s.other_tasks,
        }
    })
}

/// A whole task as JSON, payload and result decoded; `corrupt` notes a
/// payload or result that could not be decoded instead of failing.
pub fn task_json(t: &crate::task::Task, budget: &crate::budget::Budget) -> serde_json::Value {
    let decode = |b: &crate::budget::Blob, what| match b.to_json(what, budget) {
        Ok(v) => v,
        Err(e) => json!({"error": e.to_string()}),
    };
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
        "children": t.children,
        "payload_compressed": t.payload.compressed,
        "payload": decode(&t.payload, "payload"),
        "result": t.result.as_ref().map(|r| decode(r, "result")),
    })
}

/// A whole task as text, one `key: value` line per field, payload last.
/// `j` is what [`task_json`] made (locally or in a daemon).
pub fn task_text(j: &serde_json::Value) -> String {
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
        "parent",
        "children",
        "payload_compressed",
    ];
    for k in order {
        let v = &j[k];
        let text = match v {
            serde_json::Value::Null => continue,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, status: &str, tasks: &[&str]) -> QueueView {
        QueueView {
            name: name.into(),
            status: status.into(),
            tasks: tasks.iter().map(|s| s.to_string()).collect(),
        }
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

    #[test]
    fn natural_order_puts_2_before_10() {
        let mut v = vec![
            "parallel_queue_10",
            "parallel_queue_2",
            "alpha",
            "parallel_queue_0",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            vec![
                "alpha",
                "parallel_queue_0",
                "parallel_queue_2",
                "parallel_queue_10"
            ]
        );
    }
}
