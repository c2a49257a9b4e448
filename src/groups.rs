//! Same-weight groups (addon-operator's ParallelModuleRun): planning a batch
//! into single tasks and groups, and the rules of a group's progress as its
//! children run ([`progress`]).
//!
//! A batch is ordered by weight (stable; no weight sorts as 0 and never
//! groups). Each run of two or more consecutive specs with the same weight,
//! queue, target and tags becomes a group (so a group is routed as a whole:
//! its parent has its children's target and tags): one parent in that queue, the children waiting
//! outside every queue until the parent reaches the head (see `engine`).
//!
//! Everything here is pure: the engine reads the parent and its children
//! from the store, asks [`progress`] what the parent becomes, and writes it.

use crate::task::{Status, Task, TaskSpec};

/// Orders a batch by weight and groups runs of equal weight in one queue
/// (with the same routing, target and tags, and the same TTL, which is the
/// group's: see `ttl`):
/// each inner list is one step, a single task or (two or more) a group, as
/// indices into `specs` (so errors name the entry without searching for it).
pub fn plan_indices(specs: &[TaskSpec]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].weight.unwrap_or(0));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut run: Vec<usize> = Vec::new();
    for i in order {
        let s = &specs[i];
        let joins = match run.last() {
            Some(&l) => {
                s.weight.is_some()
                    && specs[l].weight == s.weight
                    && specs[l].queue == s.queue
                    && same_routing(&specs[l], s)
                    && specs[l].ttl == s.ttl
            }
            None => false,
        };
        if !joins && !run.is_empty() {
            out.push(std::mem::take(&mut run));
        }
        run.push(i);
    }
    if !run.is_empty() {
        out.push(run);
    }
    out
}

/// Whether two specs are routed alike: the same target nodes and the same
/// tags, in any order and counted once (`edge-1,edge-2` is `edge-2,edge-1`).
fn same_routing(a: &TaskSpec, b: &TaskSpec) -> bool {
    use std::collections::BTreeSet;
    let targets = |s: &TaskSpec| -> BTreeSet<String> {
        crate::routing::targets(s.target.as_deref())
            .into_iter()
            .map(str::to_string)
            .collect()
    };
    let tags = |s: &TaskSpec| -> BTreeSet<String> { s.tags.iter().cloned().collect() };
    targets(a) == targets(b) && tags(a) == tags(b)
}

/// Past this length a group's name lists the first names and how many more,
/// so any group fits the 512-byte limit on task names.
const NAME_LIST_MAX: usize = 400;

/// `Parallel run for a, b, c`.
fn parent_name<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    let total = names.len();
    counted_name(names.into_iter(), total)
}

/// [`parent_name`] of `total` names of which `names` yields the first (it
/// reads only as many as the name shows).
fn counted_name<S: AsRef<str>>(names: impl Iterator<Item = S>, total: usize) -> String {
    let mut list = String::new();
    for (i, n) in names.enumerate() {
        let n = n.as_ref();
        let sep = if i == 0 { "" } else { ", " };
        if list.len() + sep.len() + n.len() > NAME_LIST_MAX {
            list.push_str(&format!(", … and {} more", total - i));
            break;
        }
        list.push_str(sep);
        list.push_str(n);
    }
    format!("Parallel run for {list}")
}

/// `Parallel<Kind>` when the children share a kind and that fits the
/// 64-character limit on kinds, `ParallelRun` otherwise.
pub fn parent_kind(children: &[TaskSpec]) -> String {
    match children.first() {
        Some(f) if children.iter().all(|c| c.kind == f.kind) && f.kind.len() <= 64 - 8 => {
            format!("Parallel{}", f.kind)
        }
        _ => "ParallelRun".to_string(),
    }
}

/// The parent's spec: same queue, weight, target, tags and TTL (a run
/// shares them, see [`plan_indices`]), and the children's shared description.
pub fn parent_spec(children: &[TaskSpec]) -> TaskSpec {
    let first = &children[0];
    let shared = |f: fn(&TaskSpec) -> &Option<String>| {
        let v = f(first);
        children
            .iter()
            .all(|c| f(c) == v)
            .then(|| v.clone())
            .flatten()
    };
    TaskSpec {
        queue: first.queue.clone(),
        kind: parent_kind(children),
        name: parent_name(children.iter().map(|c| c.name.as_str())),
        description: shared(|c| &c.description),
        weight: first.weight,
        payload: serde_json::Value::Null,
        tags: first.tags.clone(),
        // A run is routed alike (`same_routing`): the first's target and
        // tags are every child's, as written first.
        target: first.target.clone(),
        compaction_key: None,
        ttl: first.ttl,
    }
}

/// `Errors:` and one `- name: message` line per child whose last attempt
/// failed; None when no child has a standing error.
fn errors_message<N: AsRef<str>, M: AsRef<str>>(
    failed: impl IntoIterator<Item = (N, M)>,
) -> Option<String> {
    let lines: Vec<String> = failed
        .into_iter()
        .map(|(n, m)| format!("- {}: {}", n.as_ref(), m.as_ref()))
        .collect();
    (!lines.is_empty()).then(|| format!("Errors:\n{}", lines.join("\n")))
}

/// One child of a group as the engine read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Child {
    /// A child whose record could be read.
    Read {
        name: String,
        /// Still live: not in the history yet (where it is in the store,
        /// not its status).
        live: bool,
        status: Status,
        failures: u32,
        last_failure: Option<String>,
    },
    /// A child whose record is corrupt (its id): never trusted as finished.
    Corrupt(u64),
}

impl Child {
    /// What the rules need of a readable child.
    pub fn read(task: &Task, live: bool) -> Child {
        Child::Read {
            name: task.name.clone(),
            live,
            status: task.status,
            failures: task.failures,
            last_failure: task.last_failure.clone(),
        }
    }
}

/// What a group parent becomes (its `group-updated` event), and whether it
/// has ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupProgress {
    pub name: String,
    pub failures: u32,
    /// `Errors:` and one line per child with a standing error.
    pub message: Option<String>,
    /// Set when no child is live: the status the parent goes to the history
    /// with.
    pub finished: Option<Status>,
}

/// The rules of a group's progress, from its parent, its children (in the
/// parent's order; a child that no longer exists is left out) and whether
/// this update is for a failed attempt of a child:
///
/// - the failure count is the parent's, plus one for a failed attempt;
/// - a child has a standing error when it is live and has failed, or
///   finished as a dead letter; each gives a `- name: message` line;
/// - while a child is live (or unreadable, shown as `<corrupt task N>`),
///   the name lists those still live;
/// - when none is, the group has ended: `failed` if any child was a dead
///   letter or was cancelled (the name stays, the errors are kept, a
///   cancelled child's line says `cancelled`), else `succeeded` with the
///   whole group's name and no errors. (A child is cancelled only with its
///   group, whose parent is then cancelled too; a crash in the middle of
///   that is ended by the next open, `store/open.rs` `recover`.)
pub fn progress(parent: &Task, children: &[Child], child_failed: bool) -> GroupProgress {
    let view = GroupView::new(
        children
            .iter()
            .enumerate()
            .map(|(i, c)| (i as u64, Some(c.clone())))
            .collect(),
    );
    view.progress(parent.failures, &parent.name, u32::from(child_failed))
}

/// A group's children as [`progress`] needs them, kept up to date one child
/// at a time: a child's change costs O(log N) and the parent's progress
/// O(the names it shows + the standing errors), not O(N) in the group's
/// size N. (`store` keeps one per live group, see `WriteTxn::group_progress`.)
#[derive(Debug, Clone, Default)]
pub struct GroupView {
    /// Each child by its place in the parent's order; None: it no longer exists.
    children: Vec<Option<Child>>,
    /// A child's place, by id.
    place: std::collections::HashMap<u64, usize>,
    /// The places of the children still live (or unreadable).
    remaining: std::collections::BTreeSet<usize>,
    /// The places of the children with an error line, and its message.
    errors: std::collections::BTreeMap<usize, String>,
    /// Children that ended failed, cancelled or expired.
    dead: usize,
    /// Children that exist.
    present: usize,
}

/// What one child adds to its group's progress (see [`progress`]).
struct Share {
    remaining: bool,
    error: Option<String>,
    dead: bool,
}

fn share(child: &Child) -> Share {
    let Child::Read {
        live,
        status,
        failures,
        last_failure,
        ..
    } = child
    else {
        return Share {
            remaining: true,
            error: None,
            dead: false,
        };
    };
    let live = *live;
    let standing_error = (live && *failures > 0) || (!live && *status == Status::Failed);
    // A child expires only with its parent, so a parent never sees one;
    // if it did, the child ended without running, like a cancelled one.
    let error = match status {
        Status::Cancelled if !live => Some("cancelled".to_string()),
        Status::Expired if !live => Some("expired".to_string()),
        _ if standing_error => last_failure.clone(),
        _ => None,
    };
    Share {
        remaining: live,
        error,
        dead: !live && matches!(status, Status::Failed | Status::Cancelled | Status::Expired),
    }
}

impl GroupView {
    /// The view of children (id, state) in the parent's order.
    pub fn new(children: Vec<(u64, Option<Child>)>) -> GroupView {
        let mut view = GroupView {
            children: vec![None; children.len()],
            ..GroupView::default()
        };
        for (i, (id, child)) in children.into_iter().enumerate() {
            view.place.insert(id, i);
            view.put(i, child);
        }
        view
    }

    /// Whether `id` is one of the group's children.
    pub fn has(&self, id: u64) -> bool {
        self.place.contains_key(&id)
    }

    /// Child `id` is now `child` (None: it no longer exists). Ignored for
    /// a task that is not one of the children.
    pub fn set(&mut self, id: u64, child: Option<Child>) {
        let Some(&i) = self.place.get(&id) else {
            return;
        };
        if let Some(old) = self.children[i].take() {
            let s = share(&old);
            self.remaining.remove(&i);
            self.errors.remove(&i);
            self.dead -= usize::from(s.dead);
            self.present -= 1;
        }
        self.put(i, child);
    }

    fn put(&mut self, i: usize, child: Option<Child>) {
        if let Some(c) = &child {
            let s = share(c);
            if s.remaining {
                self.remaining.insert(i);
            }
            if let Some(m) = s.error {
                self.errors.insert(i, m);
            }
            self.dead += usize::from(s.dead);
            self.present += 1;
        }
        self.children[i] = child;
    }

    fn name_at(&self, i: usize) -> std::borrow::Cow<'_, str> {
        match &self.children[i] {
            Some(Child::Read { name, .. }) => name.as_str().into(),
            Some(Child::Corrupt(id)) => format!("<corrupt task {id}>").into(),
            None => "".into(),
        }
    }

    /// What the parent (with `failures` and `name`) becomes: the rules of
    /// [`progress`], with `child_failures` children's failed attempts since
    /// it was last updated.
    pub fn progress(&self, failures: u32, name: &str, child_failures: u32) -> GroupProgress {
        let failures = failures.saturating_add(child_failures);
        let message = errors_message(
            self.errors
                .iter()
                .map(|(i, m)| (self.name_at(*i), m.as_str())),
        );
        let (name, message, finished) = if !self.remaining.is_empty() {
            let names = self.remaining.iter().map(|i| self.name_at(*i));
            let name = counted_name(names, self.remaining.len());
            (name, message, None)
        } else if self.dead > 0 {
            (name.to_string(), message, Some(Status::Failed))
        } else {
            // Finished: the history shows the whole group again.
            let names = (0..self.children.len())
                .filter(|i| self.children[*i].is_some())
                .map(|i| self.name_at(i));
            let name = counted_name(names, self.present);
            (name, None, Some(Status::Succeeded))
        };
        GroupProgress {
            name,
            failures,
            message,
            finished,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(name: &str, weight: Option<i64>) -> TaskSpec {
        TaskSpec {
            queue: "main".into(),
            kind: "ModuleRun".into(),
            name: name.into(),
            description: Some("doStartup:OperatorStartup".into()),
            weight,
            ..Default::default()
        }
    }

    /// The planned steps, by name.
    fn plan_names(specs: &[TaskSpec]) -> Vec<Vec<&str>> {
        plan_indices(specs)
            .iter()
            .map(|run| run.iter().map(|&i| specs[i].name.as_str()).collect())
            .collect()
    }

    #[test]
    fn equal_weights_group_and_order_is_stable() {
        let specs = vec![
            s("c", Some(20)),
            s("a", Some(10)),
            s("b", Some(10)),
            s("d", Some(20)),
            s("e", Some(30)),
            s("x", None),
            s("y", None),
        ];
        assert_eq!(
            plan_names(&specs),
            vec![
                vec!["x"],
                vec!["y"],
                vec!["a", "b"],
                vec!["c", "d"],
                vec!["e"]
            ]
        );
        assert_eq!(
            plan_indices(&specs),
            vec![vec![5], vec![6], vec![1, 2], vec![0, 3], vec![4]]
        );
    }

    #[test]
    fn different_queues_do_not_group() {
        let mut b = s("b", Some(1));
        b.queue = "other".into();
        assert_eq!(
            plan_names(&[s("a", Some(1)), b]),
            vec![vec!["a"], vec!["b"]]
        );
    }

    #[test]
    fn different_routing_does_not_group_and_the_parent_is_routed_as_its_children() {
        let routed = |name: &str, target: Option<&str>, tags: &[&str]| TaskSpec {
            target: target.map(str::to_string),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            ..s(name, Some(1))
        };
        let specs = [
            routed("a", Some("edge-1"), &["gpu"]),
            routed("b", Some("edge-1"), &["gpu"]),
            routed("c", Some("edge-2"), &["gpu"]),
            routed("d", Some("edge-2"), &[]),
        ];
        assert_eq!(
            plan_names(&specs),
            vec![vec!["a", "b"], vec!["c"], vec!["d"]]
        );
        let p = parent_spec(&specs[..2]);
        assert_eq!(p.target.as_deref(), Some("edge-1"));
        assert_eq!(p.tags, vec!["gpu".to_string()]);
        // The same nodes and tags in another order, or named twice, are the
        // same routing: they group, and the parent has the first's.
        let specs = [
            routed("a", Some("edge-1,edge-2"), &["gpu", "ssd"]),
            routed("b", Some("edge-2,edge-1"), &["ssd", "gpu"]),
            routed("c", Some("edge-2,edge-1,edge-1"), &["gpu", "ssd", "gpu"]),
            routed("d", Some("edge-2"), &["gpu", "ssd"]),
        ];
        assert_eq!(plan_names(&specs), vec![vec!["a", "b", "c"], vec!["d"]]);
        let p = parent_spec(&specs[..3]);
        assert_eq!(p.target.as_deref(), Some("edge-1,edge-2"));
        assert_eq!(p.tags, vec!["gpu".to_string(), "ssd".to_string()]);
    }

    #[test]
    fn an_empty_batch_plans_nothing() {
        assert!(plan_indices(&[]).is_empty());
    }

    #[test]
    fn parent_spec_follows_the_seed() {
        let children = vec![s("echo", Some(5)), s("mcplay", Some(5))];
        let p = parent_spec(&children);
        assert_eq!(p.kind, "ParallelModuleRun");
        assert_eq!(p.name, "Parallel run for echo, mcplay");
        assert_eq!(p.description.as_deref(), Some("doStartup:OperatorStartup"));
        let mut mixed = children.clone();
        mixed[1].kind = "Other".into();
        mixed[1].description = None;
        let p = parent_spec(&mixed);
        assert_eq!(p.kind, "ParallelRun");
        assert_eq!(p.description, None);
    }

    #[test]
    fn a_long_group_name_stays_under_the_name_limit() {
        let names: Vec<String> = (0..100).map(|i| format!("module-number-{i}")).collect();
        let name = parent_name(names.iter().map(String::as_str));
        assert!(name.len() <= 512, "{} bytes", name.len());
        assert!(name.starts_with("Parallel run for module-number-0, module-number-1, "));
        assert!(name.ends_with(" more"), "{name}");
        let specs: Vec<TaskSpec> = names.iter().map(|n| s(n, Some(1))).collect();
        assert!(parent_spec(&specs).validate().is_ok());
    }

    #[test]
    fn errors_message_lists_failed_children() {
        assert_eq!(errors_message::<&str, &str>([]), None);
        assert_eq!(
            errors_message([("echo", "boom"), ("mcplay", "bang")]).unwrap(),
            "Errors:\n- echo: boom\n- mcplay: bang"
        );
    }

    fn parent(failures: u32) -> Task {
        let children = [s("a", Some(1)), s("b", Some(1)), s("c", Some(1))];
        let mut p = parent_spec(&children)
            .into_task(0, &crate::budget::Budget::default())
            .unwrap();
        p.failures = failures;
        p
    }

    fn child(name: &str, live: bool, status: Status, last_failure: Option<&str>) -> Child {
        Child::Read {
            name: name.into(),
            live,
            status,
            failures: u32::from(last_failure.is_some()),
            last_failure: last_failure.map(str::to_string),
        }
    }

    #[test]
    fn a_running_group_names_its_live_children_and_their_errors() {
        let p = parent(0);
        let children = [
            child("a", false, Status::Succeeded, None),
            child("b", true, Status::Queued, Some("boom")),
            child("c", true, Status::Running, None),
        ];
        let g = progress(&p, &children, true);
        assert_eq!(
            g,
            GroupProgress {
                name: "Parallel run for b, c".into(),
                failures: 1,
                message: Some("Errors:\n- b: boom".into()),
                finished: None,
            }
        );
        // A child's success counts no failure; a child that succeeded after
        // failing has no standing error.
        let children = [
            child("a", false, Status::Succeeded, Some("old")),
            child("b", true, Status::Queued, None),
        ];
        let g = progress(&parent(3), &children, false);
        assert_eq!((g.name.as_str(), g.failures), ("Parallel run for b", 3));
        assert_eq!((g.message, g.finished), (None, None));
    }

    #[test]
    fn a_group_whose_children_all_succeeded_ends_with_its_whole_name() {
        let mut p = parent(2);
        p.name = "Parallel run for c".into();
        let children = [
            child("a", false, Status::Succeeded, None),
            child("b", false, Status::Succeeded, Some("once")),
            child("c", false, Status::Succeeded, None),
        ];
        assert_eq!(
            progress(&p, &children, false),
            GroupProgress {
                name: "Parallel run for a, b, c".into(),
                failures: 2,
                message: None,
                finished: Some(Status::Succeeded),
            }
        );
        // Children that no longer exist are left out of the name.
        let g = progress(&p, &children[1..], false);
        assert_eq!(g.name, "Parallel run for b, c");
        // No child left at all: the group has ended too.
        let g = progress(&p, &[], false);
        assert_eq!(g.finished, Some(Status::Succeeded));
    }

    #[test]
    fn a_dead_letter_child_fails_the_group_and_keeps_its_name_and_errors() {
        let mut p = parent(4);
        p.name = "Parallel run for b".into();
        let children = [
            child("a", false, Status::Succeeded, None),
            child("b", false, Status::Failed, Some("gave up")),
            child("c", false, Status::Failed, Some("also")),
        ];
        assert_eq!(
            progress(&p, &children, true),
            GroupProgress {
                name: "Parallel run for b".into(),
                failures: 5,
                message: Some("Errors:\n- b: gave up\n- c: also".into()),
                finished: Some(Status::Failed),
            }
        );
    }

    #[test]
    fn a_cancelled_child_fails_the_group() {
        let children = [
            child("a", false, Status::Succeeded, None),
            child("b", false, Status::Cancelled, Some("old failure")),
        ];
        let g = progress(&parent(0), &children, false);
        assert_eq!(g.finished, Some(Status::Failed));
        assert_eq!(g.message.as_deref(), Some("Errors:\n- b: cancelled"));
    }

    #[test]
    fn an_unreadable_child_keeps_the_group_waiting_and_shows_in_its_name() {
        let children = [
            child("a", false, Status::Failed, Some("gave up")),
            Child::Corrupt(7),
            child("c", false, Status::Succeeded, None),
        ];
        let g = progress(&parent(0), &children, false);
        assert_eq!(g.name, "Parallel run for <corrupt task 7>");
        assert_eq!(g.message.as_deref(), Some("Errors:\n- a: gave up"));
        assert_eq!(g.finished, None);
    }

    #[test]
    fn a_child_read_from_its_task_keeps_what_the_rules_need() {
        let mut t = parent(2);
        t.last_failure = Some("boom".into());
        t.status = Status::Running;
        assert_eq!(
            Child::read(&t, true),
            Child::Read {
                name: "Parallel run for a, b, c".into(),
                live: true,
                status: Status::Running,
                failures: 2,
                last_failure: Some("boom".into()),
            }
        );
    }

    /// A view changed one child at a time says what `progress` says of the
    /// same children read whole, at every change (removed children, corrupt
    /// ones, every status, long groups whose names are cut).
    #[test]
    fn a_view_kept_one_child_at_a_time_agrees_with_the_whole_rules() {
        let statuses = [
            Status::Queued,
            Status::Running,
            Status::Succeeded,
            Status::Failed,
            Status::Cancelled,
            Status::Expired,
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for size in [1usize, 3, 40, 300] {
            let mut kids: Vec<Option<Child>> = (0..size)
                .map(|i| Some(child(&format!("child-{i}"), true, Status::Queued, None)))
                .collect();
            let mut view = GroupView::new(
                kids.iter()
                    .enumerate()
                    .map(|(i, c)| (100 + i as u64, c.clone()))
                    .collect(),
            );
            let p = parent(1);
            for _ in 0..4 * size {
                let i = next(size as u64) as usize;
                let new = match next(10) {
                    0 => None,
                    1 => Some(Child::Corrupt(100 + i as u64)),
                    _ => Some(Child::Read {
                        name: format!("child-{i}"),
                        live: next(2) == 0,
                        status: statuses[next(6) as usize],
                        failures: next(3) as u32,
                        last_failure: (next(2) == 0).then(|| format!("err {i}")),
                    }),
                };
                kids[i] = new.clone();
                view.set(100 + i as u64, new);
                let whole: Vec<Child> = kids.iter().flatten().cloned().collect();
                let failed = next(2) == 0;
                assert_eq!(
                    view.progress(p.failures, &p.name, u32::from(failed)),
                    progress(&p, &whole, failed)
                );
            }
            assert!(!view.has(99) && view.has(100));
        }
    }
}
