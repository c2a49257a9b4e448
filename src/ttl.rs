//! A task's time to live (Tendrl's job TTL): a task not started within its
//! TTL, counted from its `queued_at`, expires: it leaves its queue for the
//! history as `expired` (events `expired`, then `moved-to-history`) and
//! never starts. The rule is here, pure; the store records an expiry
//! (`WriteTxn::expire`) and keeps an index of the deadlines of the tasks
//! that may expire (`store/deadlines.rs`); the engine expires what is due
//! in its step (`engine/expire.rs`).
//!
//! - Only a task that never started expires: `queued`, no attempt yet (a
//!   task that failed and waits for its backoff, repeats, or was retried
//!   has started).
//! - A group's TTL is its parent's (a batch groups only entries with the
//!   same TTL, see `groups`): the parent expires with its children while
//!   none of them has been dispatched; once the group has started, nothing
//!   in it expires. A child never expires on its own.
//! - A task for another node (see `routing`) expires by its TTL too.

use std::time::Duration;

use crate::task::{Status, Task};

/// Parses a TTL (`10m`, `30s`, `1h 30m`): a whole number of milliseconds,
/// at least 1 ms and at most 100 years.
pub fn parse(text: &str) -> Result<Duration, String> {
    let d = crate::units::parse_duration(text)?;
    check(d)?;
    Ok(d)
}

/// Checks a TTL: at least 1 ms, at most [`crate::units::MAX_DURATION`],
/// and a whole number of milliseconds (it is stored as one: `1500us`
/// would be cut to 1 ms).
pub fn check(d: Duration) -> Result<(), String> {
    if d.as_millis() == 0 {
        return Err("must be at least 1ms (a task without a TTL has no `ttl`)".into());
    }
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err("must be a whole number of milliseconds (a TTL is kept in ms)".into());
    }
    if d > crate::units::MAX_DURATION {
        return Err("is longer than 100 years, the longest duration berth takes".into());
    }
    Ok(())
}

/// When the task's TTL runs out (ms since the epoch), if it has one.
pub fn deadline(t: &Task) -> Option<u64> {
    t.ttl_ms.map(|ttl| t.queued_at.saturating_add(ttl))
}

/// Whether the task may still expire by itself, as far as its own record
/// tells: it has a TTL, is `queued`, has never started, and is not a group
/// child. A group parent also needs its group not to have started (see
/// [`group_started`]).
pub fn may_expire(t: &Task) -> bool {
    t.ttl_ms.is_some() && t.status == Status::Queued && t.attempts == 0 && t.parent.is_none()
}

/// Whether a group has started, from what is known of each child: `Some(placed)`
/// for a child that is still live (placed: in a queue) with its record, None
/// for one that is gone or finished. A child that was placed in a queue,
/// has started, or has finished means the group has.
pub fn group_started<'a>(children: impl IntoIterator<Item = Option<(&'a Task, bool)>>) -> bool {
    children.into_iter().any(|c| match c {
        None => true,
        Some((t, placed)) => placed || t.attempts > 0 || t.status != Status::Queued,
    })
}

/// When the task expires if it has not started by then: its deadline if it
/// may still expire (`group_started` says whether its group, if it is a
/// parent, has started).
pub fn expires_at(t: &Task, group_started: bool) -> Option<u64> {
    if may_expire(t) && (t.children.is_empty() || !group_started) {
        deadline(t)
    } else {
        None
    }
}

/// The `ttl` field of a batch entry or a control request: a duration as
/// text (`"10m"`), checked as [`parse`] does.
pub mod spec_field {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(ttl: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match ttl {
            Some(d) => s.serialize_str(&humantime::format_duration(*d).to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => super::parse(&text)
                .map(Some)
                .map_err(|e| serde::de::Error::custom(format!("'{text}': {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::Budget;
    use crate::task::TaskSpec;

    fn task(ttl: Option<&str>) -> Task {
        TaskSpec {
            queue: "main".into(),
            kind: "K".into(),
            name: "n".into(),
            ttl: ttl.map(|t| parse(t).unwrap()),
            ..Default::default()
        }
        .into_task(1_000, &Budget::default())
        .unwrap()
    }

    #[test]
    fn ttls_parse_and_bad_ones_say_why() {
        assert_eq!(parse("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(parse("0s").unwrap_err().contains("at least 1ms"));
        assert!(parse("soon").unwrap_err().contains("not a duration"));
        assert!(parse("200y").unwrap_err().contains("100 years"));
        assert_eq!(parse("1500ms").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("1000us").unwrap(), Duration::from_millis(1));
        for cut in ["1500us", "1ms 1ns", "2500000ns"] {
            assert!(
                parse(cut)
                    .unwrap_err()
                    .contains("whole number of milliseconds"),
                "{cut}"
            );
        }
    }

    #[test]
    fn only_a_queued_task_that_never_started_expires() {
        let t = task(Some("10s"));
        assert_eq!(deadline(&t), Some(11_000));
        assert_eq!(expires_at(&t, false), Some(11_000));
        assert_eq!(expires_at(&task(None), false), None);
        let mut started = t.clone();
        started.attempts = 1; // failed and waits for its backoff, or retried
        assert_eq!(expires_at(&started, false), None);
        let mut child = t.clone();
        child.parent = Some(1);
        assert_eq!(expires_at(&child, false), None);
        let mut parent = t.clone();
        parent.children = vec![2, 3].into();
        assert_eq!(expires_at(&parent, false), Some(11_000));
        assert_eq!(expires_at(&parent, true), None);
    }

    #[test]
    fn a_group_has_started_once_a_child_was_placed_ran_or_finished() {
        let waiting = task(Some("10s"));
        assert!(!group_started([
            Some((&waiting, false)),
            Some((&waiting, false))
        ]));
        assert!(group_started([
            Some((&waiting, false)),
            Some((&waiting, true))
        ]));
        assert!(group_started([Some((&waiting, false)), None]));
        let mut ran = waiting.clone();
        ran.attempts = 1;
        assert!(group_started([Some((&ran, false))]));
    }

    #[test]
    fn the_spec_field_reads_and_writes_durations_as_text() {
        let s: TaskSpec =
            serde_json::from_str(r#"{"queue":"q","kind":"K","name":"n","ttl":"10m"}"#).unwrap();
        assert_eq!(s.ttl, Some(Duration::from_secs(600)));
        let back = serde_json::to_value(&s).unwrap();
        assert_eq!(back["ttl"], "10m");
        let s2: TaskSpec = serde_json::from_value(back).unwrap();
        assert_eq!(s2.ttl, s.ttl);
        let e =
            serde_json::from_str::<TaskSpec>(r#"{"queue":"q","kind":"K","name":"n","ttl":"x"}"#)
                .unwrap_err();
        assert!(e.to_string().contains("'x'"), "{e}");
        let e = serde_json::from_str::<TaskSpec>(r#"{"queue":"q","kind":"K","name":"n","ttl":5}"#)
            .unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
    }
}
