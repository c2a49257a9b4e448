//! Sizes, durations and times (`berth::units`), as config files and flags
//! give them.
//!
//! Asserts:
//! - parsing never panics;
//! - a size that parses is at most u64::MAX / 2, a plain integer parses to
//!   exactly itself, and the size as berth shows it (`format_size`) parses
//!   back to within its rounding (0.05 of its unit), unless that rounding
//!   goes past the largest size;
//! - a duration that parses can be used: added to the clock as a deadline
//!   or a time of day, and counted in milliseconds in a u64;
//! - a duration as berth shows it (`format_duration`), when it parses,
//!   parses back to within its rounding (50 ms);
//! - a time (`--since`, `--at`: RFC 3339, with or without an offset,
//!   milliseconds, or a duration ago) that parses, shown as berth shows
//!   times (`format_time`, RFC 3339 in UTC), parses back to itself.

use std::time::{Duration, Instant, SystemTime};

use berth::units::{
    format_duration, format_size, format_time, parse_duration, parse_size, parse_time,
};

/// The time the durations of `parse_time` count back from.
const NOW_MS: u64 = 1_796_040_000_000;
/// The first millisecond of the year 10000, which RFC 3339 cannot write.
const YEAR_10000_MS: u64 = 253_402_300_800_000;

pub fn units(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(n) = parse_size(text) {
        assert!(n <= u64::MAX / 2, "{text:?} parsed to {n}");
        let t = text.trim();
        if !t.is_empty()
            && t.bytes().all(|b| b.is_ascii_digit())
            && let Ok(exact) = t.parse::<u64>()
        {
            assert_eq!(n, exact, "{text:?} is a plain number of bytes");
        }
        let shown = format_size(n);
        let unit = [1u64 << 30, 1 << 20, 1 << 10]
            .into_iter()
            .find(|u| n >= *u)
            .unwrap_or(1);
        match parse_size(&shown) {
            // Half a tenth of the unit, and an f64's error on the way back.
            Ok(back) => assert!(
                back.abs_diff(n) <= unit / 20 + (n >> 40) + 1,
                "{text:?} = {n} shows as {shown:?}, which parses as {back}"
            ),
            // Rounded up past the largest size: only at the very top.
            Err(e) => assert!(n > u64::MAX / 2 - unit / 20 - 1, "{shown:?} ({n}): {e}"),
        }
    }
    if let Ok(d) = parse_duration(text) {
        assert!(
            Instant::now().checked_add(d).is_some(),
            "{text:?} = {d:?} cannot be a deadline"
        );
        assert!(
            SystemTime::now().checked_add(d).is_some(),
            "{text:?} = {d:?} cannot be added to the time of day"
        );
        assert!(
            u64::try_from(d.as_millis()).is_ok(),
            "{text:?} = {d:?} has more milliseconds than a u64 holds"
        );
        // Shown to a tenth of a second (`21.4s`), and `7260.01s` as `7260s`:
        // what parses back is within 50 ms.
        let shown = format_duration(d);
        if let Ok(back) = parse_duration(&shown) {
            let ms = |d: Duration| d.as_millis() as i128;
            assert!(
                (ms(back) - ms(d)).abs() <= 50,
                "{text:?} = {d:?} shows as {shown:?}, which parses as {back:?}"
            );
        }
    }
    if let Ok(ms) = parse_time(text, NOW_MS)
        && ms < YEAR_10000_MS
    {
        let shown = format_time(ms);
        assert_eq!(
            parse_time(&shown, NOW_MS),
            Ok(ms),
            "{text:?} = {ms} shows as {shown:?}"
        );
    }
}
