//! Expiry in the scheduler's step: the tasks whose TTL ran out by the
//! step's time and that never started end `expired` (see `ttl`), in the
//! step's transaction, before any head starts, so a task past its TTL
//! never starts. No handler and no worker are involved. The store's
//! deadline index (`store/deadlines.rs`) says which tasks are due, so a
//! step reads only those; a due task that cannot expire (its group has
//! started, say) is dropped from the index.

use crate::engine::scheduler::{LOG_TARGET, Scheduler};
use crate::store::{WriteError, WriteTxn};

impl Scheduler {
    /// Expires every due task in `w`. Returns how many tasks expired.
    pub(super) fn expire_due(&mut self, w: &mut WriteTxn<'_>) -> Result<usize, WriteError> {
        let mut n = 0;
        for id in w.due_for_expiry() {
            match w.expire(id) {
                Ok(ids) => {
                    n += ids.len();
                    if let Ok(t) = w.task(id) {
                        log::info!(
                            target: LOG_TARGET,
                            "task {id} {} {} in {} expired: not started within its TTL of {}{}",
                            t.kind,
                            t.name,
                            t.queue,
                            crate::units::format_duration(std::time::Duration::from_millis(
                                t.ttl_ms.unwrap_or_default()
                            )),
                            match ids.len() {
                                1 => String::new(),
                                k => format!(" (with {} waiting children)", k - 1),
                            }
                        );
                    }
                }
                Err(WriteError::WrongState { .. } | WriteError::NoSuchTask(_)) => {
                    w.forget_deadline(id);
                }
                Err(WriteError::Corrupt(c)) => {
                    log::error!(target: LOG_TARGET, "task {id} cannot expire: {c}");
                    w.forget_deadline(id);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}
