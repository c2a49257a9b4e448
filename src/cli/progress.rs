//! A progress bar for long reads (`replay`, `log`, `verify`): on stderr,
//! only when stderr is a terminal, and only once the work has taken more
//! than [`DELAY`]; otherwise nothing is printed at all. The bar is cleared
//! when the work ends, so it leaves no trace in the output.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long work runs before a bar appears.
pub const DELAY: Duration = Duration::from_millis(500);

pub struct Progress {
    what: &'static str,
    start: Instant,
    /// Whether a bar may be shown (stderr is a terminal).
    shown: bool,
    bar: OnceLock<ProgressBar>,
}

impl Progress {
    /// Progress of `what` (e.g. "events replayed").
    pub fn new(what: &'static str) -> Progress {
        use std::io::IsTerminal;
        Progress {
            what,
            start: Instant::now(),
            shown: std::io::stderr().is_terminal(),
            bar: OnceLock::new(),
        }
    }

    /// `done` of `total` so far; draws once [`DELAY`] has passed.
    pub fn set(&self, done: u64, total: u64) {
        if !self.shown {
            return;
        }
        let bar = match self.bar.get() {
            Some(bar) => bar,
            None if self.start.elapsed() < DELAY => return,
            None => self.bar.get_or_init(|| {
                let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
                let style = ProgressStyle::with_template(&format!(
                    "{{bar:30}} {{pos}}/{{len}} {} ({{eta}} left)",
                    self.what
                ))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
                bar.set_style(style);
                bar
            }),
        };
        bar.set_length(total);
        bar.set_position(done);
    }

    /// The work has ended: the bar (if one was drawn) is cleared.
    pub fn finish(&self) {
        if let Some(bar) = self.bar.get() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
