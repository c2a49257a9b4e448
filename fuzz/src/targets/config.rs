//! The daemon's TOML config (`berth::config::Config::parse`).
//!
//! Asserts:
//! - parsing never panics;
//! - a config that parses is one the daemon can run with: its budget and
//!   engine settings validate, every name in it follows the name rule,
//!   every handler has a command, every duration can be added to the
//!   clock (a deadline, a retry time) without overflowing, and a batched
//!   store flushes at some positive interval;
//! - a refused config names the file, and a line of it or a key.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use berth::config::Config;
use berth::store::Durability;
use berth::task::check_name;

const PATH: &str = "/etc/berth/berth.toml";

fn usable(what: &str, d: Duration) {
    assert!(
        Instant::now().checked_add(d).is_some(),
        "{what} = {d:?} cannot be a deadline"
    );
    assert!(
        SystemTime::now().checked_add(d).is_some(),
        "{what} = {d:?} cannot be added to the time of day"
    );
    assert!(
        u64::try_from(d.as_millis()).is_ok(),
        "{what} = {d:?} has more milliseconds than a u64 holds"
    );
}

pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new(PATH);
    match Config::parse(path, text) {
        Ok(c) => {
            c.budget
                .validate()
                .unwrap_or_else(|e| panic!("a config that parses has a bad budget: {e}"));
            c.engine
                .validate()
                .unwrap_or_else(|e| panic!("a config that parses has bad engine settings: {e}"));
            assert!(c.data_dir.is_absolute(), "data_dir {:?}", c.data_dir);
            if let Some(n) = &c.node {
                check_name("node", n).unwrap();
            }
            for t in &c.tags {
                check_name("tag", t).unwrap();
            }
            usable("grace", c.engine.grace);
            usable("retry.initial", c.engine.backoff.initial);
            usable("retry.max", c.engine.backoff.max);
            if let Durability::Batched { interval } = c.durability {
                usable("flush_interval", interval);
                assert!(
                    !interval.is_zero(),
                    "a batched store that flushes every 0 s spins"
                );
            }
            for (kind, h) in &c.handlers {
                check_name("kind", kind).unwrap();
                for (step, spec) in [
                    ("command", Some(&h.run)),
                    ("pre", h.pre.as_ref()),
                    ("post", h.post.as_ref()),
                ] {
                    let Some(spec) = spec else { continue };
                    assert!(!spec.argv.is_empty(), "handlers.{kind}.{step} is empty");
                    usable(&format!("handlers.{kind}.timeout"), spec.timeout);
                }
            }
        }
        Err(e) => {
            assert_eq!(e.path, path, "the error names the file");
            let message = e.to_string();
            assert!(
                message.starts_with(PATH),
                "the error starts with the file: {message}"
            );
            assert!(
                e.line.is_some() || e.message.starts_with("key "),
                "the error names neither a line nor a key: {message}"
            );
            if let Some(line) = e.line {
                let lines = text.split('\n').count();
                assert!(
                    (1..=lines).contains(&line),
                    "line {line} of a {lines}-line file: {message}"
                );
            }
        }
    }
}
