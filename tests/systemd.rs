//! Running under systemd: the daemon speaks the notify protocol (`READY=1`
//! once it serves, `WATCHDOG=1` while its loop goes round, `STOPPING=1` at
//! a stop) and its handlers do not inherit the notify socket; the example
//! unit passes `systemd-analyze verify`.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use common::daemon::{Daemon, write_root};
use common::{stderr, stdout, tempdir};

/// Every datagram that arrives on `sock` within `within`, until `until`
/// says the list is complete.
fn receive(
    sock: &UnixDatagram,
    within: Duration,
    until: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !until(&got) {
        let left = within.saturating_sub(start.elapsed());
        assert!(
            !left.is_zero(),
            "only these arrived within {within:?}: {got:?}"
        );
        sock.set_read_timeout(Some(left)).expect("timeout");
        if let Ok(n) = sock.recv(&mut buf) {
            got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    got
}

const HOOK: &str = "#!/bin/sh\ncat >/dev/null\nprintf '\"%s|%s|%s\"' \"$NOTIFY_SOCKET\" \"$WATCHDOG_USEC\" \"$BERTH_NODE\"\n";

#[test]
fn the_daemon_tells_systemd_it_is_ready_alive_and_stopping() {
    let root = tempdir();
    let cfg = write_root(
        root.path(),
        HOOK,
        "data_dir = \"data\"\nnode = \"edge-1\"\n[handlers.Work]\ncommand = [\"./hook.sh\"]\n",
    );
    let path = root.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind the notify socket");
    let dir = root.path().join("data");
    let mut d = Daemon::start_with(&cfg, &dir, &[], |c| {
        c.env("NOTIFY_SOCKET", &path).env("WATCHDOG_USEC", "400000");
    });
    // READY=1 first, then a watchdog ping every 200 ms.
    let got = receive(&sock, Duration::from_secs(20), |g| {
        g.iter().filter(|m| *m == "WATCHDOG=1").count() >= 3
    });
    assert!(got[0].starts_with("READY=1\nSTATUS=serving "), "{got:?}");
    assert!(got[1..].iter().all(|m| m == "WATCHDOG=1"), "{got:?}");
    // Handlers do not inherit the socket (nor the watchdog).
    let id = common::enqueue_id(
        &dir,
        &["--queue", "main", "--kind", "Work", "--name", "env"],
    );
    common::wait_for("the task to succeed", || {
        common::task_json(&dir, id)["status"] == "succeeded"
    });
    assert_eq!(common::task_json(&dir, id)["result"], "||edge-1");
    // SIGTERM: STOPPING=1.
    d.signal(libc::SIGTERM);
    let got = receive(&sock, Duration::from_secs(20), |g| {
        g.iter().any(|m| m.starts_with("STOPPING=1"))
    });
    assert!(
        got.iter()
            .all(|m| m == "WATCHDOG=1" || m.starts_with("STOPPING=1")),
        "{got:?}"
    );
    let (status, _) = d.wait_exit(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0));
}

#[test]
fn an_abstract_notify_socket_works_too() {
    use std::os::linux::net::SocketAddrExt;
    let root = tempdir();
    let cfg = write_root(
        root.path(),
        HOOK,
        "data_dir = \"data\"\n[handlers.Work]\ncommand = [\"./hook.sh\"]\n",
    );
    let name = format!("berth-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
    let sock = UnixDatagram::bind_addr(&addr).expect("bind");
    let o = Command::new(common::berth_bin())
        .arg("--data-dir")
        .arg(root.path().join("data"))
        .args(["run", "--until-idle", "--config"])
        .arg(&cfg)
        .env("NOTIFY_SOCKET", format!("@{name}"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("berth run");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let got = receive(&sock, Duration::from_secs(5), |g| g.len() >= 2);
    assert!(got[0].starts_with("READY=1"), "{got:?}");
    assert_eq!(got[1], "STOPPING=1", "an end by itself says so too");
}

#[test]
fn the_example_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systemd/berth.service"),
    )
    .expect("the example unit");
    assert!(unit.contains("\nType=notify\n"));
    assert!(unit.contains("\nUser=berth\n"));
    assert!(unit.contains("\nStateDirectory=berth\n"));
    assert!(unit.contains("\nRestart=on-failure\n"));
    // verify checks that ExecStart's program exists: point it at this build.
    let root = tempdir();
    let path = root.path().join("berth.service");
    let bin = common::berth_bin();
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/berth", &bin.to_string_lossy()),
    )
    .expect("write the unit");
    let o = match Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: systemd-analyze cannot run here: {e}");
            return;
        }
    };
    let said = format!("{}{}", stdout(&o), stderr(&o));
    // It warns (and still exits 0) about unknown keys and bad values.
    assert!(
        o.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {:?}\n{said}",
        o.status
    );
    // And it does find problems: an unknown key is reported.
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/berth", &bin.to_string_lossy())
            .replace("Type=notify", "Type=notify\nNotifyAcess=main"),
    )
    .expect("write the unit");
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    assert!(stderr(&o).contains("NotifyAcess"), "{}", stderr(&o));
}
