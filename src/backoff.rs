//! Retry delays, exactly addon-operator's by default: after the first
//! failure a retry waits `initial`; after n >= 2 failures it waits
//! `initial + 2^(n-2) s + random [0, 1 s)`, the part added to `initial`
//! truncated to 100 ms (`initial` is kept as given), all capped at `max`:
//! 5, 6.x, 7.x, 9.x, 13.x, 21.x, 32, 32 ... s.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    /// 0 = retry forever.
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(32),
            max_attempts: 0,
        }
    }
}

impl Backoff {
    /// The wait before the next attempt of a task that has failed `failures`
    /// times (1 after its first failure). `jitter_ms` is the random part,
    /// in [0, 1000).
    pub fn delay(&self, failures: u32, jitter_ms: u64) -> Duration {
        let initial = self.initial.as_millis() as u64;
        let ms = if failures <= 1 {
            initial
        } else {
            let exp = (failures - 2).min(40);
            let grow = 1000u64
                .saturating_mul(1u64 << exp)
                .saturating_add(jitter_ms.min(999));
            initial.saturating_add(grow - grow % 100)
        };
        Duration::from_millis(ms.min(self.max.as_millis() as u64))
    }

    /// The delay with fresh randomness.
    pub fn delay_random(&self, failures: u32) -> Duration {
        self.delay(failures, fastrand::u64(0..1000))
    }

    /// Whether a task that has failed `failures` times has used up its attempts.
    pub fn exhausted(&self, failures: u32) -> bool {
        self.max_attempts != 0 && failures >= self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(d: Duration) -> f64 {
        d.as_millis() as f64 / 1000.0
    }

    #[test]
    fn the_default_sequence_is_addon_operators() {
        let b = Backoff::default();
        let low: Vec<f64> = (1..=9).map(|n| secs(b.delay(n, 0))).collect();
        assert_eq!(low, vec![5.0, 6.0, 7.0, 9.0, 13.0, 21.0, 32.0, 32.0, 32.0]);
        let high: Vec<f64> = (1..=8).map(|n| secs(b.delay(n, 999))).collect();
        assert_eq!(high, vec![5.0, 6.9, 7.9, 9.9, 13.9, 21.9, 32.0, 32.0]);
        // The jitter is truncated to 100 ms.
        assert_eq!(b.delay(6, 457), Duration::from_millis(21_400));
    }

    #[test]
    fn initial_is_kept_as_given_and_only_the_growth_is_truncated() {
        let b = Backoff {
            initial: Duration::from_millis(1_990),
            ..Backoff::default()
        };
        assert_eq!(b.delay(1, 999), Duration::from_millis(1_990));
        assert_eq!(b.delay(2, 457), Duration::from_millis(1_990 + 1_400));
        assert_eq!(b.delay(3, 0), Duration::from_millis(1_990 + 2_000));
        let quick = Backoff {
            initial: Duration::from_millis(90),
            ..Backoff::default()
        };
        assert_eq!(quick.delay(1, 0), Duration::from_millis(90), "not 0");
        assert_eq!(quick.delay(2, 999), Duration::from_millis(1_990));
    }

    #[test]
    fn random_delays_stay_in_their_window() {
        let b = Backoff::default();
        for _ in 0..200 {
            let d = b.delay_random(3).as_millis();
            assert!((7000..=7900).contains(&d) && d % 100 == 0, "{d}");
        }
    }

    #[test]
    fn settings_change_the_curve_and_attempts() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(10),
            max_attempts: 3,
        };
        assert_eq!(b.delay(1, 0), Duration::from_secs(1));
        assert_eq!(b.delay(2, 0), Duration::from_secs(2));
        assert_eq!(b.delay(20, 0), Duration::from_secs(10));
        assert!(!b.exhausted(2));
        assert!(b.exhausted(3));
        assert!(!Backoff::default().exhausted(1_000_000));
    }
}
