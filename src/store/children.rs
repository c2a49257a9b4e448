//! A group parent's children list, stored once under `g` ‖ parent id
//! instead of inside the parent's record. The parent's record changes at
//! every step of its group (its name counts the children left); with
//! thousands of children inside it, each step decoded, encoded and wrote
//! them all again (a group of 10,000 ran 2.5 times slower than the same
//! tasks as singles). The list never changes after the enqueue.
//!
//! A stored parent has the children list `[0]` ([`MARKER`]: no task has id
//! 0); readers put the list from its `g` key back ([`join`]). A parent
//! stored whole (by a build before store format 5) is read as it is, and
//! stored apart the next time it is written.

use std::borrow::Cow;

use crate::codec;
use crate::store::keys::{self, CHILDREN};
use crate::task::Task;

/// The children list of a stored parent whose list is under its `g` key.
pub const MARKER: u64 = 0;

/// The `g` key of parent `id`.
pub fn key(id: u64) -> [u8; 9] {
    keys::id_key(CHILDREN, id)
}

/// Whether `t`, as stored, has its children under its `g` key.
pub fn is_apart(t: &Task) -> bool {
    t.children.len() == 1 && t.children[0] == MARKER
}

/// `t` as stored: with the marker for a list of children (which goes
/// under its `g` key: [`list_bytes`]). `stored` encodes it.
pub fn stored_form(t: &Task) -> Cow<'_, Task> {
    if t.children.is_empty() {
        return Cow::Borrowed(t);
    }
    let mut stored = t.clone();
    stored.children = vec![MARKER].into();
    Cow::Owned(stored)
}

/// The bytes of `t`'s `g` key.
pub fn list_bytes(t: &Task) -> Vec<u8> {
    codec::encode(&t.children)
}

/// Puts the children list back into `t`, read as stored, from `list` (the
/// value of its `g` key, looked up only when `t` has the marker). Returns
/// whether the list came from the `g` key.
pub fn join(
    t: &mut Task,
    list: impl FnOnce(&[u8]) -> Result<Option<Vec<u8>>, String>,
) -> Result<bool, String> {
    if !is_apart(t) {
        return Ok(false);
    }
    let k = key(t.id);
    let bytes = list(&k)?
        .ok_or_else(|| format!("its children list ({}) is missing", keys::key_display(&k)))?;
    t.children = codec::decode::<Vec<u64>>(&bytes)
        .map(Into::into)
        .map_err(|e| format!("its children list ({}): {e}", keys::key_display(&k)))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskSpec;

    #[test]
    fn a_parent_is_stored_with_the_marker_and_read_back_whole() {
        let spec = TaskSpec {
            queue: "main".into(),
            kind: "ParallelRun".into(),
            name: "g".into(),
            ..Default::default()
        };
        let mut parent = spec
            .into_task(1, &crate::budget::Budget::default())
            .expect("task");
        parent.id = 7;
        parent.children = (8..1000).collect();
        let mut stored: Task =
            codec::decode(&codec::encode(&*stored_form(&parent))).expect("decode");
        assert!(is_apart(&stored));
        let list = list_bytes(&parent);
        let from_g = join(&mut stored, |k| {
            assert_eq!(k, &key(7)[..]);
            Ok(Some(list.clone()))
        })
        .expect("join");
        assert!(from_g);
        assert_eq!(stored, parent);
        // Without its `g` key the parent is corrupt, not childless.
        let mut alone: Task =
            codec::decode(&codec::encode(&*stored_form(&parent))).expect("decode");
        let e = join(&mut alone, |_| Ok(None)).expect_err("missing list");
        assert!(e.contains("g/7") && e.contains("missing"), "{e}");
        // A task without children, or stored whole, is read as it is.
        let mut whole: Task = codec::decode(&codec::encode(&parent)).expect("decode");
        assert!(!join(&mut whole, |_| panic!("not looked up")).expect("join"));
        assert_eq!(whole, parent);
    }
}
