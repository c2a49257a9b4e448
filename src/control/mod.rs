//! The control socket: a Unix domain socket `DIR/berth.sock` (mode 0600,
//! never TCP) through which CLI commands reach a running daemon. JSON
//! lines: one request, one response. A malformed or oversized request gets
//! an error response and the daemon keeps serving.
//!
//! No client can hold the daemon: connections are bounded ([`Limits`]),
//! and so is the memory of unfinished requests, per connection and in
//! total; idle connections and clients that do not read are closed after a
//! while, accept errors back off, and a stop shuts every connection. The
//! client side, [`call`], gives up after a timeout.
//!
//! `mod.rs` holds the protocol (the request is [`crate::ops::Request`], the
//! answer a [`Response`]), `server.rs` the daemon's side and `client.rs`
//! the command's side.

mod client;
mod server;

use std::io::{ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::ops::Request;
use crate::ops::{Class, OpError};
pub use client::{CallError, call};
pub use server::{Limits, Server};

/// The socket's file name in the data dir.
pub const SOCKET: &str = "berth.sock";
/// How long the CLI waits for a daemon's answer unless told otherwise
/// (`--timeout`, `BERTH_TIMEOUT`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request line accepted (a batch of tasks near the budget).
pub const MAX_REQUEST: u64 = 64 << 20;

/// Error classes carried in responses: the exit codes (`ops::Class`).
pub const CODE_RUNTIME: i32 = Class::Runtime.code();
pub const CODE_INPUT: i32 = Class::Input.code();
/// The daemon is too busy to take the request (every connection taken, or
/// the memory for unfinished requests used up); it did nothing with it.
pub const CODE_BUSY: i32 = Class::Busy.code();

pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: i32,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub result: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

impl Response {
    fn ok(result: Value) -> Self {
        Response {
            result,
            error: None,
        }
    }
    fn err(code: i32, message: impl Into<String>) -> Self {
        Response {
            result: Value::Null,
            error: Some(ErrorBody {
                code,
                message: message.into(),
            }),
        }
    }
}

impl From<Result<Value, OpError>> for Response {
    fn from(r: Result<Value, OpError>) -> Self {
        match r {
            Ok(v) => Response::ok(v),
            Err(e) => Response::err(e.class.code(), e.message),
        }
    }
}

impl Response {
    /// The answer as an operation's result (the client side).
    pub fn into_result(self) -> Result<Value, OpError> {
        match self.error {
            Some(e) => Err(OpError::new(Class::from_code(e.code), e.message)),
            None => Ok(self.result),
        }
    }
}

/// Parses one request line; an error names the field at fault where it
/// can ([`place_of`]).
fn parse_request(line: &[u8]) -> Result<Request, Response> {
    serde_json::from_slice(line).map_err(|e| {
        let why = placed(line, &e).unwrap_or_else(|| e.to_string());
        Response::err(CODE_INPUT, format!("malformed request: {why}"))
    })
}

/// The most top-level fields [`placed`] tries one by one.
const MAX_FIELDS: usize = 16;

/// Why a request does not parse (`e`), with where the fault is: `field
/// id: ...`, `field spec.ttl: ...` or `field tasks, entry 2 of 3, field
/// name: ...`; None when no field can be named. The request is parsed as
/// bare JSON (serde's tagged request says what is wrong, but not where):
/// a spec, a batch entry or a filter is read on its own, which names its
/// field; a top-level field is found by taking each away in turn until the
/// request parses, or misses just that field. Only run on a refused line.
fn placed(line: &[u8], e: &serde_json::Error) -> Option<String> {
    use crate::ops::TaskFilter;
    use crate::task::TaskSpec;
    let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(line) else {
        return None; // not JSON, or not an object: serde says where
    };
    let nested = |key: &str, e: serde_path_to_error::Error<serde_json::Error>| match e
        .path()
        .to_string()
        .as_str()
    {
        "." => format!("field {key}: {}", e.inner()),
        path => format!("field {key}.{path}: {}", e.inner()),
    };
    match (o.get("op").and_then(Value::as_str), &o) {
        (Some("enqueue"), o) if o.contains_key("spec") => {
            if let Err(e) = serde_path_to_error::deserialize::<_, TaskSpec>(&o["spec"]) {
                return Some(nested("spec", e));
            }
        }
        (Some("task_list"), o) if o.contains_key("filter") => {
            if let Err(e) = serde_path_to_error::deserialize::<_, TaskFilter>(&o["filter"]) {
                return Some(nested("filter", e));
            }
        }
        (Some("enqueue_batch"), o) if o.contains_key("tasks") => {
            // A key given twice in an entry is seen in the text only (the
            // parsed JSON keeps one): the request has the batch document's
            // shape, `op` aside.
            let text = std::str::from_utf8(line).unwrap_or_default();
            if let Err(why) = crate::submit::parse_batch(text)
                && why.contains(": duplicate field `")
            {
                return Some(format!("field tasks, {why}"));
            }
            let batch = serde_json::json!({ "tasks": o["tasks"] }).to_string();
            if let Err(why) = crate::submit::parse_batch(&batch) {
                return Some(format!("field tasks, {why}"));
            }
        }
        _ => {}
    }
    // A request has a few fields; more are unknown ones, which serde
    // names (and trying each would cost their square).
    if o.len() > MAX_FIELDS {
        return None;
    }
    o.keys().filter(|k| k.as_str() != "op").find_map(|k| {
        let mut without = o.clone();
        without.remove(k);
        match serde_json::from_value::<Request>(Value::Object(without)) {
            Ok(_) => Some(format!("field {k}: {e}")),
            Err(m) if m.to_string().starts_with(&format!("missing field `{k}`")) => {
                Some(format!("field {k}: {e}"))
            }
            Err(_) => None,
        }
    })
}

/// Writes all of `data` before `deadline`, or fails with `TimedOut`.
pub(super) fn write_within(
    mut stream: &UnixStream,
    mut data: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    while !data.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(data) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_refuses_unknown_fields() {
        let spec = r#"{"queue":"main","kind":"K","name":"n"}"#;
        let good = [
            r#"{"op":"queue_list"}"#.to_string(),
            format!(r#"{{"op":"enqueue","spec":{spec}}}"#),
            format!(r#"{{"op":"enqueue_batch","tasks":[{spec}]}}"#),
            r#"{"op":"task_show","id":1}"#.to_string(),
            r#"{"op":"task_remove","id":1}"#.to_string(),
            r#"{"op":"task_retry","id":1}"#.to_string(),
            r#"{"op":"task_remove","id":1,"history":true}"#.to_string(),
            r#"{"op":"task_log","id":1}"#.to_string(),
            r#"{"op":"task_log","id":1,"attempt":2}"#.to_string(),
            r#"{"op":"task_output","id":1}"#.to_string(),
            r#"{"op":"task_output","id":1,"attempt":2,"stdout_from":5,"stderr_from":0}"#
                .to_string(),
            r#"{"op":"task_cancel","id":1}"#.to_string(),
            r#"{"op":"task_list","filter":{"targets":["edge-2"]}}"#.to_string(),
            r#"{"op":"metrics"}"#.to_string(),
            r#"{"op":"queue_list","all":true}"#.to_string(),
            r#"{"op":"export","path":"/tmp/x.bex","queues":["main"],"statuses":["queued"],"history":true,"targets":["edge-2"]}"#
                .to_string(),
            r#"{"op":"import","path":"/tmp/x.bex","label":"standard input"}"#.to_string(),
        ];
        for line in &good {
            assert!(parse_request(line.as_bytes()).is_ok(), "{line}");
            let bad = format!(r#"{},"bogus":1}}"#, &line[..line.len() - 1]);
            match parse_request(bad.as_bytes()) {
                Ok(r) => panic!("{bad} was accepted as {r:?}"),
                Err(resp) => {
                    let e = resp.error.expect("an error response");
                    assert_eq!(e.code, CODE_INPUT, "{bad}");
                    assert!(e.message.contains("unknown field `bogus`"), "{bad}: {e:?}");
                }
            }
        }
        // The refusal names the field at fault.
        let spec = |extra: &str| format!(r#"{{"queue":"main","kind":"K","name":"n"{extra}}}"#);
        for (line, says) in [
            (
                r#"{"op":"queue_list","all":"yes"}"#.to_string(),
                r#"field all: invalid type: string "yes", expected a boolean"#,
            ),
            (
                r#"{"op":"task_show","id":"7"}"#.to_string(),
                r#"field id: invalid type: string "7", expected u64"#,
            ),
            (
                format!(r#"{{"op":"enqueue","spec":{}}}"#, spec(r#","ttl":"0ms""#)),
                "field spec.ttl: '0ms': must be at least 1ms",
            ),
            (
                format!(
                    r#"{{"op":"enqueue_batch","tasks":[{},{}]}}"#,
                    spec(""),
                    r#"{"queue":"main","kind":"K","name":5}"#
                ),
                "field tasks, entry 2 of 2, field name: invalid type: integer `5`, expected a string",
            ),
            (
                format!(
                    r#"{{"op":"enqueue_batch","tasks":[{},{}]}}"#,
                    spec(""),
                    spec(r#","name":"m""#)
                ),
                "field tasks, entry 2 of 2: duplicate field `name`",
            ),
            (
                r#"{"op":"task_list","filter":{"statuses":"live"}}"#.to_string(),
                "field filter.statuses: invalid type: string \"live\", expected a sequence",
            ),
        ] {
            let e = parse_request(line.as_bytes())
                .expect_err(&line)
                .error
                .expect("an error");
            assert_eq!(e.code, CODE_INPUT);
            assert!(
                e.message.starts_with(&format!("malformed request: {says}")),
                "{line}: {}",
                e.message
            );
        }
        assert_eq!(
            serde_json::to_string(&Request::QueueList { all: false })
                .ok()
                .as_deref(),
            Some(r#"{"op":"queue_list"}"#)
        );
    }
}
