//! A group's progress in O(1) of its size: the store keeps a
//! [`GroupView`] per live group (in `Inner::groups`, built from its
//! children the first time the group's progress is asked for) and every
//! transaction keeps them up to date from its events: each event on a
//! child notes the child (`push_event`), [`WriteTxn::group_progress`]
//! brings the group's view up to date with the children this transaction
//! changed, and `commit` does the same for every view. A transaction
//! dropped without committing forgets the views it touched (they are read
//! again when next needed), so a view never holds what was not committed.

use crate::groups::{Child, GroupProgress, GroupView};
use crate::store::error::WriteError;
use crate::store::write::WriteTxn;

impl WriteTxn<'_> {
    /// What group `parent` becomes now (the rules of `groups::progress`),
    /// with this transaction's changes; `child_failures`: the failed
    /// attempts of its children this update is for. Costs O(the names shown
    /// and the standing errors), after one read of every child per group
    /// and process.
    pub fn group_progress(
        &mut self,
        parent: u64,
        child_failures: u32,
    ) -> Result<GroupProgress, WriteError> {
        let (failures, name) = {
            let p = self.live(parent, "update it")?;
            (p.failures, p.name.clone())
        };
        self.track_group(parent)?;
        let changed: Vec<u64> = self
            .group_touched
            .iter()
            .filter(|(p, _)| *p == parent)
            .map(|(_, c)| *c)
            .collect();
        for child in changed {
            let state = self.child_state(child)?;
            if let Some(view) = self.inner().groups.get_mut(&parent) {
                view.set(child, state);
            }
        }
        let view = &self.inner().groups[&parent];
        Ok(view.progress(failures, &name, child_failures))
    }

    /// Builds group `parent`'s view now if the store has none, from what
    /// this transaction sees. A group's dispatch calls it once its children
    /// are placed: they are all in the transaction then, so the view costs
    /// no read of the store (built at the first progress instead, it read
    /// every child again).
    pub fn track_group(&mut self, parent: u64) -> Result<(), WriteError> {
        if !self.inner().groups.contains_key(&parent) {
            let view = self.read_group(parent)?;
            self.inner().groups.insert(parent, view);
            self.groups_built.push(parent);
        }
        Ok(())
    }

    /// Every child of `parent`, read.
    fn read_group(&mut self, parent: u64) -> Result<GroupView, WriteError> {
        let children = self.task(parent)?.children.clone();
        let mut read = Vec::with_capacity(children.len());
        for &child in children.iter() {
            read.push((child, self.child_state(child)?));
        }
        Ok(GroupView::new(read))
    }

    /// Child `id` as this transaction sees it; None when it no longer
    /// exists. An unreadable child is never trusted as finished.
    fn child_state(&mut self, id: u64) -> Result<Option<Child>, WriteError> {
        match self.task(id) {
            Err(WriteError::NoSuchTask(_)) => Ok(None),
            Err(WriteError::Corrupt(c)) => {
                log::error!("a group's child {id} is unreadable: {c}");
                Ok(Some(Child::Corrupt(id)))
            }
            Err(e) => Err(e),
            Ok(_) => {
                let live = self.is_live(id)?;
                Ok(Some(Child::read(self.task(id)?, live)))
            }
        }
    }

    /// At commit: every view brought up to date with the children this
    /// transaction changed; the views of groups that ended (`ended`: the
    /// tasks the events named that are no longer live) dropped.
    pub(super) fn settle_groups(&mut self, named: impl IntoIterator<Item = u64>) {
        let touched = std::mem::take(&mut self.group_touched);
        for (parent, child) in touched {
            if !self.inner().groups.contains_key(&parent) {
                continue;
            }
            match self.child_state(child) {
                Ok(state) => {
                    if let Some(view) = self.inner().groups.get_mut(&parent) {
                        view.set(child, state);
                    }
                }
                Err(_) => {
                    self.inner().groups.remove(&parent);
                }
            }
        }
        for id in named {
            if self.inner().groups.contains_key(&id) && !self.is_live(id).unwrap_or(false) {
                self.inner().groups.remove(&id);
            }
        }
        self.groups_built.clear();
    }

    /// When a transaction is dropped: the views it changed or built are
    /// forgotten.
    pub(super) fn forget_groups(&mut self) {
        let mut parents: Vec<u64> = self.group_touched.iter().map(|(p, _)| *p).collect();
        parents.append(&mut self.groups_built);
        if let Some(inner) = self.inner.as_mut() {
            for p in parents {
                inner.groups.remove(&p);
            }
        }
    }
}
