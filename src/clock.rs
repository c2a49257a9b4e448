//! Time as berth sees it: milliseconds since the Unix epoch, from a [`Clock`]
//! that tests can replace with a [`FakeClock`] they move by hand.
//!
//! Everything time-dependent (timestamps, backoff, statuses, TTLs) asks a
//! `Clock`; nothing else in the crate calls `SystemTime::now()`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> u64;

    /// Moves time forward to `ms` instead of waiting for it, if this clock
    /// can (a fake clock in auto-advance mode). The engine calls it only when
    /// nothing is running, so tests of backoff run instantly and in order.
    fn skip_to(&self, _ms: u64) -> bool {
        false
    }
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when a test tells it to (or, in auto-advance
/// mode, when the engine would otherwise wait). Clones share one time.
#[derive(Debug, Clone)]
pub struct FakeClock {
    now: Arc<AtomicU64>,
    auto: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeClock {
    pub fn new(start_ms: u64) -> Self {
        FakeClock {
            now: Arc::new(AtomicU64::new(start_ms)),
            auto: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }
    /// A fake clock that jumps to the engine's next deadline instead of waiting.
    pub fn auto_advancing(start_ms: u64) -> Self {
        let c = Self::new(start_ms);
        c.auto.store(true, Ordering::SeqCst);
        c
    }
    pub fn advance_ms(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
    pub fn set_ms(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn skip_to(&self, ms: u64) -> bool {
        if !self.auto.load(Ordering::SeqCst) {
            return false;
        }
        self.now.fetch_max(ms, Ordering::SeqCst);
        true
    }
}

/// A shared handle to some clock.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock, shared.
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_moves_only_when_told_and_clones_share_time() {
        let c = FakeClock::new(1_000);
        let d = c.clone();
        assert_eq!(c.now_ms(), 1_000);
        d.advance_ms(250);
        assert_eq!(c.now_ms(), 1_250);
        c.set_ms(7);
        assert_eq!(d.now_ms(), 7);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
