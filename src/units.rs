//! Human-readable byte sizes: `100KiB`, `1.5MiB`, `64 MiB`, `4096` in, `3.1 MiB` out.
//! Durations use `humantime` (`5s`, `10m`, `1h 30m`); this module only wraps its errors.

use std::time::Duration;

const UNITS: [(&str, u64); 9] = [
    ("b", 1),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("k", 1 << 10),
    ("m", 1 << 20),
];

/// Parses a byte size such as `100KiB`, `1.5 MiB`, `2MB` or `4096`. The
/// value must come to a whole number of bytes (`1.5MiB` does, `0.5` and
/// `1.1MiB` do not): the decimals are counted exactly, not as a float.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let not_a_size = || format!("'{text}' is not a size (expected e.g. 100KiB, 1.5MiB, 4096)");
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(not_a_size());
    }
    let mult = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, m)| *m)
            .ok_or_else(|| {
                format!("'{text}' has an unknown unit '{unit}' (use B, KiB, MiB, GiB, KB, MB, GB)")
            })?
    };
    let too_large = || format!("'{text}' is too large");
    let digits = |d: &str| -> Result<u128, String> {
        match d.is_empty() {
            true => Ok(0),
            // Only ASCII digits are left: a failure is an overflow.
            false => d.parse::<u128>().map_err(|_| too_large()),
        }
    };
    let whole_bytes = digits(whole)?
        .checked_mul(u128::from(mult))
        .ok_or_else(too_large)?;
    // The decimals: `frac / 10^len` of the unit. In bytes they would be a
    // part of a byte: refused (`0.5` is no size). In a larger unit the
    // size is rounded to the nearest byte, so that a size as berth shows
    // it (`1.1 MiB`) reads back; 20 decimals are more than a byte needs.
    let frac = frac.trim_end_matches('0');
    let frac = &frac[..frac.len().min(20)];
    let frac_bytes = if frac.is_empty() {
        0
    } else if mult == 1 {
        return Err(format!(
            "'{text}' is not a whole number of bytes (a size in bytes has no decimals)"
        ));
    } else {
        let scale = 10u128.pow(frac.len() as u32);
        let scaled = digits(frac)?
            .checked_mul(u128::from(mult))
            .ok_or_else(too_large)?;
        (scaled + scale / 2) / scale
    };
    whole_bytes
        .checked_add(frac_bytes)
        .and_then(|b| u64::try_from(b).ok())
        .filter(|b| *b <= u64::MAX / 2)
        .ok_or_else(too_large)
}

/// Formats a byte count the way berth's messages show it: `512 B`, `100 KiB`, `3.1 MiB`.
pub fn format_size(bytes: u64) -> String {
    const STEPS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in STEPS {
        if bytes >= size {
            let v = bytes as f64 / size as f64;
            let s = format!("{v:.1}");
            let s = s.strip_suffix(".0").unwrap_or(&s);
            return format!("{s} {name}");
        }
    }
    format!("{bytes} B")
}

/// `size` and the `limit` it broke, each by [`format_size`], or in bytes
/// when rounding would show them equal (`1 MiB; the budget is 1 MiB`).
pub fn format_size_against(size: u64, limit: u64) -> (String, String) {
    let (s, l) = (format_size(size), format_size(limit));
    match s == l && size != limit {
        true => (format!("{size} bytes"), format!("{limit} bytes")),
        false => (s, l),
    }
}

/// The longest duration berth takes (`100y`, as humantime counts years).
/// Every duration becomes a deadline (`Instant` + it) or milliseconds in a
/// u64; a longer one would overflow either.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// Parses a duration such as `5s`, `100ms`, `10m`, at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("'{text}' is not a duration ({e}; expected e.g. 5s, 100ms, 10m)"))?;
    if d > MAX_DURATION {
        return Err(format!(
            "'{text}' is longer than 100 years, the longest duration berth takes"
        ));
    }
    Ok(d)
}

/// Formats a duration compactly the way statuses show it: `5s`, `21.4s`, `10m`, `250ms`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms.is_multiple_of(60_000) && ms >= 60_000 {
        if ms.is_multiple_of(3_600_000) {
            return format!("{}h", ms / 3_600_000);
        }
        return format!("{}m", ms / 60_000);
    }
    if ms.is_multiple_of(1000) {
        return format!("{}s", ms / 1000);
    }
    let s = format!("{:.1}", ms as f64 / 1000.0);
    format!("{}s", s.strip_suffix(".0").unwrap_or(&s))
}

/// A time (ms since the epoch) in RFC 3339 with milliseconds, UTC:
/// `2026-11-30T12:00:00.250Z`.
pub fn format_time(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// How long ago `ms` was at `now_ms`, roughly, in the largest fitting unit:
/// `12s`, `5m`, `3h`, `2d` (`0s` for a time in the future).
pub fn format_age(ms: u64, now_ms: u64) -> String {
    let s = now_ms.saturating_sub(ms) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// A time as people write it: RFC 3339 (`2026-11-30T12:00:00Z`, or with an
/// offset, `2026-11-30T13:00:00+01:00`; also without the `T`, or without a
/// zone, which then means UTC), milliseconds since the epoch, or a duration
/// meaning that long before `now_ms` (`90m`, `2h`).
pub fn parse_time(text: &str, now_ms: u64) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let before_1970 = || format!("'{text}' is before 1970, where berth's times begin");
    let (local, offset_ms) = split_offset(text);
    if let Ok(t) = humantime::parse_rfc3339_weak(local) {
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| before_1970())?
            .as_millis() as i64;
        return u64::try_from(ms - offset_ms).map_err(|_| before_1970());
    }
    if local.len() >= 5
        && local.as_bytes()[4] == b'-'
        && local[..4].parse::<u32>().is_ok_and(|year| year < 1970)
    {
        return Err(before_1970());
    }
    match humantime::parse_duration(text) {
        Ok(d) => {
            let ago = parse_duration(text)?.as_millis() as u64;
            if d > Duration::ZERO && ago > now_ms {
                return Err(format!(
                    "'{text}' ago is before 1970, where berth's times begin"
                ));
            }
            Ok(now_ms - ago)
        }
        Err(_) => Err(format!(
            "'{text}' is not a time (expected RFC 3339 such as 2026-11-30T12:00:00Z or \
             2026-11-30T13:00:00+01:00, or a duration ago such as 90m)"
        )),
    }
}

/// A date and time without its RFC 3339 numeric offset (`+01:00`,
/// `-03:30`), and that offset in milliseconds (east of UTC is positive);
/// the text whole and 0 when it ends in no such offset.
fn split_offset(text: &str) -> (&str, i64) {
    let b = text.as_bytes();
    let n = b.len();
    // The date (10 bytes), a `T` or space, and at least `HH:MM`, before it.
    if n < 6 + 16 || !b.is_ascii() {
        return (text, 0);
    }
    let (local, zone) = text.split_at(n - 6);
    let z = zone.as_bytes();
    // Two ASCII digits (`parse` alone would also take a sign).
    let digits = |r: std::ops::Range<usize>| {
        z[r.clone()]
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| i64::from(z[r.start] - b'0') * 10 + i64::from(z[r.start + 1] - b'0'))
    };
    let sign = match z[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return (text, 0),
    };
    match (digits(1..3), z[3], digits(4..6)) {
        (Some(h), b':', Some(m)) if h < 24 && m < 60 && matches!(b[10], b'T' | b't' | b' ') => {
            (local, sign * (h * 60 + m) * 60_000)
        }
        _ => (text, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_format_and_parse() {
        assert_eq!(format_time(1_796_040_000_250), "2026-11-30T12:00:00.250Z");
        assert_eq!(
            parse_time("2026-11-30T12:00:00.250Z", 0),
            Ok(1_796_040_000_250)
        );
        assert_eq!(parse_time("2026-11-30 12:00:00", 0), Ok(1_796_040_000_000));
        assert_eq!(parse_time("90m", 10_000_000), Ok(10_000_000 - 5_400_000));
        assert_eq!(parse_time("1796040000250", 0), Ok(1_796_040_000_250));
        // An offset is applied, with or without a fraction of a second.
        for t in [
            "2026-11-30T13:00:00.250+01:00",
            "2026-11-30T13:00:00.250+01:00 ",
            "2026-11-30T08:30:00.250-03:30",
            "2026-11-30 12:00:00.250+00:00",
            "2026-11-30T12:00:00.250-00:00",
        ] {
            assert_eq!(parse_time(t, 0), Ok(1_796_040_000_250), "{t}");
        }
        assert_eq!(
            parse_time("2026-11-30T13:00:00+01:00", 0),
            Ok(1_796_040_000_000)
        );
        for bad in ["2026-11-30T13:00:00+24:00", "2026-11-30T13:00:00+01:60"] {
            assert!(
                parse_time(bad, 0).unwrap_err().contains("not a time"),
                "{bad}"
            );
        }
        for old in ["1900-01-01T00:00:00Z", "1970-01-01T00:30:00+01:00"] {
            assert!(
                parse_time(old, 0).unwrap_err().contains("before 1970"),
                "{old}: {:?}",
                parse_time(old, 0)
            );
        }
        assert!(
            parse_time("yesterday", 0)
                .unwrap_err()
                .contains("not a time")
        );
        // A duration ago: no more than 100 years, and not before 1970.
        let now = 1_796_040_000_000;
        assert_eq!(
            parse_time("60y", now),
            Err("'60y' ago is before 1970, where berth's times begin".to_string())
        );
        assert!(
            parse_time("101y", now)
                .unwrap_err()
                .contains("longer than 100 years"),
            "{:?}",
            parse_time("101y", now)
        );
        assert_eq!(parse_time("0s", 0), Ok(0));
        assert_eq!(format_age(0, 59_999), "59s");
        assert_eq!(format_age(0, 3_600_000), "1h");
        assert_eq!(format_age(5, 0), "0s");
    }

    #[test]
    fn sizes_parse_in_binary_and_decimal_units() {
        assert_eq!(parse_size("100KiB").unwrap(), 102_400);
        assert_eq!(parse_size("1.5MiB").unwrap(), 1_572_864);
        assert_eq!(parse_size("64 MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert_eq!(parse_size("1.1KB").unwrap(), 1_100);
        assert_eq!(parse_size(".5KiB").unwrap(), 512);
        assert_eq!(parse_size("2.50KiB").unwrap(), 2_560);
        assert_eq!(parse_size("1.0").unwrap(), 1);
        assert!(parse_size("1.2.3").unwrap_err().contains("not a size"));
        assert!(parse_size(".").unwrap_err().contains("not a size"));
        assert!(
            parse_size("99999999999GiB")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(
            parse_size("3 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
    }

    #[test]
    fn a_size_in_bytes_with_decimals_is_refused_and_a_larger_unit_rounds() {
        for text in ["0.5", "1.5B", "0.5 b", "4096.01"] {
            let e = parse_size(text).unwrap_err();
            assert!(e.contains("is not a whole number of bytes"), "{text}: {e}");
        }
        assert_eq!(parse_size("1.1MiB"), Ok(1_153_434)); // 1153433.6
        assert_eq!(parse_size("0.1KiB"), Ok(102)); // 102.4
        assert_eq!(parse_size("1.5MiB"), Ok(1_572_864));
        assert_eq!(parse_size("1.0B"), Ok(1));
        assert_eq!(
            parse_size("1.0000000000000000000000000000000000001KB"),
            Ok(1000)
        );
        // What berth shows reads back (to its rounding).
        for n in [1_153_434u64, 3_250_000, 4_584_946_418_820_579_328] {
            let back = parse_size(&format_size(n)).unwrap();
            assert!(back.abs_diff(n) <= n / 200 + 1, "{n} {back}");
        }
    }

    #[test]
    fn sizes_format_with_one_decimal() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(102_400), "100 KiB");
        assert_eq!(format_size(1_572_864), "1.5 MiB");
        assert_eq!(format_size(3_250_000), "3.1 MiB");
    }

    #[test]
    fn a_size_over_its_limit_never_reads_as_equal_to_it() {
        let mib = 1 << 20;
        assert_eq!(
            format_size_against(mib + 1, mib),
            ("1048577 bytes".to_string(), "1048576 bytes".to_string())
        );
        assert_eq!(
            format_size_against(2 * mib, mib),
            ("2 MiB".to_string(), "1 MiB".to_string())
        );
        assert_eq!(
            format_size_against(mib, mib),
            ("1 MiB".to_string(), "1 MiB".to_string())
        );
    }

    #[test]
    fn durations_round_trip_through_text() {
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert!(parse_duration("soon").is_err());
        assert_eq!(format_duration(Duration::from_millis(21_400)), "21.4s");
        assert_eq!(format_duration(Duration::from_secs(600)), "10m");
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
