//! `berth run`: the engine as an edge node daemon. The first SIGTERM,
//! SIGINT or SIGHUP stops dispatching and waits for running handlers (the
//! grace period); a second one exits at once (running tasks are then
//! recovered at the next start).

use std::sync::Arc;

use berth::clock;
use berth::config::Config;
use berth::control;
use berth::engine::{Engine, Handlers};
use berth::ops::{self, Ctx};
use berth::store::{Options, Role, Store};
use berth::submit;

use super::args::RunArgs;
use super::{CliError, read_file};

/// `data_dir`, when given on the command line or in BERTH_DATA_DIR,
/// overrides the config's `data_dir`.
pub fn run(a: RunArgs, data_dir: Option<&std::path::Path>) -> Result<(), CliError> {
    let mut config = Config::load(&a.config).map_err(|e| CliError::input(e.to_string()))?;
    if let Some(d) = data_dir {
        config.data_dir = d.to_path_buf();
    }
    // Check the batch before touching the data dir.
    let batch = match &a.enqueue {
        Some(f) => {
            let text = read_file(f, "batch file")?;
            Some((
                f.clone(),
                submit::parse_batch(&text)
                    .map_err(|e| CliError::input(format!("batch file {}: {e}", f.display())))?,
            ))
        }
        None => None,
    };
    let opts = Options {
        durability: config.durability,
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
    let engine =
        Engine::new(store.clone(), handlers, config.engine.clone()).map_err(CliError::input)?;
    store
        .set_parallel_queues(config.engine.parallel_queues)
        .map_err(|e| CliError::runtime(format!("{}: {e}", config.data_dir.display())))?;
    if let Some((f, specs)) = batch {
        let ids = ops::enqueue_batch(&Ctx::daemon(&engine), specs)
            .map_err(|e| e.context(&format!("batch file {}: ", f.display())))?;
        log::info!("enqueued {} task(s) from {}", ids.len(), f.display());
    }
    let stop = engine.stop_handle().flag();
    // SIGHUP too: a closed terminal or session must not kill the daemon
    // like a crash (its default action), but stop it like SIGTERM.
    for sig in [
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ] {
        // A second signal, arriving when the flag is already set, exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .map_err(|e| CliError::runtime(format!("installing signal handlers: {e}")))?;
    }
    log::info!(
        "berth running on {} (node {}, {} parallel queues, {} workers)",
        config.data_dir.display(),
        config.node.as_deref().unwrap_or("-"),
        config.engine.parallel_queues,
        config.engine.worker_count()
    );
    let (server, listener) = control::Server::bind(&config.data_dir).map_err(|e| {
        CliError::runtime(format!(
            "binding the control socket in {}: {e}",
            config.data_dir.display()
        ))
    })?;
    let summary = std::thread::scope(|scope| {
        let engine = &engine;
        let server = &server;
        scope.spawn(move || server.serve(scope, listener, engine));
        let r = if a.until_idle {
            engine.run_until_idle()
        } else {
            engine.run()
        };
        server.stop();
        r
    })
    .map_err(|e| match store.failure() {
        // The store can no longer write (see store/health.rs): stop at once,
        // with a code of our own, so that a supervisor restarts berth, which
        // reopens (and so repairs) the data dir.
        Some(why) => {
            let n = berth::engine::command::kill_running();
            log::error!(
                "the store failed ({why}); stopping now (killed {n} running handler process \
                 group(s)); the next start recovers the data dir"
            );
            CliError {
                code: super::EXIT_STORE_FAILED,
                message: format!("the store failed: {why}"),
            }
        }
        None => CliError::runtime(format!("the engine stopped: {e}")),
    })?;
    if summary.abandoned > 0 {
        let n = berth::engine::command::kill_running();
        log::warn!("killed {n} handler process group(s) still running after the grace period");
    }
    log::info!(
        "berth stopped: {} succeeded, {} failed attempts, {} dead letters, {} abandoned",
        summary.tally.succeeded,
        summary.tally.failed_attempts,
        summary.tally.dead_letters,
        summary.abandoned
    );
    if summary.stuck > 0 {
        return Err(CliError::runtime(format!(
            "{} task(s) cannot start (corrupt records; see the log) and were left in their queues",
            summary.stuck
        )));
    }
    if summary.tally.dead_letters > 0 {
        return Err(CliError::runtime(format!(
            "{} task(s) ended as dead letters",
            summary.tally.dead_letters
        )));
    }
    Ok(())
}
