//! `berth export` and `berth import` (and the daemon's backups, which are
//! exports): which tasks an export takes, and how an import adds them, all
//! in one commit. The file's bytes are `transfer`'s.
//!
//! An export reads the state as of one event (`Store::at_rest`, a
//! lock-free snapshot: commits go on meanwhile) and never writes to the
//! data dir. An import checks the
//! whole file first (format, names, budget, kinds, the size of the one
//! commit), then adds every task with a new id through `WriteTxn::enqueue`
//! (normal `enqueued` events; a finished task then gets its
//! `moved-to-history`), keeping queue order, groups and the history. A
//! group that had been dispatched comes back as one that has not: its
//! parent at the end of its queue, its live children in no queue (see
//! `waits_for_parent`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use serde_json::{Value, json};

use super::list::{Naming, TaskFilter, corrupt, node_of, row_of};
use super::{Ctx, OpError};
use crate::budget::{Blob, Budget, BudgetError};
use crate::codec;
use crate::frame;
use crate::queues::natural_cmp;
use crate::report::Place as RowPlace;
use crate::store::{AtRest, Placement, Store, WriteError};
use crate::task::{Status, Task, TaskSpec};
use crate::transfer::{self, Export, Exported, Place, QueueOrder};
use crate::units::format_size;

/// The message an imported task that was running when it was exported
/// gets (it comes back queued, with one failure more).
pub const INTERRUPTED_BY_EXPORT: &str = "interrupted: it was running when it was exported";

/// Status words that only finished tasks have: they need `--history`.
const FINISHED_WORDS: [&str; 6] = [
    "succeeded",
    "failed",
    "cancelled",
    "expired",
    "dead",
    "history",
];

/// Which tasks an export takes: every live task (queued, running, waiting
/// group children), and with `history` every finished one, then only those
/// in `queues`, with `statuses` (`task list`'s words) and targeted at one of
/// `targets`, if given; every group whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    pub queues: Vec<String>,
    pub statuses: Vec<String>,
    pub history: bool,
    /// Nodes (`task list --target`): only the tasks whose target names one.
    pub targets: Vec<String>,
}

impl Selection {
    fn filter(&self) -> TaskFilter {
        TaskFilter {
            queues: self.queues.clone(),
            statuses: self.statuses.clone(),
            targets: self.targets.clone(),
            ..TaskFilter::default()
        }
    }

    /// Checks the status words (a word for finished tasks needs `history`)
    /// and the names (as `TaskFilter::validate` does).
    pub fn validate(&self) -> Result<(), OpError> {
        self.validate_named(Naming::Flags)
    }

    /// [`Selection::validate`], its errors naming the flags or the
    /// request's fields (`naming`).
    pub fn validate_named(&self, naming: Naming) -> Result<(), OpError> {
        self.filter().validate_named(naming)?;
        if !self.history
            && let Some(w) = self
                .statuses
                .iter()
                .find(|s| FINISHED_WORDS.contains(&s.as_str()))
        {
            return Err(OpError::input(format!(
                "{}: '{w}' selects finished tasks, which an export takes only with {}",
                naming.of("--status", "statuses"),
                naming.of("--history", "history")
            )));
        }
        Ok(())
    }
}

/// What an export wrote, as its wire form says it.
fn summary(export: &Export, bytes: usize, path: &Path) -> Value {
    json!({
        "tasks": export.tasks.len(),
        "queues": export.queues.len(),
        "groups": export.groups(),
        "bytes": bytes,
        "path": path.to_string_lossy(),
    })
}

/// Writes the selected tasks to `path` (absolute; a temporary file in its
/// folder, fsync, rename, mode 0600). Returns `{"tasks", "queues",
/// "groups", "bytes", "path"}`.
pub fn export(ctx: &Ctx<'_>, path: &Path, sel: &Selection) -> Result<Value, OpError> {
    // A command checked it with its flags' names before it sent it.
    sel.validate_named(Naming::Fields(""))?;
    let store = ctx
        .store
        .ok_or_else(|| OpError::runtime("the data dir does not exist"))?;
    check_output(store, path)?;
    let node = node_of(ctx);
    let export = store
        .at_rest(|view| collect(view, sel, node.as_ref()))
        .map_err(corrupt)??;
    let export = Export {
        created_at: store.clock().now_ms(),
        node: node.and_then(|n| n.name),
        ..export
    };
    let bytes = transfer::encode(&export).map_err(|e| match e {
        transfer::FormatError::TooLarge(_) => OpError::input(format!(
            "{}: {e}: export fewer tasks at a time (--queue, --status, --target)",
            path.display()
        )),
        // The store's own tasks do not agree (a damaged data dir).
        e => OpError::runtime(format!("cannot export the data dir's tasks: {e}")),
    })?;
    frame::write_atomic(path, &bytes, 0o600)
        .map_err(|e| OpError::runtime(format!("writing {}: {e}", path.display())))?;
    Ok(summary(&export, bytes.len(), path))
}

/// An export file is named by an absolute path, to export to or import
/// from: a relative one would be taken from wherever the daemon runs, not
/// from where the client is.
fn absolute(path: &Path) -> Result<(), OpError> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    let why = if bytes.is_empty() {
        return Err(OpError::input("the export file's path is empty"));
    } else if !path.is_absolute() {
        "the export file's path must be absolute"
    } else if bytes.contains(&0) {
        "the export file's path contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(OpError::input(format!("{}: {why}", path.display())))
}

/// An export goes to an absolute path in an existing folder, outside the
/// data dir it reads.
fn check_output(store: &Store, path: &Path) -> Result<(), OpError> {
    let bad = |why: String| Err(OpError::input(format!("{}: {why}", path.display())));
    absolute(path)?;
    if path.to_str().is_none() {
        return bad(
            "the export file's path is not valid UTF-8 (requests name files as text)".into(),
        );
    }
    let names_a_folder = path.as_os_str().to_str().is_some_and(|p| p.ends_with('/'));
    let Some(folder) = path
        .parent()
        .filter(|_| path.file_name().is_some() && !names_a_folder)
    else {
        return bad(match names_a_folder {
            true => "names a folder (it ends with '/'), not a file".into(),
            false => "names no file".into(),
        });
    };
    let Ok(folder) = folder.canonicalize() else {
        return bad(format!("the folder {} does not exist", folder.display()));
    };
    if path.is_dir() {
        return bad("is a folder".into());
    }
    if let Some(what) = frame::not_a_regular_file(path) {
        return bad(format!(
            "is {what}; an export replaces only a regular file (it writes a new file and renames \
             it over the old one)"
        ));
    }
    if let Ok(dir) = store.dir().canonicalize()
        && folder.starts_with(&dir)
    {
        return bad(format!(
            "is inside the data dir {}, which an export never writes to",
            store.dir().display()
        ));
    }
    Ok(())
}

/// Reads what `sel` takes from the store at rest, in file order (see
/// `transfer`); `node` says which tasks wait for another node.
fn collect(
    view: &AtRest<'_>,
    sel: &Selection,
    node: Option<&crate::routing::Node>,
) -> Result<Export, OpError> {
    let mut position: HashMap<u64, usize> = HashMap::new();
    for (_, ids) in view.queues() {
        for (i, id) in ids.iter().enumerate() {
            position.insert(*id, i + 1);
        }
    }
    let mut all: BTreeMap<u64, Exported> = BTreeMap::new();
    for t in view.live_tasks() {
        let task = t.map_err(corrupt)?;
        let place = match position.contains_key(&task.id) {
            true => Place::Queue,
            false => Place::Waiting,
        };
        all.insert(task.id, Exported { place, task });
    }
    if sel.history {
        for t in view.history() {
            let task = t.map_err(corrupt)?;
            all.insert(
                task.id,
                Exported {
                    place: Place::History,
                    task,
                },
            );
        }
    }
    let filter = sel.filter();
    let chosen: Vec<u64> = all
        .values()
        .filter(|e| {
            let place = match e.place {
                Place::Queue => RowPlace::Queue,
                Place::Waiting => RowPlace::Waiting,
                Place::History => RowPlace::History,
            };
            filter.selects(&row_of(
                &e.task,
                place,
                position.get(&e.task.id).copied(),
                node,
            ))
        })
        .map(|e| e.task.id)
        .collect();
    // A group goes whole: its parent and every child, finished ones too.
    let mut take: BTreeSet<u64> = BTreeSet::new();
    for id in chosen {
        let root = all[&id].task.parent.unwrap_or(id);
        if take.contains(&root) {
            continue;
        }
        fetch(view, &mut all, root, id)?;
        let children = all[&root].task.children.clone();
        take.insert(root);
        for &c in children.iter() {
            fetch(view, &mut all, c, root)?;
            take.insert(c);
        }
    }
    let mut names: Vec<&String> = view.queues().iter().map(|(q, _)| q).collect();
    names.sort_by(|a, b| natural_cmp(a, b));
    let mut queues = Vec::new();
    let mut tasks = Vec::with_capacity(take.len());
    for name in names {
        let ids: Vec<u64> = view
            .queues()
            .iter()
            .find(|(q, _)| q == name)
            .map(|(_, ids)| ids.iter().copied().filter(|i| take.contains(i)).collect())
            .unwrap_or_default();
        if ids.is_empty() {
            continue;
        }
        for id in &ids {
            if let Some(e) = all.remove(id) {
                tasks.push(e);
            }
        }
        queues.push(QueueOrder {
            name: name.clone(),
            ids,
        });
    }
    for wanted in [Place::Waiting, Place::History] {
        for id in &take {
            if all.get(id).is_some_and(|e| e.place == wanted)
                && let Some(e) = all.remove(id)
            {
                tasks.push(e);
            }
        }
    }
    Ok(Export {
        created_at: 0,
        node: None,
        history: sel.history,
        tasks,
        queues,
    })
}

/// Makes sure group member `id` (of the group `of` belongs to) is in `all`:
/// a finished one is read from the history even without `--history`.
fn fetch(
    view: &AtRest<'_>,
    all: &mut BTreeMap<u64, Exported>,
    id: u64,
    of: u64,
) -> Result<(), OpError> {
    if all.contains_key(&id) {
        return Ok(());
    }
    let (place, task) = match view.live_task(id)? {
        Some(t) => (Place::Waiting, t),
        None => match view.history_task(id)? {
            Some(t) => (Place::History, t),
            None => {
                return Err(OpError::runtime(format!(
                    "task {of}'s group names task {id}, which does not exist; the group cannot \
                     be exported whole"
                )));
            }
        },
    };
    all.insert(id, Exported { place, task });
    Ok(())
}

/// The largest export file `import` reads: its records are at most
/// `transfer::MAX_RAW_BYTES` once inflated, and compression never adds more
/// than a little.
pub const MAX_EXPORT_FILE: u64 = transfer::MAX_RAW_BYTES + (64 << 20);

/// Reads and checks an export file's format; errors name it (`name`) and
/// are bad input.
/// Only a regular file (or a symbolic link to one) is read: a FIFO would
/// block the open until some writer came, and a device or a socket is
/// no export file.
pub fn read_export(path: &Path, name: &str) -> Result<Export, OpError> {
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| OpError::input(format!("cannot read {name}: {e}"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(cannot)?;
    let meta = f.metadata().map_err(cannot)?;
    if let Some(what) = frame::file_kind(meta.file_type()) {
        return Err(cannot(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {what}, not a regular file"),
        )));
    }
    let bytes = read_export_bytes(f, Some(meta.len()), name)?;
    transfer::decode(&bytes).map_err(|e| OpError::input(format!("{name}: {e}")))
}

/// An export file's bytes from `r` (`size`: its length, when it is a
/// regular file), at most [`MAX_EXPORT_FILE`]. Its first bytes are checked
/// before the rest is read (`transfer::check_start`: the magic, the
/// version, the flags, the node name's length), so that what is no export
/// (`/dev/zero`, another file, a stream) is refused at once and not once
/// up to the largest export has been read into memory. Errors name it
/// (`name`) and are bad input.
pub fn read_export_bytes(
    mut r: impl std::io::Read,
    size: Option<u64>,
    name: &str,
) -> Result<Vec<u8>, OpError> {
    use std::io::Read;
    let cannot = |e: std::io::Error| OpError::input(format!("cannot read {name}: {e}"));
    let too_big = || {
        cannot(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {}", format_size(MAX_EXPORT_FILE)),
        ))
    };
    if size.is_some_and(|n| n > MAX_EXPORT_FILE) {
        return Err(too_big());
    }
    let mut start = Vec::with_capacity(transfer::START);
    (&mut r)
        .take(transfer::START as u64)
        .read_to_end(&mut start)
        .map_err(cannot)?;
    transfer::check_start(&start).map_err(|e| OpError::input(format!("{name}: {e}")))?;
    let left = MAX_EXPORT_FILE - start.len() as u64;
    let bytes = match size {
        // A regular file: read into one buffer of its size (it may have
        // grown since: still never past the cap).
        Some(n) => {
            let mut bytes = start;
            bytes.reserve_exact((n as usize).saturating_sub(bytes.len()) + 1);
            r.take(left.saturating_add(1))
                .read_to_end(&mut bytes)
                .map_err(cannot)?;
            bytes
        }
        None => {
            let rest = frame::read_capped(r, left).map_err(|e| match e.kind() {
                std::io::ErrorKind::InvalidData => too_big(),
                _ => cannot(e),
            })?;
            let mut bytes = start;
            bytes.extend_from_slice(&rest);
            bytes
        }
    };
    if bytes.len() as u64 > MAX_EXPORT_FILE {
        return Err(too_big());
    }
    Ok(bytes)
}

/// The spec a task would have been enqueued with (its payload aside), for
/// the rules on names and kinds.
fn spec_of(t: &Task) -> TaskSpec {
    TaskSpec {
        queue: t.queue.clone(),
        kind: t.kind.clone(),
        name: t.name.clone(),
        description: t.description.clone(),
        weight: t.weight,
        payload: Value::Null,
        tags: t.tags.clone(),
        target: t.target.clone(),
        compaction_key: t.compaction_key.clone(),
        ttl: t.ttl_ms.map(std::time::Duration::from_millis),
    }
}

/// A blob must read back within the budget, as JSON.
fn readable(what: &'static str, b: &Blob, budget: &Budget) -> Result<(), BudgetError> {
    let bytes = b.json_bytes(what, budget)?;
    if bytes.len() > budget.max_decompressed {
        return Err(BudgetError::OverReadLimit {
            what,
            size: bytes.len(),
            limit: budget.max_decompressed,
        });
    }
    if bytes.is_empty() {
        return Ok(());
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
        .map(|_| ())
        .map_err(|e| BudgetError::BadJson {
            what,
            reason: e.to_string(),
        })
}

/// The latest time a task in an export made at `created_at` may hold,
/// read at `now_ms`: 100 years (`units::MAX_DURATION`, the longest
/// duration berth takes: a backoff, a delay, a TTL) after the file was
/// made, or after now if the file says it was made later. Every time berth
/// records is the clock's time when it is written (`queued_at`,
/// `started_at`, `finished_at`), or that plus such a duration
/// (`retry_at`), so a later one was not written by berth: a `retry_at` of
/// `u64::MAX` would keep its queue asleep for good.
pub fn latest_time(created_at: u64, now_ms: u64) -> u64 {
    let longest = crate::units::MAX_DURATION.as_millis() as u64;
    created_at.min(now_ms).saturating_add(longest)
}

/// A task's time that is later than [`latest_time`]: its field's name and
/// value.
fn too_late(t: &Task, latest: u64) -> Option<(&'static str, u64)> {
    [
        ("queued_at", Some(t.queued_at)),
        ("started_at", t.started_at),
        ("finished_at", t.finished_at),
        ("retry_at", t.retry_at),
    ]
    .into_iter()
    .find_map(|(field, v)| v.filter(|v| *v > latest).map(|v| (field, v)))
}

/// Checks everything an import needs before it writes: every task's
/// names and text (the rules of an enqueue), its times (at most
/// `latest_time` at `now_ms`), its kind (when `ctx` knows the kinds that
/// can run; a group parent's never runs), its record and blobs against
/// `budget`, and that all of it fits in one commit. Errors name the file
/// (`name`) and the task, and are bad input.
pub fn check_import(
    export: &Export,
    name: &str,
    budget: &Budget,
    ctx: &Ctx<'_>,
    now_ms: u64,
) -> Result<(), OpError> {
    let mut commit = 0usize;
    let latest = latest_time(export.created_at, now_ms);
    for e in &export.tasks {
        let t = &e.task;
        let at = format!("{name}: task {} ({} {}): ", t.id, t.kind, t.name);
        let spec = spec_of(t);
        spec.validate()
            .map_err(|err| OpError::input(format!("{at}{err}")))?;
        if let Some((field, v)) = too_late(t, latest) {
            return Err(OpError::input(format!(
                "{at}its {field} is {v} ms since the epoch, after {}: no time berth records is \
                 more than 100 years after the file was made (or after now, for a file that \
                 says it was made later)",
                crate::units::format_time(latest)
            )));
        }
        // A group parent never runs (its children do): its kind needs no handler.
        if t.children.is_empty() {
            ctx.check_kinds(std::slice::from_ref(&spec), false)
                .map_err(|err| err.context(&at))?;
        }
        let size = codec::encoded_len(t);
        crate::budget::check_record(budget, size, t.payload.compressed, t.result.as_ref())
            .map_err(|err| OpError::input(format!("{at}{err}")))?;
        readable("payload", &t.payload, budget)
            .map_err(|err| OpError::input(format!("{at}{err}")))?;
        if let Some(r) = &t.result {
            readable("result", r, budget).map_err(|err| OpError::input(format!("{at}{err}")))?;
        }
        // The task goes into the commit twice: in its event and its key.
        commit += 2 * size + 64;
    }
    if commit > codec::MAX_RECORD_BYTES {
        return Err(too_big(name, export.tasks.len(), commit));
    }
    Ok(())
}

fn too_big(name: &str, tasks: usize, size: usize) -> OpError {
    OpError::input(format!(
        "{name}: its {tasks} tasks make one commit of {}, and one commit holds at most {}: \
         export fewer at a time (--queue, --status) and import the files one by one",
        format_size(size as u64),
        format_size(codec::MAX_RECORD_BYTES as u64)
    ))
}

/// The task as it is added: its new id and group ids; a task that was
/// running comes back queued, with one failure more; a group child that
/// waits again for its parent (`regroup`) goes back to its parent's queue
/// name, as a child of a group not yet dispatched has.
fn prepared(t: &Task, new_id: &BTreeMap<u64, u64>, regroup: Option<&str>) -> Task {
    let map = |id: u64| new_id.get(&id).copied().unwrap_or(id);
    let mut t = t.clone();
    t.id = map(t.id);
    if let Some(queue) = regroup {
        t.queue = queue.to_string();
    }
    t.parent = t.parent.map(map);
    t.children = t.children.iter().map(|c| map(*c)).collect();
    if t.status == Status::Running {
        t.status = Status::Queued;
        t.failures = t.failures.saturating_add(1);
        t.last_failure = Some(INTERRUPTED_BY_EXPORT.to_string());
        t.retry_at = None;
    }
    t
}

/// The queue of the parent a live group child waits for again after an
/// import: its parent comes back queued (it holds its queue, so its group
/// has not ended), and the group comes back as one not yet dispatched, its
/// parent at the end of its queue and its live children in no queue, to be
/// placed when the parent reaches the head. (A child placed in a parallel
/// queue, running or not, would otherwise start at once, ahead of the tasks
/// the parent now waits behind.) Its finished children stay in the history
/// with their outcome: the dispatch passes over them, as after a restart.
/// None for every other task, which keeps its place: a task in no group,
/// a finished one, a parent, and the child of a parent that is not queued
/// in the file (neither is a state a store exports: such a task keeps its
/// exported place, as before).
fn waits_for_parent<'a>(e: &Exported, by_id: &HashMap<u64, &'a Exported>) -> Option<&'a str> {
    if e.place == Place::History || !e.task.children.is_empty() {
        return None;
    }
    let parent = by_id.get(&e.task.parent?)?;
    (parent.place == Place::Queue).then_some(parent.task.queue.as_str())
}

/// Held by the import that reads and adds its file.
static IMPORTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Adds the tasks of the export file at `path` (named `label` in messages,
/// else by its path) in one commit, all or nothing, with new ids. Returns
/// `{"tasks", "first", "last", "ids": {"OLD": NEW, ...}}`.
pub fn import(ctx: &Ctx<'_>, path: &Path, label: Option<&str>) -> Result<Value, OpError> {
    let name = label.map_or_else(|| path.display().to_string(), str::to_string);
    absolute(path)?;
    // One import at a time holds its file in memory (up to
    // MAX_EXPORT_FILE): a daemon's clients cannot multiply that. Imports
    // write in one commit each anyway.
    let _one = IMPORTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let export = read_export(path, &name)?;
    let store = ctx
        .store
        .ok_or_else(|| OpError::runtime("the data dir does not exist"))?;
    check_import(&export, &name, store.budget(), ctx, store.clock().now_ms())?;
    let by_id: HashMap<u64, &Exported> = export.tasks.iter().map(|e| (e.task.id, e)).collect();
    let mut w = store.write();
    let new_id: BTreeMap<u64, u64> = export
        .tasks
        .iter()
        .map(|e| (e.task.id, w.allocate_id()))
        .collect();
    let stage = |w: &mut crate::store::WriteTxn<'_>| -> Result<(), WriteError> {
        // Queued tasks at the end of their queues, in exported order; a
        // group child whose parent comes back queued is not among them.
        for q in &export.queues {
            for old in &q.ids {
                let Some(e) = by_id.get(old) else { continue };
                if waits_for_parent(e, &by_id).is_none() {
                    w.enqueue(prepared(&e.task, &new_id, None), Some(Placement::Last))?;
                }
            }
        }
        // The children waiting for their parents, in no queue: those that
        // waited already, and those the group had placed (see
        // `waits_for_parent`).
        for e in export.tasks.iter().filter(|e| e.place != Place::History) {
            let regroup = waits_for_parent(e, &by_id);
            if e.place == Place::Waiting || regroup.is_some() {
                w.enqueue(prepared(&e.task, &new_id, regroup), None)?;
            }
        }
        for e in export.tasks.iter().filter(|e| e.place == Place::History) {
            let id = w.enqueue(prepared(&e.task, &new_id, None), None)?;
            w.to_history(id, e.task.status)?;
        }
        Ok(())
    };
    let context = |e: WriteError| match e {
        WriteError::Budget(BudgetError::TooLarge {
            what: "transaction",
            size,
            ..
        }) => too_big(&name, export.tasks.len(), size),
        e => OpError::from(e).context(&format!("{name}: ")),
    };
    stage(&mut w).map_err(context)?;
    w.commit().map_err(context)?;
    ctx.changed();
    let ids: serde_json::Map<String, Value> = new_id
        .iter()
        .map(|(old, new)| (old.to_string(), json!(new)))
        .collect();
    Ok(json!({
        "tasks": export.tasks.len(),
        "first": new_id.values().min(),
        "last": new_id.values().max(),
        "ids": ids,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::list::STATUS_WORDS;

    /// Every status word a live task can have; the others are finished.
    const LIVE_WORDS: [&str; 5] = ["queued", "running", "waiting", "live", "elsewhere"];

    #[test]
    fn every_word_for_finished_tasks_needs_history() {
        for w in STATUS_WORDS {
            let sel = |history| Selection {
                statuses: vec![w.to_string()],
                history,
                ..Selection::default()
            };
            assert!(sel(true).validate().is_ok(), "{w} with history");
            let without = sel(false).validate();
            match LIVE_WORDS.contains(&w) {
                true => assert!(without.is_ok(), "{w}: {without:?}"),
                false => {
                    let e = without.expect_err(w).to_string();
                    assert!(e.contains("only with --history"), "{w}: {e}");
                }
            }
        }
    }
}
