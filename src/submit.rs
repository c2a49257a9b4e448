//! Turning task specs into stored tasks: one spec, or a whole batch all or
//! nothing. Validation and the size budget are checked for every entry before
//! anything is written; errors name the entry's index and field.

use crate::groups;
use crate::store::{Placement, Store, WriteError, WriteTxn};
use crate::task::{TaskBuildError, TaskSpec};

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// A spec broke a rule (bad input: nothing was written).
    #[error("{}field {field}: {reason}", entry.map(|i| format!("entry {i}, ")).unwrap_or_default())]
    Invalid {
        entry: Option<usize>,
        field: &'static str,
        reason: String,
    },
    /// The store refused the write.
    #[error(transparent)]
    Store(#[from] WriteError),
}

impl EnqueueError {
    fn from_build(entry: Option<usize>, e: TaskBuildError) -> Self {
        let field = e.field();
        let reason = match e {
            TaskBuildError::Spec(s) => s.reason,
            TaskBuildError::Budget(b) => b.to_string(),
        };
        EnqueueError::Invalid {
            entry,
            field,
            reason,
        }
    }

    /// Whether the caller's input is at fault (as opposed to the store).
    pub fn is_bad_input(&self) -> bool {
        match self {
            EnqueueError::Invalid { .. } => true,
            EnqueueError::Store(e) => matches!(
                e,
                WriteError::Order(_)
                    | WriteError::Budget(_)
                    | WriteError::Queue(_)
                    | WriteError::NoSuchTask(_)
            ),
        }
    }
}

/// Adds one task at `placement`; returns its id once it is durable.
pub fn enqueue_one(
    store: &Store,
    spec: TaskSpec,
    placement: Placement,
) -> Result<u64, EnqueueError> {
    let task = spec
        .into_task(store.clock().now_ms(), store.budget())
        .map_err(|e| EnqueueError::from_build(None, e))?;
    let mut w = store.write();
    let id = w.enqueue(task, Some(placement))?;
    w.commit()?;
    Ok(id)
}

/// Stages a batch in `w`: every spec is checked first; then the batch is
/// ordered by weight and each run of equal weight in one queue becomes a
/// group (see [`groups`](crate::groups)). Returns the ids of the tasks added
/// to queues (singles and group parents), in queue order.
pub fn stage_batch(
    w: &mut WriteTxn<'_>,
    store: &Store,
    specs: Vec<TaskSpec>,
) -> Result<Vec<u64>, EnqueueError> {
    let now = store.clock().now_ms();
    for (i, s) in specs.iter().enumerate() {
        s.validate()
            .map_err(|e| EnqueueError::from_build(Some(i), e.into()))?;
    }
    let plan = groups::plan_indices(&specs);
    let mut slots: Vec<Option<TaskSpec>> = specs.into_iter().map(Some).collect();
    let mut take = |i: usize| slots[i].take().expect("each index planned once");
    let build = |i: usize, spec: TaskSpec| {
        spec.into_task(now, store.budget())
            .map_err(|e| EnqueueError::from_build(Some(i), e))
    };
    let mut ids = Vec::new();
    for run in plan {
        if run.len() == 1 {
            let i = run[0];
            ids.push(w.enqueue(build(i, take(i))?, Some(Placement::Last))?);
            continue;
        }
        let children: Vec<(usize, TaskSpec)> = run.iter().map(|&i| (i, take(i))).collect();
        let child_specs: Vec<TaskSpec> = children.iter().map(|(_, s)| s.clone()).collect();
        let mut parent = build(children[0].0, groups::parent_spec(&child_specs))?;
        parent.id = w.allocate_id();
        for (i, child) in children {
            let mut t = build(i, child)?;
            t.parent = Some(parent.id);
            parent.children.push(w.enqueue(t, None)?);
        }
        ids.push(w.enqueue(parent, Some(Placement::Last))?);
    }
    Ok(ids)
}

/// Adds a batch, all or nothing.
pub fn enqueue_batch(store: &Store, specs: Vec<TaskSpec>) -> Result<Vec<u64>, EnqueueError> {
    let mut w = store.write();
    let ids = stage_batch(&mut w, store, specs)?;
    w.commit()?;
    Ok(ids)
}

/// Parses a batch file's text: a JSON array of specs, or `{"tasks": [...]}`.
/// Errors name the entry and, where serde knows it, the field.
pub fn parse_batch(text: &str) -> Result<Vec<TaskSpec>, String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let entries = match doc {
        serde_json::Value::Array(a) => a,
        serde_json::Value::Object(mut o) => {
            if let Some(k) = o.keys().find(|k| k.as_str() != "tasks") {
                return Err(format!("unknown field `{k}` (expected `tasks`)"));
            }
            match o.remove("tasks") {
                Some(serde_json::Value::Array(a)) => a,
                Some(_) => return Err("field `tasks` must be an array of task specs".into()),
                None => return Err("missing field `tasks`".into()),
            }
        }
        _ => {
            return Err(
                "expected a JSON array of task specs or an object {\"tasks\": [...]}".into(),
            );
        }
    };
    entries
        .into_iter()
        .enumerate()
        .map(|(i, v)| serde_json::from_value::<TaskSpec>(v).map_err(|e| format!("entry {i}: {e}")))
        .collect()
}
