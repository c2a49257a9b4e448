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

/// Parses one request line.
fn parse_request(line: &[u8]) -> Result<Request, Response> {
    serde_json::from_slice(line)
        .map_err(|e| Response::err(CODE_INPUT, format!("malformed request: {e}")))
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
        assert_eq!(
            serde_json::to_string(&Request::QueueList { all: false })
                .ok()
                .as_deref(),
            Some(r#"{"op":"queue_list"}"#)
        );
    }
}
