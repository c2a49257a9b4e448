//! Shared test helpers: temp data dirs, stores on a fake clock, task specs,
//! and running the real `berth` binary.
#![allow(dead_code)]

pub mod daemon;
pub mod format6;
pub mod lazyfs;
pub mod producer;
pub mod tmpfs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use berth::clock::FakeClock;
use berth::store::{Options, Store};
use berth::task::TaskSpec;

pub const T0: u64 = 1_800_000_000_000;

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir()
        .expect("tempdir")
}

/// The store's whole log, replayed, agrees with its state (`berth verify`).
pub fn assert_log_agrees(store: &Store) {
    let diffs = berth::store::verify::verify(store).expect("replaying the log");
    assert!(diffs.is_empty(), "log and state disagree: {diffs:#?}");
}

/// Opens `dir` on a fake clock.
pub fn open(dir: &Path, clock: &FakeClock) -> Store {
    Store::open(dir, Options::default(), Arc::new(clock.clone())).expect("open store")
}

pub fn spec(queue: &str, name: &str) -> TaskSpec {
    TaskSpec {
        queue: queue.into(),
        kind: "ModuleRun".into(),
        name: name.into(),
        ..Default::default()
    }
}

/// This test binary, to be run as a child process that runs only the test
/// `name` (a child test that acts when its environment says so), with no
/// stdin and its stdout piped. The caller adds the environment and stderr.
pub fn child_test(name: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped());
    c
}

/// The `berth` binary built for these tests.
pub fn berth_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_berth"))
}

/// The "now" the `berth` helper's commands show ages against, so that two
/// runs of one command print the same text.
pub const NOW: &str = "2030-01-01T00:00:00Z";

/// Runs `berth --data-dir DIR ARGS...` (with `BERTH_NOW` = [`NOW`]).
pub fn berth(dir: &Path, args: &[&str]) -> Output {
    Command::new(berth_bin())
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env("RUST_LOG", "warn")
        .env("BERTH_NOW", NOW)
        .output()
        .expect("run berth")
}

/// Runs `berth --data-dir DIR enqueue ARGS...`, which must succeed; returns
/// the id it printed.
pub fn enqueue_id(dir: &Path, args: &[&str]) -> u64 {
    let o = berth(dir, &[&["enqueue"], args].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("enqueue printed {text:?}: {e}"))
}

/// `berth --data-dir DIR task show ID -o json`, which must succeed.
pub fn task_json(dir: &Path, id: u64) -> serde_json::Value {
    let o = berth(dir, &["task", "show", &id.to_string(), "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("task show printed {:?}: {e}", stdout(&o)))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts that a command was refused with exit `code` and an error that
/// says `says` (its stderr shown when not).
pub fn assert_refused(o: &Output, code: i32, says: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert!(err.contains(says), "expected {says:?} in: {err}");
}

/// Asserts two texts are equal, showing a line diff when they are not.
pub fn assert_text_eq(actual: &str, expected: &str) {
    if actual == expected {
        return;
    }
    let mut diff = String::new();
    let (a, e): (Vec<_>, Vec<_>) = (actual.lines().collect(), expected.lines().collect());
    for i in 0..a.len().max(e.len()) {
        let (x, y) = (a.get(i).copied(), e.get(i).copied());
        if x != y {
            diff.push_str(&format!(
                "line {}:\n  expected: {:?}\n  actual:   {:?}\n",
                i + 1,
                y,
                x
            ));
        }
    }
    panic!("texts differ:\n{diff}\n--- actual ---\n{actual}");
}

/// Waits until `cond` holds, checking every millisecond, for at most 20 s.
/// This waits on a condition the code under test makes true; it is not a
/// sleep that hopes something happened.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed().as_secs() < 20,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The seven CRD modules that start the seed's startup, as one group.
pub const SEED_CRDS: [&str; 7] = [
    "cloud-data-crd",
    "metallb-crd",
    "operator-prometheus-crd",
    "prometheus-crd",
    "snapshot-controller-crd",
    "user-authn-crd",
    "vertical-pod-autoscaler-crd",
];

/// The seed's last startup list (addon-operator's `queue list`), as specs:
/// the seven CRD modules share a weight, then singles and groups in order.
pub fn seed_startup_specs() -> Vec<TaskSpec> {
    let steps: Vec<Vec<&str>> = vec![
        SEED_CRDS.to_vec(),
        vec!["flow-schema"],
        vec!["admission-policy-engine"],
        vec!["cloud-provider-openstack"],
        vec!["local-path-provisioner"],
        vec!["cni-flannel"],
        vec!["kube-proxy"],
        vec!["registry-packages-proxy"],
        vec!["control-plane-manager", "node-manager", "terraform-manager"],
        vec!["kube-dns"],
        vec!["snapshot-controller"],
        vec!["cert-manager"],
        vec!["user-authz"],
        vec!["user-authn"],
        vec!["operator-prometheus"],
        vec!["prometheus"],
        vec!["prometheus-metrics-adapter"],
        vec!["vertical-pod-autoscaler"],
        vec![
            "extended-monitoring",
            "monitoring-applications",
            "monitoring-custom",
            "monitoring-deckhouse",
            "monitoring-kubernetes",
            "monitoring-kubernetes-control-plane",
            "monitoring-ping",
        ],
        vec!["node-local-dns"],
        vec!["metallb"],
        vec!["l2-load-balancer"],
        vec!["ingress-nginx"],
        vec!["log-shipper"],
        vec!["pod-reloader"],
        vec!["chrony"],
        vec!["dashboard", "operator-trivy", "upmeter"],
        vec!["namespace-configurator", "secret-copier"],
        vec!["deckhouse-tools"],
        vec!["documentation"],
        vec!["echo", "mcplay"],
    ];
    let mut specs = Vec::new();
    // Enqueued in reverse order on purpose: the weights alone must order them.
    for (w, names) in steps.iter().enumerate().rev() {
        for n in names {
            specs.push(TaskSpec {
                queue: "main".into(),
                kind: "ModuleRun".into(),
                name: n.to_string(),
                description: Some("doStartup:OperatorStartup".into()),
                weight: Some(10 + w as i64),
                ..Default::default()
            });
        }
    }
    specs.push(TaskSpec {
        queue: "main".into(),
        kind: "ConvergeModules".into(),
        name: String::new(),
        description: Some(":Operator-Startup".into()),
        weight: Some(100),
        ..Default::default()
    });
    specs.push(TaskSpec {
        queue: "main".into(),
        kind: "ModuleHookRun".into(),
        name: "kubernetes".into(),
        description: Some("002-deckhouse/hooks/change_host_ip.go:pod:Kubernetes".into()),
        weight: Some(101),
        ..Default::default()
    });
    specs
}

/// Sends every complete line a child process prints, until EOF. A line cut
/// short by a kill has no newline and is not sent.
pub fn forward_lines(out: impl std::io::Read, tx: std::sync::mpsc::Sender<String>) {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Some(text) = line.strip_suffix('\n') else {
            return;
        };
        if tx.send(text.to_string()).is_err() {
            return;
        }
    }
}

/// Waits up to 60 s for a line from `lines` (a child's stdout, through
/// [`forward_lines`]) for which `found` holds. If none comes, the child is
/// killed and the error says why (its stdout ended, or the time ran out).
pub fn wait_for_line(
    child: &mut std::process::Child,
    lines: &std::sync::mpsc::Receiver<String>,
    found: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if found(&line) => return Ok(()),
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{e:?}"));
            }
        }
    }
}

/// Spawns `cmd` (a [`child_test`]: stdout piped) with its stderr piped,
/// waits for a stdout line for which `found` holds (else panics, saying
/// that no `what` came, with the child's stderr), lets it run `delay` more,
/// kills it with SIGKILL and returns how it ended and its stderr.
pub fn kill_after_line(
    cmd: &mut Command,
    what: &str,
    found: impl Fn(&str) -> bool,
    delay: std::time::Duration,
) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning the child");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || forward_lines(stdout, tx));
    let stderr = read_in_background(child.stderr.take().expect("piped stderr"));
    if let Err(e) = wait_for_line(&mut child, &rx, found) {
        panic!(
            "no {what} came from the child ({e}); stderr:\n{}",
            stderr.join().unwrap_or_default()
        );
    }
    std::thread::sleep(delay);
    let _ = child.kill();
    let status = child.wait().expect("waiting for the child");
    reader.join().expect("stdout reader");
    (status, stderr.join().unwrap_or_default())
}

/// Reads all a child process prints on `out` (its stderr, say) on a thread
/// of its own; join it for the text.
pub fn read_in_background(
    mut out: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    })
}

/// Whether process `pid` runs: it exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// The pid a process wrote to `file`, once it has.
pub fn read_pid(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Every file under `dir` (none if it does not exist) with a hash of its
/// bytes, sorted: equal before and after a command means the command
/// changed nothing there.
pub fn file_hashes(dir: &Path) -> Vec<(String, u64)> {
    use std::hash::{Hash, Hasher};
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                std::fs::read(&p).unwrap_or_default().hash(&mut h);
                out.push((p.display().to_string(), h.finish()));
            }
        }
    }
    out.sort();
    out
}

/// Copies a fixture's data dir `from` (tests/fixtures/*/data) to `to`:
/// `berth.dir`, `berth.high` if it has one, and `db/`, inflating its
/// `*.gz` files (`db/db.gz` is sled's `db/db`); an empty `db/blobs/` is
/// made (git keeps no empty folder).
pub fn copy_fixture_data(from: &Path, to: &Path) {
    use std::io::Read;
    std::fs::create_dir_all(to.join("db/blobs")).expect("mkdir");
    for name in ["berth.dir", "berth.high"] {
        if from.join(name).exists() {
            std::fs::copy(from.join(name), to.join(name)).expect("copy");
        }
    }
    for f in std::fs::read_dir(from.join("db")).expect("read") {
        let f = f.expect("entry");
        let name = f.file_name().into_string().expect("a name");
        match name.strip_suffix(".gz") {
            Some(plain) => {
                let mut bytes = Vec::new();
                flate2::read::GzDecoder::new(std::fs::File::open(f.path()).expect("open"))
                    .read_to_end(&mut bytes)
                    .expect("gunzip");
                std::fs::write(to.join("db").join(plain), bytes).expect("write");
            }
            None => {
                std::fs::copy(f.path(), to.join("db").join(name)).expect("copy");
            }
        }
    }
}

/// `task list -o json` rows as a build from before `took_ms` listed them:
/// each row's `took_ms` is checked (a finished task that ran, and was not
/// cancelled while it waited, took its finish minus its start, as `took`
/// said then) and taken out.
#[allow(dead_code)]
pub fn rows_before_took_ms(mut rows: serde_json::Value) -> serde_json::Value {
    for r in rows.as_array_mut().expect("rows") {
        let m = r.as_object_mut().expect("a row");
        let took = m.remove("took_ms").expect("every row has took_ms");
        let (start, end) = (m["started_at"].as_u64(), m["finished_at"].as_u64());
        match (m["place"].as_str(), start, end) {
            (Some("history"), Some(s), Some(f)) if m["status"] != "cancelled" => {
                assert_eq!(took, serde_json::json!(f - s), "{m:?}")
            }
            (Some("history"), Some(_), Some(_)) => {}
            _ => assert_eq!(took, serde_json::Value::Null, "{m:?}"),
        }
    }
    rows
}
