//! Where a command's request goes: to the daemon when one answers on the
//! data dir's socket, and otherwise through the same operation on the data
//! dir opened here (`ops::execute` either way, so the answer is the same).

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use berth::clock;
use berth::control::{self, CallError};
use berth::ops::{self, Access, Ctx, OpError, Request};
use berth::store::{OpenError, Options, Role, Store};
use serde_json::Value;

/// How long a command waits for a daemon's answer, and for a starting
/// daemon's socket (`--timeout`); set once before any request.
static TIMEOUT: OnceLock<Duration> = OnceLock::new();

pub fn set_timeout(t: Duration) {
    let _ = TIMEOUT.set(t);
}

fn timeout() -> Duration {
    TIMEOUT.get().copied().unwrap_or(control::DEFAULT_TIMEOUT)
}

/// Asks the daemon, if one listens on the data dir's socket.
fn ask_daemon(dir: &Path, req: &Request) -> Option<Result<Value, OpError>> {
    if !control::socket_path(dir).exists() {
        return None;
    }
    match control::call(dir, req, timeout()) {
        Err(CallError::NoDaemon) => None,
        Err(e @ (CallError::TimedOut { .. } | CallError::Failed(_))) => {
            Some(Err(OpError::runtime(e.to_string())))
        }
        Ok(resp) => Some(resp.into_result()),
    }
}

/// Runs `req`: through the daemon when one answers, else on the data dir
/// opened here as the request needs ([`Access`]: to read, it must be a
/// berth data dir and nothing in it changes). A daemon that holds the data
/// dir but does not answer yet, or that waits for the lock (right after a
/// restart), is starting: the command waits for its socket, up to
/// `--timeout`, instead of failing.
pub fn run(dir: &Path, req: Request) -> Result<Value, OpError> {
    let start = Instant::now();
    loop {
        if let Some(answer) = ask_daemon(dir, &req) {
            return answer;
        }
        let access = req.access();
        let opts = Options {
            create: access == Access::Create,
            read_only: access == Access::Read,
            ..Options::default()
        };
        match Store::open(dir, opts, clock::system()) {
            Ok(store) => return ops::execute(&Ctx::direct(Some(&store)), req),
            Err(OpenError::InUse { holder, .. })
                if holder.role == Some(Role::Daemon) && start.elapsed() < timeout() =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
