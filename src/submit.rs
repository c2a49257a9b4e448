//! Turning task specs into stored tasks: one spec, or a whole batch all or
//! nothing. Validation and the size budget are checked for every entry before
//! anything is written; errors name the entry's index and field. A spec with
//! a compaction key may merge into a task that waits for the same thing
//! instead (see `compaction`).

use crate::budget::Budget;
use crate::compaction::Compactor;
use crate::groups;
use crate::store::{Placement, Store, WriteError, WriteTxn};
use crate::task::{Task, TaskBuildError, TaskSpec};

/// Which entry of a batch (counted from 1, as people count), of how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub index: usize,
    pub of: usize,
}

impl Entry {
    /// The entry at 0-based `i` of `n`.
    pub fn at(i: usize, n: usize) -> Self {
        Entry { index: i, of: n }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "entry {} of {}", self.index + 1, self.of)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// A spec broke a rule (bad input: nothing was written). `field` is
    /// [`RECORD`] when the task's record as a whole is over the budget.
    #[error("{}{reason}", place(*entry, field))]
    Invalid {
        entry: Option<Entry>,
        field: &'static str,
        reason: String,
    },
    /// The store refused the write.
    #[error(transparent)]
    Store(#[from] WriteError),
}

/// The `field` of an [`EnqueueError::Invalid`] that no one field is at
/// fault for: the task's record, all its fields together, is over
/// `max_object`.
pub const RECORD: &str = "record";

/// `entry 2 of 3, field queue: `, `entry 2 of 3: ` (the whole record),
/// `field queue: `, or nothing.
fn place(entry: Option<Entry>, field: &str) -> String {
    match (entry, field) {
        (Some(e), RECORD) => format!("{e}: "),
        (Some(e), f) => format!("{e}, field {f}: "),
        (None, RECORD) => String::new(),
        (None, f) => format!("field {f}: "),
    }
}

/// `spec` as the task it would store, refused when its record would be
/// over the budget's `max_object`. The record is measured with the
/// largest id and time it could carry, so a spec this takes the store
/// takes too (it checks the record again as it writes).
fn build(spec: TaskSpec, now_ms: u64, budget: &Budget) -> Result<Task, (&'static str, String)> {
    let mut task = spec
        .into_task(now_ms, budget)
        .map_err(|e| (e.field(), reason_of(e)))?;
    let (id, queued_at) = (task.id, task.queued_at);
    (task.id, task.queued_at) = (u64::MAX, u64::MAX);
    let size = crate::codec::encoded_len(&task);
    (task.id, task.queued_at) = (id, queued_at);
    if size > budget.max_object {
        let e = crate::budget::BudgetError::TooLarge {
            what: "record",
            size,
            compressed: task.payload.compressed,
            budget: budget.max_object,
        };
        return Err((
            RECORD,
            format!("{e} (its name, description, payload and other fields together)"),
        ));
    }
    Ok(task)
}

fn reason_of(e: TaskBuildError) -> String {
    match e {
        TaskBuildError::Spec(s) => s.reason,
        TaskBuildError::Budget(b) => b.to_string(),
    }
}

impl EnqueueError {
    fn invalid(entry: Option<Entry>, (field, reason): (&'static str, String)) -> Self {
        EnqueueError::Invalid {
            entry,
            field,
            reason,
        }
    }

    fn from_build(entry: Option<Entry>, e: TaskBuildError) -> Self {
        Self::invalid(entry, (e.field(), reason_of(e)))
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

/// Adds one task at `placement`, or merges it into the task with its
/// compaction key that waits in its queue (which keeps its place); returns
/// the id once it is durable.
pub fn enqueue_one(
    store: &Store,
    spec: TaskSpec,
    placement: Placement,
) -> Result<u64, EnqueueError> {
    let task = build(spec, store.clock().now_ms(), store.budget())
        .map_err(|e| EnqueueError::invalid(None, e))?;
    let mut w = store.write();
    let (id, merged) = match Compactor::new().single(&mut w, &task)? {
        Some(waiting) => {
            let note = merge_note(&task, waiting);
            (merge_quietly(&mut w, waiting, task)?, Some(note))
        }
        None => {
            let placement = w.around_running(&task.queue, placement)?;
            (w.enqueue(task, Some(placement))?, None)
        }
    };
    w.commit()?;
    // Said once it is done: a command without a daemon first tries an
    // enqueue with `--after` or `--before` on a read-only open, whose
    // commit is refused.
    if let Some(note) = merged {
        log::info!("{note}");
    }
    Ok(id)
}

/// What a merge of `task` into `into` is logged as.
fn merge_note(task: &Task, into: u64) -> String {
    format!(
        "{} {} merged into waiting task {into} (compaction key {:?})",
        task.kind,
        task.name,
        task.compaction_key.as_deref().unwrap_or_default()
    )
}

/// Merges `task` (not enqueued) into the waiting task `into`; returns `into`.
fn merge_quietly(w: &mut WriteTxn<'_>, into: u64, task: Task) -> Result<u64, WriteError> {
    w.merge(into, task.payload)?;
    Ok(into)
}

/// [`merge_quietly`], logged as it is staged (a batch's merges).
fn merge(w: &mut WriteTxn<'_>, into: u64, task: Task) -> Result<u64, WriteError> {
    log::info!("{}", merge_note(&task, into));
    merge_quietly(w, into, task)
}

/// Stages a batch in `w`: every spec is checked first; then the batch is
/// ordered by weight and each run of equal weight in one queue becomes a
/// group (see [`crate::groups`]). Entries with compaction keys may
/// merge into waiting tasks (see [`compaction`](crate::compaction)), also
/// into earlier entries of the same batch. Returns the ids of the tasks
/// added to queues (singles and group parents) or merged into, in the
/// batch's order.
pub fn stage_batch(
    w: &mut WriteTxn<'_>,
    store: &Store,
    specs: Vec<TaskSpec>,
) -> Result<Vec<u64>, EnqueueError> {
    let now = store.clock().now_ms();
    let n = specs.len();
    for (i, s) in specs.iter().enumerate() {
        s.validate()
            .map_err(|e| EnqueueError::from_build(Some(Entry::at(i, n)), e.into()))?;
    }
    w.reserve(n);
    let plan = groups::plan_indices(&specs);
    let mut slots: Vec<Option<TaskSpec>> = specs.into_iter().map(Some).collect();
    let mut take = |i: usize| slots[i].take().expect("each index planned once");
    let build = |i: usize, spec: TaskSpec| {
        build(spec, now, store.budget())
            .map_err(|e| EnqueueError::invalid(Some(Entry::at(i, n)), e))
    };
    let mut ids = Vec::new();
    let mut compactor = Compactor::new();
    for run in plan {
        if run.len() == 1 {
            let i = run[0];
            let task = build(i, take(i))?;
            let id = match compactor.single(w, &task)? {
                Some(waiting) => merge(w, waiting, task)?,
                None => {
                    let id = w.enqueue(task.clone(), Some(Placement::Last))?;
                    compactor.added_single(id, &task);
                    id
                }
            };
            ids.push(id);
            continue;
        }
        let children: Vec<(usize, TaskSpec)> = run.iter().map(|&i| (i, take(i))).collect();
        let child_specs: Vec<TaskSpec> = children.iter().map(|(_, s)| s.clone()).collect();
        let mut parent = build(children[0].0, groups::parent_spec(&child_specs))?;
        let mut tasks = Vec::with_capacity(children.len());
        for (i, child) in children {
            tasks.push(build(i, child)?);
        }
        if let Some((waiting, ids_in)) = compactor.group(w, &parent.queue, &tasks)? {
            for (task, into) in tasks.into_iter().zip(ids_in) {
                merge(w, into, task)?;
            }
            ids.push(waiting);
            continue;
        }
        parent.id = w.allocate_id();
        let mut added = Vec::with_capacity(tasks.len());
        for mut t in tasks {
            t.parent = Some(parent.id);
            let id = w.enqueue(t.clone(), None)?;
            added.push((id, t));
        }
        parent.children = added.iter().map(|(id, _)| *id).collect();
        let queue = parent.queue.clone();
        let parent_id = w.enqueue(parent, Some(Placement::Last))?;
        let added: Vec<(u64, &Task)> = added.iter().map(|(id, t)| (*id, t)).collect();
        compactor.added_group(&queue, parent_id, &added);
        ids.push(parent_id);
    }
    Ok(ids)
}

/// Checks specs as enqueueing them would, without a store: every rule and
/// the size budget (errors name the entry of a `batch`, even of one entry,
/// as `stage_batch` does; a single spec's none). A command runs this before
/// it sends or opens anything, so that a refused enqueue changes nothing
/// and says the same with a daemon and without.
pub fn check(specs: &[TaskSpec], budget: &Budget, batch: bool) -> Result<(), EnqueueError> {
    let n = specs.len();
    for (i, spec) in specs.iter().enumerate() {
        let entry = batch.then(|| Entry::at(i, n));
        build(spec.clone(), 0, budget).map_err(|e| EnqueueError::invalid(entry, e))?;
    }
    Ok(())
}

/// Adds a batch, all or nothing.
pub fn enqueue_batch(store: &Store, specs: Vec<TaskSpec>) -> Result<Vec<u64>, EnqueueError> {
    let mut w = store.write();
    let ids = stage_batch(&mut w, store, specs)?;
    w.commit()?;
    Ok(ids)
}

/// Parses a batch file's text: a JSON array of specs, or `{"tasks": [...]}`.
/// Errors name the entry (counted from 1: `entry 2 of 3`) and, where serde
/// knows it, the field.
pub fn parse_batch(text: &str) -> Result<Vec<TaskSpec>, String> {
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    // A `Value` keeps the last of two equal keys: an entry that says its
    // name twice would be taken with the second, where the socket (and a
    // spec read on its own) refuses it.
    if let Some((entry, key)) = duplicate_key(text) {
        let n = match &doc {
            serde_json::Value::Array(a) => a.len(),
            serde_json::Value::Object(o) => o
                .get("tasks")
                .and_then(|t| t.as_array())
                .map_or(0, Vec::len),
            _ => 0,
        };
        return Err(match entry {
            Some(i) => format!("{}: duplicate field `{key}`", Entry::at(i, n)),
            None => format!("duplicate field `{key}`"),
        });
    }
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
    let n = entries.len();
    entries
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_path_to_error::deserialize::<_, TaskSpec>(v).map_err(|e| {
                let entry = Entry::at(i, n);
                match e.path().to_string().as_str() {
                    "." => format!("{entry}: {}", e.inner()),
                    field => format!("{entry}, field {field}: {}", e.inner()),
                }
            })
        })
        .collect()
}

/// The first key that a batch document's object, or one of its entries,
/// holds twice: the entry's 0-based index (`None` for the document's own
/// object) and the key. Payloads are not looked into: they are taken as
/// JSON values everywhere, the last of two equal keys winning.
fn duplicate_key(text: &str) -> Option<(Option<usize>, String)> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use std::cell::RefCell;

    /// What was found, set by the visitor that stops there.
    type Found = RefCell<Option<(Option<usize>, String)>>;

    /// A value at `depth` (0 the document, 1 `tasks` or an entry of an
    /// array, ...); `entry` the entry it is in.
    #[derive(Clone, Copy)]
    struct Level<'f> {
        depth: u8,
        entry: Option<usize>,
        in_tasks: bool,
        found: &'f Found,
    }

    impl<'de> DeserializeSeed<'de> for Level<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Level<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            // Entries: the document's array, or its `tasks`.
            let entries = self.depth == 0 || self.in_tasks;
            let mut i = 0;
            loop {
                let more = match entries {
                    true => seq.next_element_seed(Level {
                        depth: self.depth + 1,
                        entry: Some(i),
                        in_tasks: false,
                        ..self
                    })?,
                    false => seq.next_element::<IgnoredAny>()?.map(|_| ()),
                };
                if more.is_none() {
                    return Ok(());
                }
                i += 1;
            }
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            // The document's object, and each entry's: not deeper.
            let checked = self.depth == 0 || self.entry.is_some() && !self.in_tasks;
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if checked && !seen.insert(key.clone()) {
                    *self.found.borrow_mut() = Some((self.entry, key));
                    return Err(serde::de::Error::custom("a duplicate key"));
                }
                if self.depth == 0 && key == "tasks" {
                    map.next_value_seed(Level {
                        depth: 1,
                        in_tasks: true,
                        ..self
                    })?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(())
        }
    }

    let found: Found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let level = Level {
        depth: 0,
        entry: None,
        in_tasks: false,
        found: &found,
    };
    let _ = level.deserialize(&mut de);
    found.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_twice_in_an_entry_or_the_document_is_refused_and_payloads_are_not_looked_into() {
        let e = parse_batch(
            r#"[{"queue":"main","kind":"K","name":"a"},
                {"queue":"main","kind":"K","name":"b","name":"c"}]"#,
        )
        .unwrap_err();
        assert_eq!(e, "entry 2 of 2: duplicate field `name`");
        let e = parse_batch(r#"{"tasks":[{"queue":"main","queue":"x","kind":"K","name":"a"}]}"#)
            .unwrap_err();
        assert_eq!(e, "entry 1 of 1: duplicate field `queue`");
        let e = parse_batch(r#"{"tasks":[],"tasks":[]}"#).unwrap_err();
        assert_eq!(e, "duplicate field `tasks`");
        // Inside a payload, and in different entries, a key may repeat.
        let specs = parse_batch(
            r#"[{"queue":"main","kind":"K","name":"a","payload":{"x":1,"x":2}},
                {"queue":"main","kind":"K","name":"a","payload":[{"y":1,"y":1}]}]"#,
        )
        .unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].payload, serde_json::json!({"x": 2}));
    }
}
