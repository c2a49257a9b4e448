//! The daemon's TOML config (`berth run --config FILE`). Paths in it are
//! relative to the config file's folder. Errors name the file, the line and
//! the key, and say what is wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::backoff::Backoff;
use crate::budget::{Budget, MAX_OBJECT_CEILING};
use crate::engine::EngineConfig;
use crate::engine::command::{CommandHandler, CommandSpec};
use crate::retention::Retention;
use crate::store::Durability;
use crate::task::check_name;
use crate::units::{parse_duration, parse_size};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a table of keys")]
struct Raw {
    data_dir: Option<Spanned<String>>,
    node: Option<Spanned<String>>,
    #[serde(default)]
    tags: Vec<Spanned<String>>,
    parallel_queues: Option<Spanned<usize>>,
    workers: Option<Spanned<usize>>,
    durability: Option<Spanned<String>>,
    write_ahead_log: Option<bool>,
    flush_interval: Option<Spanned<String>>,
    grace: Option<Spanned<String>>,
    #[serde(default)]
    retry: RawRetry,
    #[serde(default)]
    budget: RawBudget,
    #[serde(default)]
    disk: RawDisk,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    retention: RawRetention,
    #[serde(default)]
    backup: RawBackup,
    #[serde(default)]
    handlers: BTreeMap<String, Spanned<RawHandler>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a [metrics] table")]
struct RawMetrics {
    textfile: Option<Spanned<String>>,
    interval: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a [retention] table")]
struct RawRetention {
    history: Option<Spanned<String>>,
    history_max: Option<Spanned<usize>>,
    log_age: Option<Spanned<String>>,
    log_size: Option<Spanned<RawSize>>,
    archive_age: Option<Spanned<String>>,
    archive_size: Option<Spanned<RawSize>>,
    every: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a [backup] table")]
struct RawBackup {
    every: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    keep: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a [retry] table")]
struct RawRetry {
    initial: Option<Spanned<String>>,
    max: Option<Spanned<String>>,
    max_attempts: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a [budget] table")]
struct RawBudget {
    compress_over: Option<Spanned<RawSize>>,
    max_object: Option<Spanned<RawSize>>,
    max_decompressed: Option<Spanned<RawSize>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, expecting = "a [disk] table")]
struct RawDisk {
    reserve: Option<Spanned<RawSize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a [handlers.KIND] table")]
struct RawHandler {
    command: Spanned<Vec<String>>,
    pre: Option<Spanned<Vec<String>>>,
    post: Option<Spanned<Vec<String>>>,
    timeout: Option<Spanned<String>>,
    cwd: Option<Spanned<String>>,
    #[serde(default)]
    env: BTreeMap<String, Spanned<String>>,
}

/// A size as the config writes it: text (`"64MiB"`, `"4096"`) or a TOML
/// integer, a number of bytes.
#[derive(Debug)]
enum RawSize {
    Text(String),
    Bytes(u64),
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawSize;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size: a number of bytes, or text such as \"64MiB\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_string()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawSize, E> {
                u64::try_from(v)
                    .map(RawSize::Bytes)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl RawSize {
    /// The number of bytes, checked as a size string is (`units::parse_size`).
    fn bytes(&self) -> Result<u64, String> {
        match self {
            RawSize::Text(t) => parse_size(t),
            RawSize::Bytes(n) if *n > u64::MAX / 2 => Err(format!("{n} is too large")),
            RawSize::Bytes(n) => Ok(*n),
        }
    }
}

/// Why `name = value` cannot go into a process's environment, if it cannot:
/// an empty name, or one with `=` or a NUL byte; a value with a NUL byte.
fn env_problem(name: &str, value: &str) -> Option<String> {
    if name.is_empty() {
        Some("an environment variable's name must not be empty".into())
    } else if name.contains('=') {
        Some(format!(
            "the environment variable name {name:?} contains '=', which a name cannot hold"
        ))
    } else if name.contains('\0') {
        Some(format!(
            "the environment variable name {name:?} contains a NUL byte"
        ))
    } else if value.contains('\0') {
        Some(format!(
            "the value of {name} contains a NUL byte, which an environment cannot hold"
        ))
    } else {
        None
    }
}

/// Why `path` is not a folder to use, if it is not: it does not exist,
/// or it is something else.
fn not_a_folder(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(format!("{} is not a folder", path.display())),
        Err(_) => Some(format!("the folder {} does not exist", path.display())),
    }
}

/// A loaded, checked config.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub data_dir: PathBuf,
    /// The line that gives `data_dir` (None: the default, `berth-data`).
    pub data_dir_line: Option<usize>,
    pub node: Option<String>,
    pub tags: Vec<String>,
    pub durability: Durability,
    /// Commits made durable by berth's write-ahead log (`Options::write_ahead_log`).
    pub write_ahead_log: bool,
    pub budget: Budget,
    /// Disk space kept free on the data dir's filesystem (0: no guard).
    pub disk_reserve: u64,
    pub engine: EngineConfig,
    pub handlers: BTreeMap<String, CommandHandler>,
    /// Where and how often the daemon writes its metrics (`[metrics]`).
    pub metrics: MetricsConfig,
    /// What the daemon keeps of the history, the log and the archive.
    pub retention: Retention,
    /// Periodic backups (`[backup]`); None: off.
    pub backup: Option<BackupConfig>,
}

/// `[backup]`: every `every` the daemon exports every live task and the
/// history to `PATH/berth-backup-<RFC 3339 time>.bex`, keeping the newest
/// `keep` (see `backup`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupConfig {
    pub every: Duration,
    /// The folder.
    pub path: PathBuf,
    /// The config's line that names it, for errors found later (a folder
    /// inside the data dir `--data-dir` chose).
    pub path_line: usize,
    pub keep: usize,
}

/// How many backups `[backup]` keeps unless `keep` says.
pub const DEFAULT_BACKUP_KEEP: usize = 7;

/// `[metrics]`: the daemon writes `berth metrics` to `textfile` (for
/// node_exporter's textfile collector) every `interval`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// None: no textfile.
    pub textfile: Option<PathBuf>,
    pub interval: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            textfile: None,
            interval: Duration::from_secs(15),
        }
    }
}

/// A config error: file, line and key.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct ConfigError {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

struct Ctx<'a> {
    path: &'a Path,
    text: &'a str,
    /// Also check what the config names on this machine: commands, their
    /// folders (`Config::load` does; parsing alone does not).
    on_this_machine: bool,
    /// A config without a `[handlers.KIND]` table is an error (a daemon
    /// would have nothing to run tasks with).
    need_handlers: bool,
}

impl Ctx<'_> {
    fn err(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: &str,
        what: impl std::fmt::Display,
    ) -> ConfigError {
        self.err_at(span, Some(key), what)
    }
    /// Reads the TOML into [`Raw`]. A syntax error names its line; a
    /// type error, an unknown or a missing key also names the key, by the
    /// path serde took to it.
    fn deserialize(&self) -> Result<Raw, ConfigError> {
        let de = toml::Deserializer::parse(self.text).map_err(|e| {
            let span = e.span().or_else(|| self.line_that_fails(e.message()));
            let message = match e.message() {
                "recursion limit" => "recursion limit: keys, tables or values nested too deeply",
                m => m,
            };
            self.err_at(span, None, message)
        })?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = key_of(e.path());
            let inner = e.into_inner();
            self.err_at(inner.span(), key.as_deref(), inner.message())
        })
    }
    /// For a parse error the parser gives no place for (too deep a
    /// nesting: `recursion limit`): the start of the first line whose end
    /// the text cannot be parsed up to without that error (the text up to
    /// the end of any later line fails the same way), found by bisection.
    fn line_that_fails(&self, message: &str) -> Option<std::ops::Range<usize>> {
        let ends: Vec<usize> = self
            .text
            .match_indices('\n')
            .map(|(i, _)| i)
            .chain([self.text.len()])
            .collect();
        let fails = |k: usize| {
            toml::Deserializer::parse(&self.text[..ends[k]])
                .is_err_and(|e| e.span().is_none() && e.message() == message)
        };
        let (mut lo, mut hi) = (0, ends.len() - 1);
        if !fails(hi) {
            return None;
        }
        while lo < hi {
            let mid = (lo + hi) / 2;
            match fails(mid) {
                true => hi = mid,
                false => lo = mid + 1,
            }
        }
        let start = if lo == 0 { 0 } else { ends[lo - 1] + 1 };
        Some(start..start)
    }
    fn line_of(&self, span: &std::ops::Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    }
    /// An error at `span`: under `key` when there is one.
    fn err_at(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: Option<&str>,
        what: impl std::fmt::Display,
    ) -> ConfigError {
        ConfigError {
            path: self.path.to_path_buf(),
            line: span.map(|s| self.line_of(&s)),
            message: match key {
                Some(k) => format!("key {k}: {what}"),
                None => what.to_string(),
            },
        }
    }
    fn duration(
        &self,
        v: &Option<Spanned<String>>,
        key: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) => parse_duration(s.get_ref()).map_err(|e| self.err(Some(s.span()), key, e)),
        }
    }
    /// A duration that must be more than zero.
    fn positive_duration(
        &self,
        v: &Option<Spanned<String>>,
        key: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let d = self.duration(v, key, default)?;
        if d.is_zero() {
            let span = v.as_ref().map(|s| s.span());
            return Err(self.err(span, key, "must be more than 0"));
        }
        Ok(d)
    }

    fn size(
        &self,
        v: &Option<Spanned<RawSize>>,
        key: &str,
        default: usize,
    ) -> Result<usize, ConfigError> {
        match v {
            None => Ok(default),
            Some(s) => s
                .get_ref()
                .bytes()
                .and_then(|n| usize::try_from(n).map_err(|_| format!("{n} is too large")))
                .map_err(|e| self.err(Some(s.span()), key, e)),
        }
    }
}

/// The dotted key serde was reading when it failed (`retry.max_attempts`,
/// `handlers.Run.timeout`), without the private fields of `toml::Spanned`.
/// None at the top level, where no key was being read.
fn key_of(path: &serde_path_to_error::Path) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut key = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Map { key: k } if k.starts_with("$__serde_spanned") => {}
            Segment::Map { key: k } | Segment::Enum { variant: k } => {
                if !key.is_empty() {
                    key.push('.');
                }
                key.push_str(k);
            }
            Segment::Seq { index } => key.push_str(&format!("[{index}]")),
            Segment::Unknown => {}
        }
    }
    (!key.is_empty()).then_some(key)
}

fn spanned<T>(v: &Option<Spanned<T>>) -> Option<std::ops::Range<usize>> {
    v.as_ref().map(|s| s.span())
}

fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// Resolves argv[0] against the config folder when it is a relative path
/// (contains a `/`); a bare name is looked up in PATH as written.
fn resolve_argv(base: &Path, argv: &[String]) -> Vec<String> {
    let mut v = argv.to_vec();
    if let Some(first) = v.first_mut()
        && first.contains('/')
        && !Path::new(first.as_str()).is_absolute()
    {
        *first = base.join(first.as_str()).to_string_lossy().into_owned();
    }
    v
}

/// Whether `prog` (a path with a `/`, already resolved, or a bare name
/// looked up in `PATH`) names an executable file; the error says why not.
fn runnable(prog: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if prog.contains('/') {
        let p = Path::new(prog);
        return match std::fs::metadata(p) {
            Err(_) => Err(format!("{prog} does not exist")),
            Ok(m) if !m.is_file() => Err(format!("{prog} is not a file")),
            Ok(_) if !executable(p) => Err(format!("{prog} is not executable (chmod +x it)")),
            Ok(_) => Ok(()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| executable(&d.join(prog))) {
        return Ok(());
    }
    Err(format!(
        "'{prog}' is not found in PATH ({}); write its full path, or ./name for a file beside the config",
        path.to_string_lossy()
    ))
}

/// A config file's text (at most 16 MiB, UTF-8) and its absolute path:
/// handlers run in their own cwd, so paths must not depend on ours.
fn read_text(path: &Path) -> Result<(PathBuf, String), ConfigError> {
    // A config is a few KiB; 16 MiB is no config.
    let text = std::fs::File::open(path)
        .and_then(|f| crate::frame::read_file_capped(f, 16 << 20))
        .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
        .map_err(|e| ConfigError {
            path: path.to_path_buf(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    Ok((abs, text))
}

impl Config {
    /// Reads and checks a config file, also what it names on this machine:
    /// every handler's command (a path must be an executable file, a bare
    /// name must be found in `PATH`) and its `cwd` (a folder). What `berth
    /// run` and `berth check` read.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let (abs, text) = read_text(path)?;
        Self::parse_with(&abs, &text, true, true)
    }

    /// Reads and checks a config file as the commands other than `run` and
    /// `check` need it (they take the data dir, the budget, the disk
    /// reserve, `write_ahead_log` and the handlers' kinds from it): every
    /// value is checked, but not what it names on this machine, and it may
    /// have no handler, so that `queue list` works while a handler's
    /// program is being deployed.
    pub fn load_for_commands(path: &Path) -> Result<Config, ConfigError> {
        let (abs, text) = read_text(path)?;
        Self::parse_with(&abs, &text, false, false)
    }

    /// Parses config text read from `path`, checking every value but not
    /// what it names on this machine (see [`Config::load`]).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        Self::parse_with(path, text, false, true)
    }

    fn parse_with(
        path: &Path,
        text: &str,
        on_this_machine: bool,
        need_handlers: bool,
    ) -> Result<Config, ConfigError> {
        let cx = Ctx {
            path,
            text,
            on_this_machine,
            need_handlers,
        };
        let raw = cx.deserialize()?;
        let base = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if let Some(d) = &raw.data_dir
            && d.get_ref().trim().is_empty()
        {
            return Err(cx.err(
                Some(d.span()),
                "data_dir",
                "must not be empty (it would put the data next to the config file)",
            ));
        }
        let data_dir = match &raw.data_dir {
            Some(d) => cx.path(&base, d, "data_dir")?,
            None => resolve(&base, "berth-data"),
        };
        if let Some(n) = &raw.node {
            check_name("node", n.get_ref()).map_err(|e| cx.err(Some(n.span()), "node", e))?;
        }
        for t in &raw.tags {
            check_name("tag", t.get_ref()).map_err(|e| cx.err(Some(t.span()), "tags", e))?;
        }
        let budget = cx.budget(&raw.budget)?;
        let engine = cx.engine(&raw)?;
        let backup = cx.backup(&raw.backup, &base, &data_dir)?;
        Ok(Config {
            path: path.to_path_buf(),
            data_dir_line: raw.data_dir.as_ref().map(|d| cx.line_of(&d.span())),
            data_dir,
            node: engine.node.clone(),
            tags: raw.tags.iter().map(|t| t.get_ref().clone()).collect(),
            durability: cx.durability(&raw)?,
            write_ahead_log: raw.write_ahead_log.unwrap_or(true),
            disk_reserve: cx.size(
                &raw.disk.reserve,
                "disk.reserve",
                crate::store::DEFAULT_DISK_RESERVE as usize,
            )? as u64,
            metrics: cx.metrics(&raw.metrics, &base)?,
            retention: cx.retention(&raw.retention)?,
            backup,
            handlers: cx.handlers(&raw, &base, &budget)?,
            budget,
            engine,
        })
    }
}

impl Ctx<'_> {
    /// The path a key gives, against the config's folder `base`; one that
    /// no system call can take (a NUL byte) is refused with its line.
    fn path(&self, base: &Path, p: &Spanned<String>, key: &str) -> Result<PathBuf, ConfigError> {
        if p.get_ref().contains('\0') {
            return Err(self.err(Some(p.span()), key, "the path contains a NUL byte"));
        }
        Ok(resolve(base, p.get_ref()))
    }

    fn durability(&self, raw: &Raw) -> Result<Durability, ConfigError> {
        // Checked whatever the mode, so that a bad value is found before
        // someone turns `batched` on.
        let interval = self.positive_duration(
            &raw.flush_interval,
            "flush_interval",
            Duration::from_millis(100),
        )?;
        // The flusher sleeps this long between flushes: less would keep a
        // core busy flushing.
        if interval < Duration::from_millis(1) {
            return Err(self.err(
                spanned(&raw.flush_interval),
                "flush_interval",
                "must be at least 1ms",
            ));
        }
        match raw
            .durability
            .as_ref()
            .map(|s| (s.get_ref().as_str(), s.span()))
        {
            None | Some(("sync", _)) => Ok(Durability::Sync),
            Some(("batched", _)) => Ok(Durability::Batched { interval }),
            Some((other, span)) => Err(self.err(
                Some(span),
                "durability",
                format!("'{other}' is not a mode (use \"sync\" or \"batched\")"),
            )),
        }
    }

    fn budget(&self, b: &RawBudget) -> Result<Budget, ConfigError> {
        let d = Budget::default();
        let budget = Budget {
            compress_over: self.size(&b.compress_over, "budget.compress_over", d.compress_over)?,
            max_object: self.size(&b.max_object, "budget.max_object", d.max_object)?,
            max_decompressed: self.size(
                &b.max_decompressed,
                "budget.max_decompressed",
                d.max_decompressed,
            )?,
        };
        if let Err(m) = budget.validate() {
            // Blame the key the failed check is about.
            let (key, span) = if budget.max_object == 0 || budget.max_object > MAX_OBJECT_CEILING {
                ("budget.max_object", spanned(&b.max_object))
            } else {
                (
                    "budget.max_decompressed",
                    spanned(&b.max_decompressed).or(spanned(&b.max_object)),
                )
            };
            return Err(self.err(span, key, m));
        }
        Ok(budget)
    }

    fn engine(&self, raw: &Raw) -> Result<EngineConfig, ConfigError> {
        let b = Backoff::default();
        let backoff = Backoff {
            initial: self.duration(&raw.retry.initial, "retry.initial", b.initial)?,
            max: self.duration(&raw.retry.max, "retry.max", b.max)?,
            max_attempts: raw.retry.max_attempts.unwrap_or(0),
        };
        let e = EngineConfig::default();
        let engine = EngineConfig {
            parallel_queues: raw
                .parallel_queues
                .as_ref()
                .map_or(e.parallel_queues, |s| *s.get_ref()),
            workers: raw.workers.as_ref().map_or(0, |s| *s.get_ref()),
            backoff,
            grace: self.duration(&raw.grace, "grace", e.grace)?,
            node: raw.node.as_ref().map(|s| s.get_ref().clone()),
            tags: raw.tags.iter().map(|t| t.get_ref().clone()).collect(),
            ..e
        };
        if let Err(m) = engine.validate() {
            let (key, span) = if !(1..=1000).contains(&engine.parallel_queues) {
                (
                    "parallel_queues",
                    raw.parallel_queues.as_ref().map(|s| s.span()),
                )
            } else if engine.workers > 4096 {
                ("workers", raw.workers.as_ref().map(|s| s.span()))
            } else {
                let r = &raw.retry;
                ("retry.initial", spanned(&r.initial).or(spanned(&r.max)))
            };
            return Err(self.err(span, key, m));
        }
        Ok(engine)
    }

    /// `[metrics]`: a textfile path (relative to the config's folder) whose
    /// folder exists, and an interval of at least 1s.
    fn metrics(&self, m: &RawMetrics, base: &Path) -> Result<MetricsConfig, ConfigError> {
        let d = MetricsConfig::default();
        let interval = self.positive_duration(&m.interval, "metrics.interval", d.interval)?;
        if interval < Duration::from_secs(1) {
            return Err(self.err(
                spanned(&m.interval),
                "metrics.interval",
                "must be at least 1s",
            ));
        }
        let textfile = match &m.textfile {
            None => None,
            Some(t) if !t.get_ref().ends_with(".prom") => {
                return Err(self.err(
                    Some(t.span()),
                    "metrics.textfile",
                    "must end with .prom (node_exporter's textfile collector reads only *.prom)",
                ));
            }
            Some(t) => {
                let path = self.path(base, t, "metrics.textfile")?;
                let dir = path.parent().unwrap_or(base);
                if self.on_this_machine {
                    let why = match not_a_folder(dir) {
                        Some(why) => Some(why),
                        None if path.is_dir() => {
                            Some(format!("{} is a folder, not a file", path.display()))
                        }
                        None => None,
                    };
                    if let Some(why) = why {
                        return Err(self.err(Some(t.span()), "metrics.textfile", why));
                    }
                }
                Some(path)
            }
        };
        Ok(MetricsConfig { textfile, interval })
    }

    /// `[retention]`: durations and sizes more than zero; `every` at least 1s.
    fn retention(&self, r: &RawRetention) -> Result<Retention, ConfigError> {
        let d = Retention::default();
        let size = |v: &Option<Spanned<RawSize>>, key: &str, default: u64| {
            let n = self.size(v, key, default as usize)? as u64;
            if n == 0 {
                return Err(self.err(spanned(v), key, "must be more than 0"));
            }
            Ok(n)
        };
        let history_max = match &r.history_max {
            None => d.history_max,
            Some(n) if *n.get_ref() == 0 => {
                return Err(self.err(
                    Some(n.span()),
                    "retention.history_max",
                    "must be more than 0",
                ));
            }
            Some(n) => *n.get_ref(),
        };
        let every = self.positive_duration(&r.every, "retention.every", d.every)?;
        if every < Duration::from_secs(1) {
            return Err(self.err(spanned(&r.every), "retention.every", "must be at least 1s"));
        }
        Ok(Retention {
            history_age: self.positive_duration(&r.history, "retention.history", d.history_age)?,
            history_max,
            log_age: self.positive_duration(&r.log_age, "retention.log_age", d.log_age)?,
            log_size: size(&r.log_size, "retention.log_size", d.log_size)?,
            archive_age: self.positive_duration(
                &r.archive_age,
                "retention.archive_age",
                d.archive_age,
            )?,
            archive_size: size(&r.archive_size, "retention.archive_size", d.archive_size)?,
            every,
        })
    }

    /// `[backup]`: off without `every` and `path`; with one of them, the
    /// other is needed. `every` at least 1s, `keep` at least 1, and the
    /// folder exists and is not inside the data dir.
    fn backup(
        &self,
        b: &RawBackup,
        base: &Path,
        data_dir: &Path,
    ) -> Result<Option<BackupConfig>, ConfigError> {
        let (every, path) = match (&b.every, &b.path) {
            (None, None) => {
                if let Some(k) = &b.keep {
                    return Err(self.err(
                        Some(k.span()),
                        "backup.keep",
                        "backups need backup.every and backup.path",
                    ));
                }
                return Ok(None);
            }
            (Some(e), Some(p)) => (e, p),
            (Some(e), None) => {
                return Err(self.err(
                    Some(e.span()),
                    "backup.path",
                    "backups need a folder (path = \"/var/backups/berth\")",
                ));
            }
            (None, Some(p)) => {
                return Err(self.err(
                    Some(p.span()),
                    "backup.every",
                    "backups need an interval (every = \"1h\")",
                ));
            }
        };
        let d = self.positive_duration(&b.every, "backup.every", Duration::from_secs(3600))?;
        if d < Duration::from_secs(1) {
            return Err(self.err(Some(every.span()), "backup.every", "must be at least 1s"));
        }
        let keep = b
            .keep
            .as_ref()
            .map_or(DEFAULT_BACKUP_KEEP, |k| *k.get_ref());
        if keep == 0 {
            let span = b.keep.as_ref().map(|k| k.span());
            return Err(self.err(span, "backup.keep", "must be at least 1"));
        }
        let folder = self.path(base, path, "backup.path")?;
        if path.get_ref().trim().is_empty() {
            return Err(self.err(Some(path.span()), "backup.path", "must not be empty"));
        }
        if folder.starts_with(data_dir) {
            return Err(self.err(
                Some(path.span()),
                "backup.path",
                format!(
                    "{} is inside the data dir {}; backups go elsewhere",
                    folder.display(),
                    data_dir.display()
                ),
            ));
        }
        if self.on_this_machine
            && let Some(why) = not_a_folder(&folder)
        {
            return Err(self.err(Some(path.span()), "backup.path", why));
        }
        Ok(Some(BackupConfig {
            every: d,
            path: folder,
            path_line: self.line_of(&path.span()),
            keep,
        }))
    }

    /// One command handler per `[handlers.KIND]` table.
    fn handlers(
        &self,
        raw: &Raw,
        base: &Path,
        budget: &Budget,
    ) -> Result<BTreeMap<String, CommandHandler>, ConfigError> {
        if raw.handlers.is_empty() && self.need_handlers {
            // No line to point at: the error names the key that is missing.
            return Err(self.err_at(
                None,
                Some("handlers"),
                "no [handlers.KIND] table: a daemon would have nothing to run tasks with",
            ));
        }
        let mut handlers = BTreeMap::new();
        for (kind, h) in &raw.handlers {
            let key = format!("handlers.{kind}");
            check_name("kind", kind).map_err(|e| self.err(Some(h.span()), &key, e))?;
            let hr = h.get_ref();
            let timeout = self.positive_duration(
                &hr.timeout,
                &format!("{key}.timeout"),
                Duration::from_secs(600),
            )?;
            let cwd = match &hr.cwd {
                Some(c) => self.path(base, c, &format!("{key}.cwd"))?,
                None => resolve(base, "."),
            };
            if self.on_this_machine
                && let Some(why) = not_a_folder(&cwd)
            {
                return Err(self.err(
                    hr.cwd.as_ref().map(|c| c.span()).or(Some(h.span())),
                    &format!("{key}.cwd"),
                    why,
                ));
            }
            // What a process's environment cannot hold would fail every
            // attempt; refuse it here.
            for (name, value) in &hr.env {
                if let Some(why) = env_problem(name, value.get_ref()) {
                    // A name a key path can show names the key.
                    let at = match name.is_empty() || name.contains(['=', '\0']) {
                        true => format!("{key}.env"),
                        false => format!("{key}.env.{name}"),
                    };
                    return Err(self.err(Some(value.span()), &at, why));
                }
            }
            let env: BTreeMap<String, String> = hr
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.get_ref().clone()))
                .collect();
            let mk = |argv: &Spanned<Vec<String>>,
                      name: &str|
             -> Result<CommandSpec, ConfigError> {
                let key = format!("{key}.{name}");
                if argv.get_ref().is_empty() {
                    return Err(self.err(Some(argv.span()), &key, "the command must not be empty"));
                }
                // It would fail every attempt ("cannot start"); refuse it here.
                if let Some(i) = argv.get_ref().iter().position(|a| a.contains('\0')) {
                    let why = match i {
                        0 => "the program's name contains a NUL byte, which a process cannot take"
                            .to_string(),
                        i => format!(
                            "argument {i} contains a NUL byte, which a process's arguments cannot \
                             hold"
                        ),
                    };
                    return Err(self.err(Some(argv.span()), &key, why));
                }
                let resolved = resolve_argv(base, argv.get_ref());
                if self.on_this_machine
                    && let Err(why) = runnable(&resolved[0])
                {
                    return Err(self.err(Some(argv.span()), &key, why));
                }
                Ok(CommandSpec {
                    argv: resolved,
                    cwd: cwd.clone(),
                    env: env.clone(),
                    timeout,
                })
            };
            handlers.insert(
                kind.clone(),
                CommandHandler {
                    run: mk(&hr.command, "command")?,
                    pre: hr.pre.as_ref().map(|p| mk(p, "pre")).transpose()?,
                    post: hr.post.as_ref().map(|p| mk(p, "post")).transpose()?,
                    max_output: budget.max_decompressed,
                },
            );
        }
        Ok(handlers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/berth/berth.toml"), text)
    }

    #[test]
    fn the_documented_skeleton_parses() {
        let c = parse(
            r#"
data_dir = "berth-data"
node = "edge-1"
tags = ["gluster"]
parallel_queues = 10
workers = 12
durability = "sync"
write_ahead_log = true
[retry]
initial = "5s"
max = "32s"
max_attempts = 0
[budget]
compress_over = "100KiB"
max_object = "1.5MiB"
[metrics]
textfile = "/var/lib/prometheus/node-exporter/berth.prom"
interval = "15s"
[handlers.ModuleRun]
command = ["./hooks/module-run.sh", "--verbose"]
pre = ["./hooks/check.sh"]
post = ["./hooks/verify.sh"]
timeout = "10m"
cwd = "."
env = { HELM_NAMESPACE = "d8" }
"#,
        )
        .unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/etc/berth/berth-data"));
        assert_eq!(c.engine.worker_count(), 12);
        assert_eq!(c.budget.max_object, 1_572_864);
        let h = &c.handlers["ModuleRun"];
        assert_eq!(
            h.run.argv,
            vec!["/etc/berth/./hooks/module-run.sh", "--verbose"]
        );
        assert_eq!(h.run.timeout, Duration::from_secs(600));
        assert_eq!(h.run.env["HELM_NAMESPACE"], "d8");
        assert!(h.pre.is_some() && h.post.is_some());
        assert_eq!(c.engine.node.as_deref(), Some("edge-1"));
        assert_eq!(c.engine.tags, vec!["gluster".to_string()]);
        assert_eq!(
            c.metrics.textfile,
            Some(PathBuf::from(
                "/var/lib/prometheus/node-exporter/berth.prom"
            ))
        );
        assert_eq!(c.metrics.interval, Duration::from_secs(15));
        assert_eq!(c.backup, None);
        assert!(c.write_ahead_log);
        let h = "[handlers.K]\ncommand = [\"x\"]\n";
        let off = parse(&format!("write_ahead_log = false\n{h}")).unwrap();
        assert!(!off.write_ahead_log);
        assert!(parse(h).unwrap().write_ahead_log, "on by default");
        let c = parse(
            "[backup]\nevery = \"30m\"\npath = \"backups\"\n[handlers.K]\ncommand = [\"x\"]\n",
        )
        .unwrap();
        assert_eq!(
            c.backup,
            Some(BackupConfig {
                every: Duration::from_secs(1800),
                path: PathBuf::from("/etc/berth/backups"),
                path_line: 3,
                keep: DEFAULT_BACKUP_KEEP,
            })
        );
    }

    #[test]
    fn errors_name_the_file_line_and_key() {
        let e = parse("node = \"edge-1\"\n[retry]\ninitial = \"soon\"\n").unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("/etc/berth/berth.toml:3: key retry.initial: 'soon' is not a duration"),
            "{m}"
        );
        let e = parse("nodes = \"x\"\n").unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("/etc/berth/berth.toml:1: ") && m.contains("unknown field `nodes`"),
            "{m}"
        );
        let e = parse("\nwrite_ahead_log = \"yes\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/etc/berth/berth.toml:2: ") && e.contains("write_ahead_log"),
            "{e}"
        );
        let e = parse("durability = \"sometimes\"\n").unwrap_err();
        assert!(
            e.to_string()
                .contains(":1: key durability: 'sometimes' is not a mode"),
            "{e}"
        );
        let e = parse("[handlers.Run]\ncommand = []\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/etc/berth/berth.toml:2: key handlers.Run.command: the command must not be empty"
        );
        // Nothing to point at for a table that is missing: the key is named.
        for text in ["", "node = \"edge-1\"\n"] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, None);
            assert_eq!(
                e.to_string(),
                "/etc/berth/berth.toml: key handlers: no [handlers.KIND] table: a daemon would \
                 have nothing to run tasks with"
            );
        }
    }

    /// Each case: the config text, and the start of its error after the file name.
    fn assert_error(text: &str, expected: &str) {
        let m = match parse(text) {
            Ok(_) => panic!("{text:?} was accepted"),
            Err(e) => e.to_string(),
        };
        let rest = m
            .strip_prefix("/etc/berth/berth.toml:")
            .unwrap_or_else(|| panic!("{text:?}: the error does not name the file: {m}"));
        assert!(rest.starts_with(expected), "{text:?}: {m}");
    }

    #[test]
    fn type_errors_name_the_line_and_the_key() {
        assert_error(
            "node = \"edge-1\"\nparallel_queues = \"ten\"\n",
            "2: key parallel_queues: invalid type: string \"ten\", expected usize",
        );
        assert_error(
            "workers = -1\n",
            "1: key workers: invalid value: integer `-1`",
        );
        assert_error("grace = 5\n", "1: key grace: invalid type: integer `5`");
        assert_error(
            "tags = [\"a\", 3]\n",
            "1: key tags[1]: invalid type: integer `3`",
        );
        // Nested tables: the whole dotted path.
        assert_error(
            "node = \"a\"\n[retry]\ninitial = \"1s\"\nmax_attempts = \"x\"\n",
            "4: key retry.max_attempts: invalid type: string \"x\", expected u32",
        );
        assert_error(
            "[handlers.X]\ncommand = [\"a\"]\ntimeout = 5\n",
            "3: key handlers.X.timeout: invalid type: integer `5`, expected a string",
        );
        assert_error(
            "[handlers.X]\ncommand = [\"a\", 3]\n",
            "2: key handlers.X.command[1]: invalid type: integer `3`",
        );
        assert_error(
            "[handlers.X]\ncommand = [\"a\"]\nenv = { A = 1 }\n",
            "3: key handlers.X.env.A: invalid type: integer `1`",
        );
        assert_error(
            "handlers.X.command = 5\n",
            "1: key handlers.X.command: invalid type: integer `5`, expected a sequence",
        );
        assert_error(
            "retry = 3\n",
            "1: key retry: invalid type: integer `3`, expected a [retry] table",
        );
        assert_error(
            "[handlers]\nX = \"run.sh\"\n",
            "2: key handlers.X: invalid type: string \"run.sh\", expected a [handlers.KIND] table",
        );
        assert_error(
            "[budget]\nmax_object = -1\n",
            "2: key budget.max_object: invalid value: integer `-1`, expected a size: a number \
             of bytes, or text such as \"64MiB\"",
        );
        assert_error(
            "[budget]\nmax_object = 1.5\n",
            "2: key budget.max_object: invalid type: floating point `1.5`, expected a size",
        );
    }

    const HANDLER: &str = "[handlers.X]\ncommand = [\"a\"]\n";

    #[test]
    fn sizes_may_be_integers_of_bytes_and_must_be_whole_bytes() {
        let c = parse(&format!(
            "[budget]\nmax_object = 1000\ncompress_over = 0\nmax_decompressed = 4096\n\
             [disk]\nreserve = 0\n[retention]\nlog_size = 65536\narchive_size = \"1.5KiB\"\n\
             {HANDLER}"
        ))
        .unwrap();
        assert_eq!(c.budget.max_object, 1000);
        assert_eq!(c.budget.compress_over, 0);
        assert_eq!(c.budget.max_decompressed, 4096);
        assert_eq!(c.disk_reserve, 0);
        assert_eq!(c.retention.log_size, 65536);
        assert_eq!(c.retention.archive_size, 1536);
        // The same range checks as for text.
        assert_error(
            &format!("[budget]\nmax_object = 0\n{HANDLER}"),
            "2: key budget.max_object: max_object must be between",
        );
        assert_error(
            &format!("[retention]\nlog_size = 0\n{HANDLER}"),
            "2: key retention.log_size: must be more than 0",
        );
        // A part of a byte: refused, not rounded; a larger unit's decimals
        // round to the nearest byte.
        assert_error(
            &format!("[budget]\nmax_object = \"0.5\"\n{HANDLER}"),
            "2: key budget.max_object: '0.5' is not a whole number of bytes",
        );
        let c = Config::parse(
            Path::new("/etc/berth/berth.toml"),
            &format!("[disk]\nreserve = \"1.1MiB\"\n{HANDLER}"),
        )
        .unwrap();
        assert_eq!(c.disk_reserve, 1_153_434);
    }

    #[test]
    fn a_handler_env_that_no_process_can_take_is_refused() {
        for (env, expected) in [
            (
                "{ Z = \"x\\u0000y\" }",
                "3: key handlers.X.env.Z: the value of Z contains a NUL byte",
            ),
            (
                "{ \"A=B\" = \"x\" }",
                "3: key handlers.X.env: the environment variable name \"A=B\" contains '='",
            ),
            (
                "{ \"\" = \"y\" }",
                "3: key handlers.X.env: an environment variable's name must not be empty",
            ),
            (
                "{ \"A\\u0000\" = \"y\" }",
                "3: key handlers.X.env: the environment variable name \"A\\0\" contains a NUL",
            ),
        ] {
            assert_error(&format!("{HANDLER}env = {env}\n"), expected);
        }
        let c = parse(&format!("{HANDLER}env = {{ A = \"\", B_2 = \"x=y\" }}\n")).unwrap();
        assert_eq!(c.handlers["X"].run.env["A"], "");
        assert_eq!(c.handlers["X"].run.env["B_2"], "x=y");
    }

    #[test]
    fn a_handler_command_that_no_process_can_take_is_refused() {
        for (command, expected) in [
            (
                "[\"true\", \"a\\u0000b\"]",
                "2: key handlers.X.command: argument 1 contains a NUL byte",
            ),
            (
                "[\"tr\\u0000ue\"]",
                "2: key handlers.X.command: the program's name contains a NUL byte",
            ),
        ] {
            assert_error(&format!("[handlers.X]\ncommand = {command}\n"), expected);
        }
        let pre = "[handlers.X]\ncommand = [\"true\"]\npre = [\"true\", \"\\u0000\"]\n";
        assert_error(pre, "3: key handlers.X.pre: argument 1 contains a NUL byte");
    }

    #[test]
    fn a_key_nested_too_deeply_is_refused_with_its_line() {
        let deep = "a.".repeat(200);
        assert_error(
            &format!("{HANDLER}\n# a comment\n{deep}b = 1\nc = 2\n"),
            "5: recursion limit: keys, tables or values nested too deeply",
        );
    }

    #[test]
    fn a_flush_interval_under_a_millisecond_is_refused() {
        // Also where it is not used yet (`sync`, the default).
        assert_error(
            &format!("flush_interval = \"soon\"\n{HANDLER}"),
            "1: key flush_interval: 'soon' is not a duration",
        );
        assert_error(
            &format!("durability = \"sync\"\nflush_interval = \"0ms\"\n{HANDLER}"),
            "2: key flush_interval: must be more than 0",
        );
        assert_error(
            &format!("durability = \"batched\"\nflush_interval = \"1ns\"\n{HANDLER}"),
            "2: key flush_interval: must be at least 1ms",
        );
        assert_error(
            &format!("durability = \"batched\"\nflush_interval = \"999us\"\n{HANDLER}"),
            "2: key flush_interval: must be at least 1ms",
        );
        let c = parse(&format!(
            "durability = \"batched\"\nflush_interval = \"1ms\"\n{HANDLER}"
        ))
        .unwrap();
        assert_eq!(
            c.durability,
            Durability::Batched {
                interval: Duration::from_millis(1)
            }
        );
    }

    #[test]
    fn unknown_and_missing_keys_and_bad_values_name_the_key() {
        assert_error(
            "[retry]\nbogus = 1\n",
            "2: key retry.bogus: unknown field `bogus`, expected one of `initial`",
        );
        assert_error(
            "[handlers.X]\ntimeout = \"5s\"\n",
            "1: key handlers.X: missing field `command`",
        );
        assert_error(
            "parallel_queues = 0\n",
            "1: key parallel_queues: parallel_queues must be between 1 and 1000",
        );
        assert_error(
            "\nworkers = 5000\n",
            "2: key workers: workers must be at most 4096",
        );
        assert_error(
            "[retry]\ninitial = \"1m\"\n",
            "2: key retry.initial: retry.initial must not be larger than retry.max",
        );
        assert_error(
            "[budget]\nmax_object = \"100MiB\"\n",
            "2: key budget.max_object: max_object must be between",
        );
        assert_error(
            "[budget]\nmax_decompressed = \"1KiB\"\n",
            "2: key budget.max_decompressed: max_decompressed must be at least max_object",
        );
        assert_error(
            "[metrics]\ntextfile = \"berth.txt\"\n",
            "2: key metrics.textfile: must end with .prom",
        );
        assert_error(
            "[metrics]\ninterval = \"10ms\"\n",
            "2: key metrics.interval: must be at least 1s",
        );
        assert_error(
            "[backup]\nevery = \"1h\"\n",
            "2: key backup.path: backups need a folder",
        );
        assert_error(
            "[backup]\npath = \"/b\"\n",
            "2: key backup.every: backups need an interval",
        );
        assert_error(
            "[backup]\nkeep = 3\n",
            "2: key backup.keep: backups need backup.every and backup.path",
        );
        assert_error(
            "[backup]\nevery = \"10ms\"\npath = \"/b\"\n",
            "2: key backup.every: must be at least 1s",
        );
        assert_error(
            "[backup]\nevery = \"1h\"\npath = \"/b\"\nkeep = 0\n",
            "4: key backup.keep: must be at least 1",
        );
        assert_error(
            "[backup]\nevery = \"1h\"\npath = \"berth-data/b\"\n",
            "3: key backup.path: /etc/berth/berth-data/b is inside the data dir",
        );
        assert_error(
            "[backup]\nevery = \"soon\"\npath = \"/b\"\n",
            "2: key backup.every: 'soon' is not a duration",
        );
        assert_error(
            "[backup]\nevery = \"1h\"\npath = \"/b\"\nkept = 3\n",
            "4: key backup.kept: unknown field `kept`",
        );
        // A syntax error has no key to name; it names the line.
        assert_error("node = \"a\"\nnode = = 1\n", "2: ");
    }
}
