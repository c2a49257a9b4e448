//! systemd's notification protocol (sd_notify(3)) for a `Type=notify`
//! service: the daemon says `READY=1` once it serves, `STOPPING=1` when it
//! begins to stop, `STATUS=...` lines, and `WATCHDOG=1` while its loop goes
//! round, if the unit has `WatchdogSec=`. Each is one datagram to the Unix
//! socket in `NOTIFY_SOCKET` (a path, or `@name` in the abstract
//! namespace). Without `NOTIFY_SOCKET` nothing is sent.
//!
//! [`take_env`] reads the variables once, at the start of `main`, and
//! removes them from the environment, so that handlers do not inherit them
//! (a handler's process must not speak for the service).

use std::os::unix::net::UnixDatagram;
use std::sync::OnceLock;
use std::time::Duration;

#[derive(Debug, Default)]
struct Env {
    socket: Option<String>,
    watchdog: Option<Duration>,
}

static ENV: OnceLock<Env> = OnceLock::new();

/// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID`, and removes
/// them from the environment. Call it first in `main`, before any thread
/// starts.
pub fn take_env() {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let for_us = var("WATCHDOG_PID").is_none_or(|p| p == std::process::id().to_string());
    let env = Env {
        socket: var("NOTIFY_SOCKET"),
        watchdog: var("WATCHDOG_USEC")
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0 && for_us)
            .map(Duration::from_micros),
    };
    for k in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"] {
        // SAFETY: called at the start of `main`, before any other thread
        // exists, so nothing reads the environment meanwhile.
        unsafe { std::env::remove_var(k) };
    }
    let _ = ENV.set(env);
}

/// The watchdog's timeout, if the service manager asked for pings.
pub fn watchdog() -> Option<Duration> {
    ENV.get().and_then(|e| e.watchdog)
}

/// Sends `state` (`READY=1`, `STOPPING=1`, `STATUS=...`, `WATCHDOG=1`;
/// several separated by newlines). Without a socket it does nothing; an
/// error is logged and otherwise ignored (the service manager will notice).
pub fn notify(state: &str) {
    let Some(socket) = ENV.get().and_then(|e| e.socket.as_deref()) else {
        return;
    };
    if let Err(e) = send(socket, state) {
        log::warn!("telling the service manager {state:?} through {socket}: {e}");
    }
}

fn send(socket: &str, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), socket)?;
        }
    }
    Ok(())
}
