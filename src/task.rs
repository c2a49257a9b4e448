//! The task model: what a task is ([`Task`], as stored), what a user asks for
//! ([`TaskSpec`], as parsed from the CLI or a batch file), and the rules on
//! names. Validation happens here, once, before anything reaches the store.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};
// `Task` is encoded by hand in `codec` (its layout depends on the version).

use crate::budget::{Blob, Budget, BudgetError};

/// Where a task is in its life. See ARCHITECTURE.md for the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Queued,
    Running,
    Succeeded,
    Failed,
    // New variants go last: bincode encodes the variant's position.
    /// Ended by `berth task cancel` (variant 4).
    Cancelled,
    /// Not started within its TTL (variant 5; see `ttl`).
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Expired => "expired",
        }
    }
}

/// A task as stored. Its encoding is written out in `codec` (it depends on
/// the record's version: `ttl_ms` came with version 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// Unique, increasing, never reused.
    pub id: u64,
    pub kind: String,
    /// The queue the task is (or, for a group child not yet dispatched, will be) in.
    pub queue: String,
    pub name: String,
    pub description: Option<String>,
    pub weight: Option<i64>,
    /// JSON, compressed when large.
    pub payload: Blob,
    pub tags: Vec<String>,
    pub target: Option<String>,
    pub compaction_key: Option<String>,
    /// Failed attempts so far.
    pub failures: u32,
    /// Attempts started so far.
    pub attempts: u32,
    pub last_failure: Option<String>,
    pub status: Status,
    /// Milliseconds since the epoch.
    pub queued_at: u64,
    pub started_at: Option<u64>,
    pub finished_at: Option<u64>,
    /// Not to be started before this time (backoff, delays).
    pub retry_at: Option<u64>,
    /// The group parent, for a child.
    pub parent: Option<u64>,
    /// The children, for a group parent.
    pub children: std::sync::Arc<[u64]>,
    /// Output of the last run.
    pub result: Option<Blob>,
    /// The time to live: a task not started within this many milliseconds
    /// of `queued_at` expires (see `ttl`). None: it waits as long as it
    /// takes. (New in record version 2; a version-1 task has none.)
    pub ttl_ms: Option<u64>,
}

impl Task {
    /// addon-operator's description: `Kind:queue:name[:description][:failures N[:message]]`.
    pub fn description_line(&self) -> String {
        let mut s = format!("{}:{}:{}", self.kind, self.queue, self.name);
        if let Some(d) = &self.description {
            s.push(':');
            s.push_str(d);
        }
        if self.failures > 0 {
            s.push_str(&format!(":failures {}", self.failures));
            if let Some(m) = &self.last_failure {
                s.push(':');
                if m.contains('\n') {
                    for line in m.lines() {
                        s.push_str("\n    ");
                        s.push_str(line);
                    }
                    s.push('\n');
                } else {
                    s.push_str(m);
                }
            }
        }
        s
    }
}

/// What a user asks to enqueue. Field names are those of batch files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub queue: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
    #[serde(default)]
    pub payload: serde_json::Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The node, or nodes, that may run the task: one name, or (in JSON) a
    /// list of names, kept comma-joined (see `routing`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::routing::target_field::deserialize"
    )]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction_key: Option<String>,
    /// The time to live: not started within it (from the enqueue), the
    /// task expires (see `ttl`). Written as a duration (`"10m"`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::ttl::spec_field"
    )]
    pub ttl: Option<std::time::Duration>,
}

/// A spec that broke a rule: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SpecError {
    pub field: &'static str,
    pub reason: String,
}

fn spec_err(field: &'static str, reason: impl Into<String>) -> SpecError {
    SpecError {
        field,
        reason: reason.into(),
    }
}

/// Checks a queue (or tag, kind, node) name: `[A-Za-z0-9_.-]{1,64}`.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!(
            "{what} '{name}' must be 1 to 64 characters long (it is {})",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "{what} '{}' has the character {c:?}; only A-Z a-z 0-9 _ . - are allowed",
            name.escape_debug()
        ));
    }
    Ok(())
}

/// The longest task name, in bytes.
pub const MAX_NAME: usize = 512;

/// Checks free text (a task name or description): non-empty when required,
/// at most `max` bytes, no control characters.
fn check_text(
    field: &'static str,
    text: &str,
    required: bool,
    max: usize,
) -> Result<(), SpecError> {
    if required && text.is_empty() {
        return Err(spec_err(field, "must not be empty"));
    }
    if text.len() > max {
        return Err(spec_err(
            field,
            format!("is {} bytes; at most {max} are allowed", text.len()),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(spec_err(
            field,
            "must not contain control characters (newlines, tabs, ...)",
        ));
    }
    Ok(())
}

impl TaskSpec {
    /// Checks every field; the error names the field.
    pub fn validate(&self) -> Result<(), SpecError> {
        check_name("queue", &self.queue).map_err(|r| spec_err("queue", r))?;
        check_name("kind", &self.kind).map_err(|r| spec_err("kind", r))?;
        check_text("name", &self.name, false, MAX_NAME)?;
        if let Some(d) = &self.description {
            check_text("description", d, false, 1024)?;
        }
        if self.tags.len() > 64 {
            return Err(spec_err("tags", "at most 64 tags are allowed"));
        }
        for t in &self.tags {
            check_name("tag", t).map_err(|r| spec_err("tags", r))?;
        }
        if let Some(t) = &self.target {
            let names: Vec<&str> = t.split(crate::routing::TARGET_SEPARATOR).collect();
            if names.len() > 64 {
                return Err(spec_err("target", "at most 64 target nodes are allowed"));
            }
            for n in names {
                check_name("target node", n).map_err(|r| spec_err("target", r))?;
            }
        }
        if let Some(k) = &self.compaction_key {
            check_text("compaction_key", k, true, 512)?;
        }
        if let Some(d) = self.ttl {
            crate::ttl::check(d).map_err(|r| spec_err("ttl", r))?;
        }
        Ok(())
    }

    /// Builds the stored task (id 0 until the store assigns one).
    pub fn into_task(self, now_ms: u64, budget: &Budget) -> Result<Task, TaskBuildError> {
        self.validate()?;
        let payload = Blob::from_json("payload", &self.payload, budget)?;
        Ok(Task {
            id: 0,
            kind: self.kind,
            queue: self.queue,
            name: self.name,
            description: self.description,
            weight: self.weight,
            payload,
            tags: self.tags,
            target: self.target,
            compaction_key: self.compaction_key,
            failures: 0,
            attempts: 0,
            last_failure: None,
            status: Status::Queued,
            queued_at: now_ms,
            started_at: None,
            finished_at: None,
            retry_at: None,
            parent: None,
            children: Default::default(),
            result: None,
            ttl_ms: self.ttl.map(|d| d.as_millis() as u64),
        })
    }
}

/// Why a spec could not become a task.
#[derive(Debug, thiserror::Error)]
pub enum TaskBuildError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("payload: {0}")]
    Budget(#[from] BudgetError),
}

impl TaskBuildError {
    /// The field at fault.
    pub fn field(&self) -> &'static str {
        match self {
            TaskBuildError::Spec(e) => e.field,
            TaskBuildError::Budget(_) => "payload",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TaskSpec {
        TaskSpec {
            queue: "main".into(),
            kind: "ModuleRun".into(),
            name: "flow-schema".into(),
            description: Some("doStartup:OperatorStartup".into()),
            ..Default::default()
        }
    }

    #[test]
    fn queue_names_follow_the_rule() {
        assert!(check_name("queue", "parallel_queue_0").is_ok());
        assert!(check_name("queue", "a.b-c_D9").is_ok());
        assert!(check_name("queue", "").is_err());
        assert!(check_name("queue", &"q".repeat(65)).is_err());
        let e = check_name("queue", "bad/name").unwrap_err();
        assert!(e.contains("'/'"), "{e}");
        assert!(check_name("queue", "über").is_err());
    }

    #[test]
    fn validation_names_the_field() {
        let mut s = spec();
        s.queue = "no spaces".into();
        assert_eq!(s.validate().unwrap_err().field, "queue");
        let mut s = spec();
        s.name = "a\tb".into();
        assert_eq!(s.validate().unwrap_err().field, "name");
        let mut s = spec();
        s.tags = vec!["ok".into(), "not ok".into()];
        assert_eq!(s.validate().unwrap_err().field, "tags");
        let mut s = spec();
        s.description = Some("two\nlines".into());
        assert_eq!(s.validate().unwrap_err().field, "description");
        assert!(spec().validate().is_ok());
    }

    #[test]
    fn batch_fields_are_snake_case_and_unknown_fields_are_refused() {
        let s: TaskSpec = serde_json::from_str(
            r#"{"queue":"main","kind":"K","name":"n","weight":3,"tags":["a"],"target":"edge-1"}"#,
        )
        .unwrap();
        assert_eq!(s.weight, Some(3));
        assert_eq!(s.target.as_deref(), Some("edge-1"));
        let s: TaskSpec = serde_json::from_str(
            r#"{"queue":"main","kind":"K","name":"n","target":["edge-1","edge-2"]}"#,
        )
        .unwrap();
        assert_eq!(s.target.as_deref(), Some("edge-1,edge-2"));
        assert!(s.validate().is_ok());
        let mut bad = s.clone();
        bad.target = Some("edge-1,,edge-2".into());
        assert_eq!(bad.validate().unwrap_err().field, "target");
        let e = serde_json::from_str::<TaskSpec>(
            r#"{"queue":"main","kind":"K","name":"n","wieght":3}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("wieght"));
    }

    #[test]
    fn description_line_matches_addon_operator() {
        let mut t = spec().into_task(0, &Budget::default()).unwrap();
        assert_eq!(
            t.description_line(),
            "ModuleRun:main:flow-schema:doStartup:OperatorStartup"
        );
        t.failures = 2;
        assert_eq!(
            t.description_line(),
            "ModuleRun:main:flow-schema:doStartup:OperatorStartup:failures 2"
        );
        t.last_failure = Some("helm upgrade failed".into());
        assert_eq!(
            t.description_line(),
            "ModuleRun:main:flow-schema:doStartup:OperatorStartup:failures 2:helm upgrade failed"
        );
        t.last_failure = Some("Errors:\n- mcplay: boom".into());
        assert_eq!(
            t.description_line(),
            "ModuleRun:main:flow-schema:doStartup:OperatorStartup:failures 2:\n    Errors:\n    - mcplay: boom\n"
        );
    }
}
