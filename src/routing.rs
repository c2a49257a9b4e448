//! Routing (Tendrl's targeted jobs): which tasks run on this node.
//!
//! A task runs on a daemon only if
//!
//! 1. its target is empty, or names this node: a task's target is a list of
//!    node names (stored comma-joined in `Task::target`, as node names
//!    cannot hold a comma), and any one of them will do; a daemon without a
//!    `node` name runs no targeted task; and
//! 2. every one of its tags is among the node's tags (a task without tags
//!    needs none).
//!
//! A task that is not for this node is never started here and never blocks
//! its queue: the engine's head of a queue is the first task in it that is
//! for this node (see `engine/dispatch.rs`), and the others keep their
//! places and their order. Nothing here changes a task: a task's target and
//! tags are set when it is enqueued and never change, so a verdict holds for
//! the life of a daemon.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

use crate::task::Task;

/// This node, as routing sees it: its name and its tags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Node {
    pub name: Option<String>,
    pub tags: Vec<String>,
}

/// Why a task does not run on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotHere {
    /// It is targeted at other nodes (these).
    ForNodes(Vec<String>),
    /// It needs tags this node does not have (these).
    NeedsTags(Vec<String>),
}

impl std::fmt::Display for NotHere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (one, many, list) = match self {
            NotHere::ForNodes(l) => ("for node", "for nodes", l),
            NotHere::NeedsTags(l) => ("needs tag", "needs tags", l),
        };
        let word = if list.len() == 1 { one } else { many };
        write!(f, "{word} {}", list.join(", "))
    }
}

/// The separator of a stored target list.
pub const TARGET_SEPARATOR: char = ',';

/// The node names of a stored target (`None` or empty: no target).
pub fn targets(target: Option<&str>) -> Vec<&str> {
    target
        .map(|t| {
            t.split(TARGET_SEPARATOR)
                .filter(|n| !n.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

impl Node {
    /// Whether `task` runs on this node; if not, why not.
    pub fn accepts(&self, task: &Task) -> Result<(), NotHere> {
        self.check(task.target.as_deref(), &task.tags)
    }

    /// [`Node::accepts`] on a target and tags.
    pub fn check(&self, target: Option<&str>, tags: &[String]) -> Result<(), NotHere> {
        let names = targets(target);
        if !names.is_empty() && !names.iter().any(|n| Some(*n) == self.name.as_deref()) {
            return Err(NotHere::ForNodes(
                names.into_iter().map(str::to_string).collect(),
            ));
        }
        let missing: Vec<String> = tags
            .iter()
            .filter(|t| !self.tags.contains(t))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(NotHere::NeedsTags(missing));
        }
        Ok(())
    }

    /// Whether a task with this target is meant for node `name` (the
    /// `task list --target` filter): its target names it.
    pub fn is_target(target: Option<&str>, name: &str) -> bool {
        targets(target).contains(&name)
    }
}

/// A spec's `target` in JSON: one node name, or a list of them (stored
/// comma-joined). An empty list is no target.
pub mod target_field {
    use serde::Deserializer;
    use serde::de::{self, SeqAccess, Visitor};

    struct Target;

    impl<'de> Visitor<'de> for Target {
        type Value = Option<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a node name or a list of node names")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(Target)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut names: Vec<String> = Vec::new();
            while let Some(n) = seq.next_element::<String>()? {
                if n.contains(',') {
                    return Err(de::Error::custom(format!(
                        "target node '{n}' has a comma; give each node as its own list entry"
                    )));
                }
                names.push(n);
            }
            Ok((!names.is_empty()).then(|| names.join(",")))
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_option(Target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: Option<&str>, tags: &[&str]) -> Node {
        Node {
            name: name.map(str::to_string),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        }
    }

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn targets_name_any_of_their_nodes() {
        let n = node(Some("edge-1"), &[]);
        assert_eq!(n.check(None, &[]), Ok(()));
        assert_eq!(n.check(Some(""), &[]), Ok(()));
        assert_eq!(n.check(Some("edge-1"), &[]), Ok(()));
        assert_eq!(n.check(Some("edge-2,edge-1"), &[]), Ok(()));
        let e = n.check(Some("edge-2"), &[]).unwrap_err();
        assert_eq!(e.to_string(), "for node edge-2");
        let e = n.check(Some("edge-2,edge-3"), &[]).unwrap_err();
        assert_eq!(e.to_string(), "for nodes edge-2, edge-3");
        // A node without a name runs no targeted task.
        let e = node(None, &[]).check(Some("edge-1"), &[]).unwrap_err();
        assert_eq!(e, NotHere::ForNodes(vec!["edge-1".into()]));
    }

    #[test]
    fn every_tag_must_be_the_nodes() {
        let n = node(Some("edge-1"), &["gluster", "ssd"]);
        assert_eq!(n.check(None, &tags(&["ssd"])), Ok(()));
        assert_eq!(n.check(None, &tags(&["ssd", "gluster"])), Ok(()));
        let e = n.check(None, &tags(&["ssd", "gpu"])).unwrap_err();
        assert_eq!(e.to_string(), "needs tag gpu");
        let e = node(None, &[]).check(None, &tags(&["a", "b"])).unwrap_err();
        assert_eq!(e.to_string(), "needs tags a, b");
        // The target is checked first.
        let e = n.check(Some("edge-2"), &tags(&["gpu"])).unwrap_err();
        assert_eq!(e.to_string(), "for node edge-2");
    }

    #[test]
    fn a_spec_target_is_a_name_or_a_list() {
        #[derive(serde::Deserialize)]
        struct S {
            #[serde(default, with = "target_field")]
            target: Option<String>,
        }
        let t = |j: &str| serde_json::from_str::<S>(j).map(|s| s.target);
        assert_eq!(t(r#"{"target":"edge-1"}"#).unwrap(), Some("edge-1".into()));
        assert_eq!(
            t(r#"{"target":["edge-1","edge-2"]}"#).unwrap(),
            Some("edge-1,edge-2".into())
        );
        assert_eq!(t(r#"{"target":[]}"#).unwrap(), None);
        assert_eq!(t(r#"{"target":null}"#).unwrap(), None);
        assert_eq!(t(r#"{}"#).unwrap(), None);
        assert!(t(r#"{"target":3}"#).is_err());
        let e = t(r#"{"target":["a","b,c"]}"#).unwrap_err().to_string();
        assert!(e.contains("target node 'b,c' has a comma"), "{e}");
        assert!(Node::is_target(Some("a,b"), "b"));
        assert!(!Node::is_target(Some("a,b"), "c"));
        assert!(!Node::is_target(None, "a"));
    }
}
