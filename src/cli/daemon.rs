//! `berth run`: the engine as an edge node daemon. The first SIGTERM,
//! SIGINT or SIGHUP stops dispatching and waits for running handlers (the
//! grace period); a second one exits at once (running tasks are then
//! recovered at the next start). Beside the engine, a service thread tells
//! systemd how the daemon is (`notify`) and writes the metrics textfile.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use berth::clock;
use berth::config::Config;
use berth::control;
use berth::engine::{Engine, Handlers, RunSummary};
use berth::ops::{self, Ctx};
use berth::retention::{PassReport, Retention};
use berth::store::{Options, Role, Store};
use berth::task::TaskSpec;

use super::CliError;
use super::args::RunArgs;
use super::notify::notify;
use super::session::Session;

/// Runs the daemon with the session's config, on the session's data dir
/// (`--data-dir` or `BERTH_DATA_DIR` overrides the config's `data_dir`).
pub fn run(a: RunArgs, s: &Session) -> Result<(), CliError> {
    // A daemon gives freed memory back at once (see `berth::alloc`).
    berth::alloc::tune();
    let mut config = s
        .config
        .clone()
        .ok_or_else(|| CliError::input("berth run needs --config FILE (or BERTH_CONFIG)"))?;
    config.data_dir = s.dir.clone();
    check_backup_folder(&config)?;
    check_data_dir(s, &config)?;
    // Check the batch (every entry, as `enqueue --batch` does) before
    // touching the data dir.
    let kinds: Vec<String> = config.handlers.keys().cloned().collect();
    let batch = a
        .enqueue
        .as_deref()
        .map(|f| {
            super::commands::read_batch(f, &config.budget, Some(&kinds))
                .map(|specs| (f.to_path_buf(), specs))
        })
        .transpose()?;
    let engine = start_engine(&config)?;
    if let Some((f, specs)) = batch {
        enqueue_at_start(&engine, &f, specs)?;
    }
    install_signals(&engine)?;
    let swept = berth::engine::result_file::sweep(&std::env::temp_dir());
    if swept > 0 {
        log::info!(
            "removed {swept} result file(s) in {} left by processes that no longer run",
            std::env::temp_dir().display()
        );
    }
    log::info!(
        "berth running on {} (node {}, {} parallel queues, {} workers)",
        config.data_dir.display(),
        config.node.as_deref().unwrap_or("-"),
        config.engine.parallel_queues,
        config.engine.worker_count()
    );
    let summary = serve_and_run(&engine, &config, a.until_idle)?;
    finish(summary, a.until_idle)
}

/// A backup folder inside the data dir (which `--data-dir` may have
/// moved) is refused before anything starts: an export never writes there.
pub(super) fn check_backup_folder(config: &Config) -> Result<(), CliError> {
    let Some(b) = &config.backup else {
        return Ok(());
    };
    let canon = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let dir = std::path::absolute(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
    if canon(&b.path).starts_with(canon(&dir)) {
        return Err(CliError::input(format!(
            "{}:{}: key backup.path: {} is inside the data dir {}; backups go elsewhere",
            config.path.display(),
            b.path_line,
            b.path.display(),
            config.data_dir.display()
        )));
    }
    Ok(())
}

/// `--enqueue FILE`: the batch, all or nothing; entries with a compaction
/// key whose task still waits from an earlier start merge into it (see
/// `compaction`), so a restart adds nothing that already waits.
fn enqueue_at_start(engine: &Engine, f: &Path, specs: Vec<TaskSpec>) -> Result<(), CliError> {
    let merged = || {
        let c = engine.store().counting();
        c.counts
            .values()
            .map(|k| {
                k.values
                    .get(berth::store::counters::MERGED)
                    .copied()
                    .unwrap_or(0)
            })
            .sum::<u64>()
    };
    let (n, before) = (specs.len(), merged());
    let ids = ops::enqueue_batch(&Ctx::daemon(engine, &engine.kinds()), specs)
        .map_err(|e| e.context(&format!("batch file {}: ", f.display())))?;
    let m = merged().saturating_sub(before);
    log::info!(
        "{}: {} entries, {} merged into tasks that were waiting (same compaction key), {} new in \
         {} queue position(s)",
        f.display(),
        n,
        m,
        n as u64 - m.min(n as u64),
        ids.len()
    );
    Ok(())
}

/// What `berth run` (and `berth check`) refuse in the data dir `config`
/// names before touching anything: a path that is a file, or a folder that
/// holds other things, is a config error (exit 2, so that a supervisor
/// does not restart the daemon into it again), blamed on where the path
/// came from; a data dir whose database was lost is a damaged data dir
/// (exit 1), as opening it would say.
pub(super) fn check_data_dir(s: &Session, config: &Config) -> Result<(), CliError> {
    let place = match (s.dir_from, config.data_dir_line) {
        (Some(from), _) => from.to_string(),
        (None, Some(line)) => format!("{}:{line}: key data_dir", config.path.display()),
        (None, None) => format!("{}: data_dir (by default)", config.path.display()),
    };
    berth::store::may_become_data_dir(&config.data_dir)
        .map_err(|e| CliError::input(format!("{place}: {e}")))?;
    berth::store::check_not_lost(&config.data_dir)?;
    Ok(())
}

/// Opens the store as the daemon and builds the engine with a command
/// handler per kind; records the parallel queue count in the data dir.
fn start_engine(config: &Config) -> Result<Engine, CliError> {
    let opts = Options {
        durability: config.durability,
        write_ahead_log: config.write_ahead_log,
        budget: config.budget,
        role: Role::Daemon,
        disk_reserve: config.disk_reserve,
        ..Options::default()
    };
    let store = Arc::new(Store::open(&config.data_dir, opts, clock::system())?);
    let mut handlers = Handlers::new();
    for (kind, h) in &config.handlers {
        handlers.register(kind.clone(), h.clone());
    }
    let engine = Engine::new(store, handlers, config.engine.clone()).map_err(CliError::input)?;
    let store = engine.store();
    store
        .set_parallel_queues(config.engine.parallel_queues)
        .and_then(|()| store.set_node(&config.engine.routing()))
        .map_err(|e| CliError::runtime(format!("{}: {e}", config.data_dir.display())))?;
    Ok(engine)
}

/// SIGTERM, SIGINT and SIGHUP stop the engine; a second one exits at once,
/// with code 1, after freezing the store (nothing is written after it) and
/// killing the process groups of the handlers still running (their first
/// processes would die with berth by their death signal, but not what they
/// started in their group). (SIGHUP too: a closed terminal or session must
/// not kill the daemon like a crash, its default action, but stop it like
/// SIGTERM.) The signals are read on a thread of their own, not in a signal
/// handler, so that a second one can do that work.
fn install_signals(engine: &Engine) -> Result<(), CliError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let stop = engine.stop_handle();
    // Weak: the signal thread lives on, and must not keep the store from
    // closing (its last flush) at the end of a normal stop.
    let store = std::sync::Arc::downgrade(engine.store());
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| CliError::runtime(format!("installing signal handlers: {e}")))?;
    std::thread::Builder::new()
        .name("berth-signals".into())
        .spawn(move || {
            let mut first = true;
            for sig in signals.forever() {
                if std::mem::take(&mut first) {
                    stop.stop();
                    continue;
                }
                // Nothing is written after this: the attempts the kill
                // ends are left `running`, for the next start's recovery.
                let frozen = store.upgrade().is_none_or(|s| s.freeze(FREEZE_PATIENCE));
                let n = berth::engine::command::kill_running();
                log::warn!(
                    "a second signal ({}): exiting at once; killed {n} handler process group(s) still running",
                    signal_name(sig)
                );
                if !frozen {
                    log::warn!(
                        "a write was still under way after {FREEZE_PATIENCE:?}; exiting without waiting for it"
                    );
                }
                std::process::exit(1);
            }
        })
        .map_err(|e| CliError::runtime(format!("starting the signal thread: {e}")))?;
    Ok(())
}

/// How long a second signal waits for a write under way before it exits
/// (`Store::freeze`).
const FREEZE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

fn signal_name(sig: i32) -> &'static str {
    match sig {
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// Serves the control socket and runs the service thread while the engine
/// runs; stops them after. The daemon is ready (`READY=1`) once its socket
/// listens.
fn serve_and_run(
    engine: &Engine,
    config: &Config,
    until_idle: bool,
) -> Result<RunSummary, CliError> {
    let dir = &config.data_dir;
    let (server, listener) = control::Server::bind(dir).map_err(|e| {
        CliError::runtime(format!(
            "binding the control socket in {}: {e}",
            dir.display()
        ))
    })?;
    std::thread::scope(|scope| {
        let server = &server;
        scope.spawn(move || server.serve(scope, listener, engine));
        let (done, finished) = mpsc::channel::<()>();
        let service = scope.spawn(move || service(engine, config, finished));
        let (retention_done, retention_finished) = mpsc::channel::<()>();
        let retention =
            scope.spawn(move || retention(engine, &config.retention, retention_finished));
        notify(&format!(
            "READY=1\nSTATUS=serving {} (node {})",
            dir.display(),
            config.node.as_deref().unwrap_or("-")
        ));
        let r = if until_idle {
            engine.run_until_idle()
        } else {
            engine.run()
        };
        if r.is_err()
            && let Some(why) = engine.store().failure()
        {
            // Not even the scope's end: a connection thread may be inside
            // a sled flush that began before the failure and never returns.
            exit_store_failed(&why);
        }
        server.stop();
        drop(done);
        drop(retention_done);
        let _ = service.join();
        let _ = retention.join();
        r
    })
    .map_err(|e| match engine.store().failure() {
        Some(why) => exit_store_failed(&why),
        None => {
            // Logged now: closing the store (its final flush) comes after.
            log::error!("the engine stopped: {e}");
            CliError::runtime(format!("the engine stopped: {e}"))
        }
    })
}

/// The store can no longer write (see store/health.rs): the daemon stops at
/// once, with a code of its own, so that a supervisor restarts berth, which
/// reopens (and so repairs) the data dir. It kills its handlers and exits
/// without waiting for any thread: after a sled error, a thread that was
/// already inside sled (a flush, most often) may never come back. Nothing
/// here can panic on a full disk (stderr may be a file on it).
fn exit_store_failed(why: &str) -> ! {
    use std::io::Write;
    let n = berth::engine::command::kill_running();
    log::error!(
        "the store failed ({why}); stopping now (killed {n} running handler process \
         group(s)); the next start recovers the data dir"
    );
    let _ = writeln!(std::io::stderr(), "berth: the store failed: {why}");
    std::process::exit(super::EXIT_STORE_FAILED)
}

/// The daemon's retention thread (`retention.rs`): one pass at the start
/// and every `every` until `finished` closes. A failed pass is logged and
/// tried again at the next one; it never stops the daemon.
fn retention(engine: &Engine, r: &Retention, finished: mpsc::Receiver<()>) {
    loop {
        let started = Instant::now();
        match berth::retention::pass(engine.store(), r) {
            Ok(done) if done != PassReport::default() => log::info!(
                "retention pass in {:?}: {} finished tasks removed, {} log records archived, \
                 checkpoint {}, {} archive segments and {} checkpoints deleted",
                started.elapsed(),
                done.pruned,
                done.archived_records,
                done.checkpoint
                    .map_or("none".to_string(), |s| format!("of event {s}")),
                done.segments_deleted,
                done.checkpoints_deleted
            ),
            Ok(_) => {}
            Err(e) => log::warn!("retention pass failed (tried again in {:?}): {e}", r.every),
        }
        match finished.recv_timeout(r.every) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
}

/// How often the service thread looks at the stop flag and the clock.
const SERVICE_TICK: Duration = Duration::from_millis(100);

/// How often the service thread writes the data dir's high-water mark
/// (`Store::save_high_mark`: when commits were made since the last one).
/// Damage to sled's log that loses only the commits made since is not
/// seen at the next open.
const HIGH_MARK_EVERY: Duration = Duration::from_secs(5);

/// The daemon's service thread, while the engine runs (until `finished`
/// closes): tells the service manager `STOPPING=1` when a stop begins,
/// pings its watchdog every half timeout while the engine's loop goes round
/// (a loop stuck for longer than that is not pinged for, and systemd
/// restarts the daemon), writes the metrics textfile every interval, and
/// makes a backup every `[backup] every` (a failed one is logged and tried
/// again at the next interval), and writes the data dir's high-water mark
/// every [`HIGH_MARK_EVERY`].
/// At the end: one last textfile (which says the daemon no longer runs),
/// and `STOPPING=1` if not said yet.
fn service(engine: &Engine, config: &Config, finished: mpsc::Receiver<()>) {
    let stop = engine.stop_handle().flag();
    let watchdog = super::notify::watchdog();
    let mut stopping = false;
    let mut pinged = Instant::now();
    let mut written: Option<Instant> = None;
    let mut textfile = Textfile::new(config);
    let mut backups = Backups::new(config);
    let mut marked = Instant::now();
    let mut mark_failing = false;
    loop {
        // The engine's loop ends on a failed store, but a thread of its own
        // (the launcher, inside a flush) may never return from sled: the
        // daemon does not wait for it.
        if let Some(why) = engine.store().failure() {
            exit_store_failed(&why);
        }
        if !stopping && stop.load(Ordering::SeqCst) {
            stopping = true;
            notify("STOPPING=1\nSTATUS=stopping: waiting for the running tasks");
        }
        if let Some(timeout) = watchdog
            && pinged.elapsed() >= timeout / 2
            && engine
                .live()
                .heartbeat
                .is_some_and(|h| h.elapsed() < timeout / 2)
        {
            notify("WATCHDOG=1");
            pinged = Instant::now();
        }
        if written.is_none_or(|w| w.elapsed() >= config.metrics.interval) {
            textfile.write(engine);
            written = Some(Instant::now());
        }
        if !stopping {
            backups.tick(engine);
        }
        if marked.elapsed() >= HIGH_MARK_EVERY {
            match engine.store().save_high_mark() {
                Err(e) if !mark_failing => {
                    log::warn!(
                        "writing the data dir's high-water mark (tried again every \
                         {HIGH_MARK_EVERY:?}): {e}"
                    );
                    mark_failing = true;
                }
                Ok(_) if mark_failing => {
                    log::info!("writing the data dir's high-water mark works again");
                    mark_failing = false;
                }
                _ => {}
            }
            marked = Instant::now();
        }
        match finished.recv_timeout(SERVICE_TICK) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    textfile.write(engine);
    if !stopping {
        notify("STOPPING=1");
    }
}

/// The metrics textfile (`[metrics] textfile`), if the config has one.
struct Textfile {
    path: Option<PathBuf>,
    /// The last write failed (logged once until one works again).
    failing: bool,
}

impl Textfile {
    fn new(config: &Config) -> Self {
        Textfile {
            path: config.metrics.textfile.clone(),
            failing: false,
        }
    }

    fn write(&mut self, engine: &Engine) {
        let Some(path) = &self.path else {
            return;
        };
        let kinds = engine.kinds();
        let r = ops::metrics(&Ctx::daemon(engine, &kinds))
            .map_err(|e| e.to_string())
            .and_then(|f| {
                berth::metrics::write_textfile(path, &berth::metrics::render(&f))
                    .map_err(|e| e.to_string())
            });
        match r {
            Err(e) if !self.failing => {
                log::warn!("writing the metrics to {}: {e}", path.display());
                self.failing = true;
            }
            Ok(()) if self.failing => {
                log::info!("writing the metrics to {} works again", path.display());
                self.failing = false;
            }
            _ => {}
        }
    }
}

/// The periodic backups (`[backup]`), if the config asks for them: the
/// first one interval after the start, then every interval.
struct Backups {
    config: Option<berth::config::BackupConfig>,
    next: Instant,
}

impl Backups {
    fn new(config: &Config) -> Self {
        let every = config.backup.as_ref().map_or(Duration::ZERO, |b| b.every);
        Backups {
            config: config.backup.clone(),
            next: Instant::now() + every,
        }
    }

    fn tick(&mut self, engine: &Engine) {
        let Some(b) = &self.config else {
            return;
        };
        if Instant::now() < self.next {
            return;
        }
        self.next = Instant::now() + b.every;
        match backup(engine, b) {
            Ok(line) => log::info!("{line}"),
            Err(e) => log::warn!(
                "backup to {} failed (tried again in {}): {e}",
                b.path.display(),
                berth::units::format_duration(b.every)
            ),
        }
    }
}

/// One backup: every live task and the history to
/// `PATH/berth-backup-<time>.bex`, then the oldest beyond `keep` deleted.
fn backup(engine: &Engine, b: &berth::config::BackupConfig) -> Result<String, String> {
    let path = b
        .path
        .join(berth::backup::file_name(engine.store().clock().now_ms()));
    let kinds = engine.kinds();
    let sel = ops::Selection {
        history: true,
        ..ops::Selection::default()
    };
    let v = ops::export(&Ctx::daemon(engine, &kinds), &path, &sel).map_err(|e| e.to_string())?;
    let deleted = berth::backup::prune(&b.path, b.keep).map_err(|e| {
        format!(
            "the backup {} was written, but pruning failed: {e}",
            path.display()
        )
    })?;
    let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Ok(format!(
        "backup {}: {} tasks, {}; {} older backup(s) deleted",
        path.display(),
        n("tasks"),
        berth::units::format_size(n("bytes")),
        deleted.len()
    ))
}

/// Logs how the run ended and picks the exit code: a run until idle fails
/// (1) if a task ended as a dead letter or cannot start; a run stopped by a
/// signal, the routine end of a service, exits 0 (dead letters are in the
/// log line above, and for `task list --status dead`).
fn finish(summary: RunSummary, until_idle: bool) -> Result<(), CliError> {
    if summary.abandoned > 0 {
        let n = berth::engine::command::kill_running();
        log::warn!("killed {n} handler process group(s) still running after the grace period");
    }
    log::info!(
        "berth stopped: {} succeeded, {} failed attempts, {} dead letters, {} interrupted, {} \
         abandoned",
        summary.tally.succeeded,
        summary.tally.failed_attempts,
        summary.tally.dead_letters,
        summary.tally.interrupted,
        summary.abandoned
    );
    if summary.stuck > 0 {
        return Err(CliError::runtime(format!(
            "{} task(s) cannot start and were left in their queues (see the errors logged above)",
            summary.stuck
        )));
    }
    if until_idle && summary.tally.dead_letters > 0 {
        return Err(CliError::runtime(format!(
            "{} task(s) ended as dead letters",
            summary.tally.dead_letters
        )));
    }
    Ok(())
}
