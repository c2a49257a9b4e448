//! Same-weight groups (addon-operator's ParallelModuleRun): planning a batch
//! into single tasks and groups, and the parent's name and error message as
//! its children progress.
//!
//! A batch is ordered by weight (stable; no weight sorts as 0 and never
//! groups). Each run of two or more consecutive specs with the same weight
//! and queue becomes a group: one parent in that queue, the children waiting
//! outside every queue until the parent reaches the head (see `engine`).

use crate::task::TaskSpec;

/// One step of a planned batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    Single(TaskSpec),
    Group(Vec<TaskSpec>),
}

/// Orders specs by weight and groups runs of equal weight in one queue.
pub fn plan(mut specs: Vec<TaskSpec>) -> Vec<Entry> {
    specs.sort_by_key(|s| s.weight.unwrap_or(0));
    let mut out: Vec<Entry> = Vec::new();
    let mut run: Vec<TaskSpec> = Vec::new();
    let flush = |run: &mut Vec<TaskSpec>, out: &mut Vec<Entry>| match run.len() {
        0 => {}
        1 => out.push(Entry::Single(run.remove(0))),
        _ => out.push(Entry::Group(std::mem::take(run))),
    };
    for s in specs {
        let joins = match run.last() {
            Some(last) => s.weight.is_some() && last.weight == s.weight && last.queue == s.queue,
            None => false,
        };
        if !joins {
            flush(&mut run, &mut out);
        }
        run.push(s);
    }
    flush(&mut run, &mut out);
    out
}

/// Like [`plan`], but on indices into `specs` (for error messages that name
/// the entry without searching for it).
pub fn plan_indices(specs: &[TaskSpec]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by_key(|&i| specs[i].weight.unwrap_or(0));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut run: Vec<usize> = Vec::new();
    for i in order {
        let s = &specs[i];
        let joins = match run.last() {
            Some(&l) => {
                s.weight.is_some() && specs[l].weight == s.weight && specs[l].queue == s.queue
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

/// `Parallel run for a, b, c`.
/// Past this length a group's name lists the first names and how many more,
/// so any group fits the 512-byte limit on task names.
const NAME_LIST_MAX: usize = 400;

pub fn parent_name<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    let mut list = String::new();
    for (i, n) in names.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        if list.len() + sep.len() + n.len() > NAME_LIST_MAX {
            list.push_str(&format!(", … and {} more", names.len() - i));
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

/// The parent's spec: same queue and weight, shared description and target.
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
        tags: Vec::new(),
        target: shared(|c| &c.target),
        compaction_key: None,
    }
}

/// `Errors:` and one `- name: message` line per child whose last attempt
/// failed; None when no child has a standing error.
pub fn errors_message<'a>(failed: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<String> {
    let lines: Vec<String> = failed
        .into_iter()
        .map(|(n, m)| format!("- {n}: {m}"))
        .collect();
    (!lines.is_empty()).then(|| format!("Errors:\n{}", lines.join("\n")))
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

    fn names(e: &Entry) -> Vec<&str> {
        match e {
            Entry::Single(s) => vec![s.name.as_str()],
            Entry::Group(g) => g.iter().map(|s| s.name.as_str()).collect(),
        }
    }

    #[test]
    fn equal_weights_group_and_order_is_stable() {
        let plan = plan(vec![
            s("c", Some(20)),
            s("a", Some(10)),
            s("b", Some(10)),
            s("d", Some(20)),
            s("e", Some(30)),
            s("x", None),
            s("y", None),
        ]);
        let got: Vec<_> = plan.iter().map(names).collect();
        assert_eq!(
            got,
            vec![
                vec!["x"],
                vec!["y"],
                vec!["a", "b"],
                vec!["c", "d"],
                vec!["e"]
            ]
        );
        assert!(matches!(plan[2], Entry::Group(_)));
        assert!(matches!(plan[4], Entry::Single(_)));
    }

    #[test]
    fn different_queues_do_not_group() {
        let mut b = s("b", Some(1));
        b.queue = "other".into();
        let plan = plan(vec![s("a", Some(1)), b]);
        assert_eq!(plan.len(), 2);
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
        assert_eq!(errors_message([]), None);
        assert_eq!(
            errors_message([("echo", "boom"), ("mcplay", "bang")]).unwrap(),
            "Errors:\n- echo: boom\n- mcplay: bang"
        );
    }
}
