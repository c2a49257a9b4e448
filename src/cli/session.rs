//! Where a command's request goes: to the daemon when one answers on the
//! data dir's socket, and otherwise through the same operation on the data
//! dir opened here (`ops::execute` either way, so the answer is the same).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use berth::budget::Budget;
use berth::clock;
use berth::config::Config;
use berth::control::{self, CallError};
use berth::ops::{self, Access, Ctx, OpError, Request};
use berth::store::order::OrderError;
use berth::store::{Discard, OpenError, Options, Role, Store, WriteError};
use serde_json::Value;

use super::CliError;
use super::args::{Cli, Command};

/// What asking the daemon gave.
enum Asked {
    /// A daemon answered (or failed to, in a way that says one is there).
    Answer(Result<Value, OpError>),
    /// No socket, or nothing listens on it.
    NoDaemon,
    /// A socket this process cannot use (`CallError::Unreachable`); why.
    Unreachable(String),
}

/// Where a request went.
enum Answer {
    /// A daemon answered.
    Daemon(Result<Value, OpError>),
    /// No daemon: the data dir, opened here.
    Here(Box<Store>),
}

/// What opening `dir`, not a data dir yet, makes, to take away again when
/// its first write is refused (see `Store::discard_on_close`): the topmost
/// of the folders that do not exist, or what goes into an empty folder
/// (whose mode the open changes). None when `dir` is a data dir already,
/// or not an empty folder (the open refuses it).
fn fresh(dir: &Path) -> Option<Discard> {
    if let Ok(mut entries) = std::fs::read_dir(dir) {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)
            .ok()
            .map(|m| m.permissions().mode() & 0o7777);
        return entries.next().is_none().then(|| Discard {
            path: dir.to_path_buf(),
            whole: false,
            mode,
        });
    }
    if std::fs::symlink_metadata(dir).is_ok() {
        return None; // not a folder: the open says so
    }
    let mut top = dir;
    while let Some(parent) = top.parent() {
        if parent.as_os_str().is_empty() || std::fs::symlink_metadata(parent).is_ok() {
            break;
        }
        top = parent;
    }
    Some(Discard {
        path: top.to_path_buf(),
        whole: true,
        mode: None,
    })
}

/// What every command runs with: the data dir, and what the config (if
/// one is given) says about it.
#[derive(Debug, Clone)]
pub struct Session {
    pub dir: PathBuf,
    /// How long to wait for a daemon's answer, and for a starting daemon's
    /// socket (`--timeout`).
    pub timeout: Duration,
    /// The size budget a command checks a payload against before sending it.
    pub budget: Budget,
    pub disk_reserve: u64,
    /// The loaded `--config`, if one was given.
    pub config: Option<Config>,
    /// The option or variable that gave `dir` (`--data-dir`,
    /// `BERTH_DATA_DIR`), if one did.
    pub dir_from: Option<&'static str>,
}

impl Session {
    /// `--data-dir` (or `BERTH_DATA_DIR`) when given, else the config's
    /// `data_dir`, else `./berth-data`; the budget, the disk reserve and
    /// `write_ahead_log` from the config, or their defaults.
    /// `data_dir_from` names the option or variable that gave the data dir,
    /// if one did.
    pub fn from_args(cli: &Cli, data_dir_from: Option<&'static str>) -> Result<Session, CliError> {
        // `run` and `check` check what the config names on this machine;
        // the other commands take only its values (see
        // `Config::load_for_commands`).
        let load = match cli.command {
            Command::Run(_) | Command::Check => Config::load,
            _ => Config::load_for_commands,
        };
        let config = match &cli.config {
            Some(path) => Some(load(path).map_err(|e| CliError::input(e.to_string()))?),
            None => None,
        };
        let dir = match (&config, data_dir_from) {
            (Some(c), None) => c.data_dir.clone(),
            _ => cli.data_dir.clone(),
        };
        Ok(Session {
            dir,
            dir_from: data_dir_from,
            timeout: cli.timeout,
            budget: config.as_ref().map_or_else(Budget::default, |c| c.budget),
            disk_reserve: config
                .as_ref()
                .map_or(berth::store::DEFAULT_DISK_RESERVE, |c| c.disk_reserve),
            config,
        })
    }

    /// Asks the daemon, if one listens on the data dir's socket.
    fn ask_daemon(&self, req: &Request) -> Asked {
        if !control::socket_path(&self.dir).exists() {
            return Asked::NoDaemon;
        }
        match control::call(&self.dir, req, self.timeout) {
            Err(CallError::NoDaemon) => Asked::NoDaemon,
            Err(CallError::Unreachable(why)) => Asked::Unreachable(why),
            Err(e @ (CallError::TimedOut { .. } | CallError::Failed(_))) => {
                Asked::Answer(Err(OpError::runtime(e.to_string())))
            }
            Ok(resp) => Asked::Answer(resp.into_result()),
        }
    }

    /// Options to open the data dir here for `access`.
    pub fn options(&self, access: Access) -> Options {
        Options {
            create: access == Access::Create,
            read_only: access == Access::Read,
            budget: self.budget,
            disk_reserve: self.disk_reserve,
            write_ahead_log: self.config.as_ref().is_none_or(|c| c.write_ahead_log),
            ..Options::default()
        }
    }

    /// Runs `req`: through the daemon when one answers, else on the data dir
    /// opened here as the request needs ([`Access`]: to read, it must be a
    /// berth data dir and nothing in it changes). A daemon that holds the
    /// data dir but does not answer yet, or that waits for the lock (right
    /// after a restart), is starting: the command waits for its socket, up
    /// to `--timeout`, instead of failing.
    pub fn run(&self, req: Request) -> Result<Value, OpError> {
        self.run_with(req, None)
    }

    /// [`Session::run`], with `progress` told how far a long read has come
    /// when the command runs the operation itself (`ops::Ctx::progress`).
    pub fn run_with(
        &self,
        req: Request,
        progress: Option<&(dyn Fn(u64, u64) + Sync)>,
    ) -> Result<Value, OpError> {
        let fresh = (req.access() == Access::Create)
            .then(|| fresh(&self.dir))
            .flatten();
        match self.connect(&req)? {
            Answer::Daemon(answer) => answer,
            Answer::Here(store) => {
                let answer = self.execute(&store, req, progress);
                // A first write refused (for disk space, say) leaves no data
                // dir behind (see `Store::discard_on_close`).
                if answer.is_err()
                    && let Some(fresh) = fresh
                {
                    store.discard_on_close(fresh);
                }
                answer
            }
        }
    }

    /// Runs `first`, then each request `then` makes of the previous answer,
    /// until it makes none: all through the daemon when one answered the
    /// first, or all on the data dir opened here once (a paged read, such
    /// as `berth log`'s).
    pub fn run_each(
        &self,
        first: Request,
        mut then: impl FnMut(Value) -> Result<Option<Request>, CliError>,
    ) -> Result<(), CliError> {
        let mut here: Option<Box<Store>> = None;
        let mut next = Some(first);
        while let Some(req) = next.take() {
            let answer = match &here {
                Some(store) => self.execute(store, req, None)?,
                None => match self.connect(&req)? {
                    Answer::Daemon(answer) => answer?,
                    Answer::Here(store) => {
                        let store = here.insert(store);
                        self.execute(store, req, None)?
                    }
                },
            };
            next = then(answer)?;
        }
        Ok(())
    }

    fn execute(
        &self,
        store: &Store,
        req: Request,
        progress: Option<&(dyn Fn(u64, u64) + Sync)>,
    ) -> Result<Value, OpError> {
        let kinds = self.kinds();
        let ctx = Ctx {
            progress,
            parallel_queues: self.config.as_ref().map(|c| c.engine.parallel_queues),
            ..Ctx::direct(Some(store), kinds.as_deref())
        };
        ops::execute(&ctx, req)
    }

    /// The daemon's answer to `req` when one answers, else the data dir
    /// opened here as `req` needs ([`Access`]: to read, it must be a berth
    /// data dir and nothing in it changes). A daemon that holds the data
    /// dir but does not answer yet, or that waits for the lock (right after
    /// a restart), is starting: this waits for its socket, up to
    /// `--timeout`, instead of failing.
    fn connect(&self, req: &Request) -> Result<Answer, OpError> {
        let start = Instant::now();
        let mut rehearsed = false;
        // Why the socket, which is there, could not be used.
        let mut unreachable = None;
        loop {
            match self.ask_daemon(req) {
                Asked::Answer(answer) => return Ok(Answer::Daemon(answer)),
                Asked::NoDaemon => {}
                Asked::Unreachable(why) => unreachable = Some(why),
            }
            if !rehearsed && self.may_refuse(req) {
                self.rehearse(req)?;
                rehearsed = true;
            }
            let opts = self.options(req.access());
            match Store::open(&self.dir, opts, clock::system()) {
                Ok(store) => return Ok(Answer::Here(Box::new(store))),
                // A daemon holds the data dir, and its socket is not this
                // command's to use: waiting would not change that.
                Err(e @ OpenError::InUse { .. }) if unreachable.is_some() => {
                    let why = unreachable.unwrap_or_default();
                    let mut err = OpError::from(e);
                    err.message = format!("{why}; {}", err.message);
                    return Err(err);
                }
                Err(OpenError::InUse { holder, .. })
                    if holder.role == Some(Role::Daemon) && start.elapsed() < self.timeout =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Whether the data dir could refuse `req`: what it holds
    /// ([`Request::refusable`]), or its disk's space, for work added where
    /// less than the reserve plus the largest record's need is free.
    fn may_refuse(&self, req: &Request) -> bool {
        req.refusable()
            || (req.adds_work()
                && self.dir.exists()
                && berth::store::space_may_refuse(&self.dir, self.disk_reserve))
    }

    /// Tries `req` (one that the data dir could refuse:
    /// [`Session::may_refuse`]) on a read-only open, and returns its
    /// refusal, so that a refused change opens nothing to write: the data
    /// dir's files stay exactly as they were. A request the data dir would take gets as
    /// far as its commit, which the read-only store refuses; it then runs
    /// on the data dir opened to write (and is checked there again, against
    /// the state then). A data dir that does not exist yet (no folder, or a
    /// folder without `berth.dir` and `db/`, which an `enqueue` would make
    /// one) holds no task to anchor to. One that does not open to read is
    /// refused with that error when it is lost, damaged or of another
    /// format (no open mends that); other errors (in use, say) are left to
    /// the writable open.
    fn rehearse(&self, req: &Request) -> Result<(), OpError> {
        let is_data_dir = ["berth.dir", "db"]
            .iter()
            .any(|n| std::fs::symlink_metadata(self.dir.join(n)).is_ok());
        if !is_data_dir {
            return match req.anchor() {
                Some(anchor) => Err(WriteError::Order(OrderError::NotQueued(anchor)).into()),
                None => Ok(()),
            };
        }
        let store = match Store::open(&self.dir, self.options(Access::Read), clock::system()) {
            Ok(store) => store,
            // What no open can mend is refused here, before the writable
            // open writes its lock line and sled its marks.
            Err(
                e @ (OpenError::Lost { .. }
                | OpenError::Damaged { .. }
                | OpenError::Format { .. }
                | OpenError::NotAFolder { .. }),
            ) => return Err(e.into()),
            Err(_) => return Ok(()),
        };
        match self.execute(&store, req.clone(), None) {
            Err(e) if !e.is_read_only_refusal() => Err(e),
            _ => Ok(()),
        }
    }

    /// The kinds the config has handlers for (`None` without a config, or
    /// with one that has no handler: nothing to check a kind against).
    pub fn kinds(&self) -> Option<Vec<String>> {
        self.config
            .as_ref()
            .filter(|c| !c.handlers.is_empty())
            .map(|c| c.handlers.keys().cloned().collect())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
