//! The control socket: a Unix domain socket `DIR/berth.sock` (mode 0600,
//! never TCP) through which CLI commands reach a running daemon. JSON
//! lines: one request, one response. A malformed or oversized request gets
//! an error response and the daemon keeps serving.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::engine::Engine;
use crate::report::{self, QueueView};
use crate::store::{Placement, WriteError};
use crate::task::TaskSpec;

/// The socket's file name in the data dir.
pub const SOCKET: &str = "berth.sock";
/// The largest request line accepted (a batch of tasks near the budget).
pub const MAX_REQUEST: u64 = 64 << 20;

/// Exit-code-like error classes carried in responses.
pub const CODE_RUNTIME: i32 = 1;
pub const CODE_INPUT: i32 = 2;

pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Enqueue {
        spec: Box<TaskSpec>,
        #[serde(default)]
        first: bool,
        #[serde(default)]
        after: Option<u64>,
        #[serde(default)]
        before: Option<u64>,
    },
    EnqueueBatch {
        tasks: Vec<TaskSpec>,
    },
    /// A struct variant, not a unit one: serde's `deny_unknown_fields`
    /// does not reach unit variants of an internally tagged enum, so
    /// `{"op":"queue_list","bogus":1}` would be accepted.
    QueueList {},
    TaskShow {
        id: u64,
    },
    TaskRemove {
        id: u64,
    },
    TaskRetry {
        id: u64,
    },
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

/// Placement from the enqueue flags.
pub fn placement(first: bool, after: Option<u64>, before: Option<u64>) -> Placement {
    match (first, after, before) {
        (true, _, _) => Placement::First,
        (_, Some(id), _) => Placement::After(id),
        (_, _, Some(id)) => Placement::Before(id),
        _ => Placement::Last,
    }
}

/// Queue views to and from JSON (the wire form of `queue list`).
pub fn views_to_json(views: &[QueueView]) -> Value {
    json!(
        views
            .iter()
            .map(|v| json!({"name": v.name, "status": v.status, "tasks": v.tasks}))
            .collect::<Vec<_>>()
    )
}

pub fn views_from_json(v: &Value) -> Result<Vec<QueueView>, String> {
    let arr = v.as_array().ok_or("queue list: expected an array")?;
    arr.iter()
        .map(|q| {
            let s = |k: &str| {
                q[k].as_str()
                    .map(str::to_string)
                    .ok_or(format!("queue list: missing {k}"))
            };
            Ok(QueueView {
                name: s("name")?,
                status: s("status")?,
                tasks: q["tasks"]
                    .as_array()
                    .ok_or("queue list: missing tasks")?
                    .iter()
                    .map(|t| t.as_str().unwrap_or_default().to_string())
                    .collect(),
            })
        })
        .collect()
}

fn write_error(e: &WriteError) -> Response {
    let code = match e {
        WriteError::NoSuchTask(_) | WriteError::WrongState { .. } => CODE_RUNTIME,
        WriteError::Order(_) | WriteError::Budget(_) | WriteError::Queue(_) => CODE_INPUT,
        _ => CODE_RUNTIME,
    };
    Response::err(code, e.to_string())
}

fn enqueued(r: Result<Vec<u64>, crate::submit::EnqueueError>) -> Response {
    match r {
        Ok(ids) => Response::ok(json!(ids)),
        Err(e) => Response::err(
            if e.is_bad_input() {
                CODE_INPUT
            } else {
                CODE_RUNTIME
            },
            e.to_string(),
        ),
    }
}

/// Answers one request against a running engine.
pub fn handle(engine: &Engine, req: Request) -> Response {
    let store = engine.store();
    match req {
        Request::Enqueue {
            spec,
            first,
            after,
            before,
        } => enqueued(
            engine
                .enqueue(*spec, placement(first, after, before))
                .map(|id| vec![id]),
        ),
        Request::EnqueueBatch { tasks } => enqueued(engine.enqueue_batch(tasks)),
        Request::QueueList {} => Response::ok(views_to_json(&engine.queue_views())),
        Request::TaskShow { id } => match store.task(id) {
            Ok(Some(t)) => Response::ok(report::task_json(&t, store.budget())),
            Ok(None) => Response::err(CODE_RUNTIME, format!("no task {id}")),
            Err(e) => Response::err(CODE_RUNTIME, e.to_string()),
        },
        Request::TaskRemove { id } => {
            let mut w = store.write();
            match w.remove(id).and_then(|r| w.commit().map(|_| r)) {
                Ok(removed) => {
                    engine.wake();
                    Response::ok(json!(removed))
                }
                Err(e) => write_error(&e),
            }
        }
        Request::TaskRetry { id } => {
            let mut w = store.write();
            match w.retry(id, Placement::Last).and_then(|_| w.commit()) {
                Ok(_) => {
                    engine.wake();
                    Response::ok(json!([id]))
                }
                Err(e) => write_error(&e),
            }
        }
    }
}

/// Parses one request line.
fn parse_request(line: &[u8]) -> Result<Request, Response> {
    serde_json::from_slice(line)
        .map_err(|e| Response::err(CODE_INPUT, format!("malformed request: {e}")))
}

/// A running socket server.
pub struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Binds `DIR/berth.sock` (replacing a stale one: the caller holds the
    /// data dir lock) with mode 0600.
    pub fn bind(data_dir: &Path) -> std::io::Result<(Server, UnixListener)> {
        let path = socket_path(data_dir);
        let _ = std::fs::remove_file(&path);
        // Created private (umask 077) so nobody can connect before the chmod.
        // SAFETY: umask(2) only swaps the process's file mode mask.
        let old = unsafe { libc::umask(0o077) };
        let bound = UnixListener::bind(&path);
        unsafe { libc::umask(old) };
        let listener = bound?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok((
            Server {
                path,
                stop: Arc::new(AtomicBool::new(false)),
            },
            listener,
        ))
    }

    /// Serves connections until [`Server::stop`]; run it on its own (scoped) thread.
    pub fn serve<'s>(
        &self,
        scope: &'s std::thread::Scope<'s, '_>,
        listener: UnixListener,
        engine: &'s Engine,
    ) {
        for conn in listener.incoming() {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let Ok(stream) = conn else { continue };
            let stop = self.stop.clone();
            scope.spawn(move || serve_connection(stream, engine, &stop));
        }
    }

    /// Stops accepting and lets open connections finish.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path); // wake the accept loop
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve_connection(stream: UnixStream, engine: &Engine, stop: &AtomicBool) {
    // A timeout lets the thread notice a stop; a partial line survives it.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let before = line.len();
        let read = (&mut reader)
            .take(MAX_REQUEST + 1 - before.min(MAX_REQUEST as usize) as u64)
            .read_until(b'\n', &mut line);
        let response = match read {
            Ok(0) if line.is_empty() => return,
            Ok(_) if line.last() == Some(&b'\n') => {
                let r = match parse_request(&line) {
                    Ok(req) => handle(engine, req),
                    Err(r) => r,
                };
                line.clear();
                r
            }
            Ok(_) if line.len() as u64 > MAX_REQUEST => {
                // Too long: answer and drop the connection (the rest of the line is garbage).
                let r = Response::err(CODE_INPUT, format!("request is over {MAX_REQUEST} bytes"));
                let mut out = serde_json::to_vec(&r).unwrap_or_default();
                out.push(b'\n');
                let _ = writer.write_all(&out);
                return;
            }
            Ok(_) => return, // EOF in the middle of a line
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                continue;
            }
            Err(_) => return,
        };
        let mut out = serde_json::to_vec(&response).unwrap_or_default();
        out.push(b'\n');
        if writer.write_all(&out).is_err() {
            return;
        }
    }
}

/// Sends one request to the daemon at `data_dir`. Err(None) when no daemon
/// listens there.
pub fn call(data_dir: &Path, req: &Request) -> Result<Response, Option<String>> {
    let mut stream = UnixStream::connect(socket_path(data_dir)).map_err(|_| None)?;
    let mut line = serde_json::to_vec(req).map_err(|e| Some(e.to_string()))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| Some(format!("sending to the daemon: {e}")))?;
    let reader = BufReader::new(stream);
    let mut answer = Vec::new();
    reader
        .take(MAX_REQUEST * 2)
        .read_until(b'\n', &mut answer)
        .map_err(|e| Some(format!("reading the daemon's answer: {e}")))?;
    serde_json::from_slice(&answer)
        .map_err(|e| Some(format!("the daemon's answer is malformed: {e}")))
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
            serde_json::to_string(&Request::QueueList {})
                .ok()
                .as_deref(),
            Some(r#"{"op":"queue_list"}"#)
        );
    }
}
