//! Metrics in the Prometheus text exposition format (version 0.0.4): the
//! families `berth metrics` prints and the daemon writes to a textfile for
//! node_exporter's textfile collector. What is measured is gathered by
//! `ops::metrics`; this module holds the families' shape (also their JSON,
//! the wire form), the text rendering, and the atomic textfile write.
//!
//! Names follow Prometheus's conventions: the `berth_` prefix, base units
//! (`_seconds`, `_bytes`), `_total` for counters, histograms as
//! `_bucket{le=...}`, `_sum` and `_count`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::counters::Histogram;

/// What a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

impl Type {
    fn as_str(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
        }
    }
}

/// One sample: the family's name plus `suffix` (`_bucket`, `_sum`,
/// `_count` for histograms, else empty), its labels, its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub suffix: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// One metric family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Family {
    pub name: String,
    pub help: String,
    #[serde(rename = "type")]
    pub kind: Type,
    pub samples: Vec<Sample>,
}

fn labels_of(labels: &[(&str, &str)]) -> Vec<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Family {
    pub fn new(kind: Type, name: &str, help: &str) -> Family {
        Family {
            name: name.to_string(),
            help: help.to_string(),
            kind,
            samples: Vec::new(),
        }
    }
    pub fn counter(name: &str, help: &str) -> Family {
        Family::new(Type::Counter, name, help)
    }
    pub fn gauge(name: &str, help: &str) -> Family {
        Family::new(Type::Gauge, name, help)
    }
    pub fn histogram(name: &str, help: &str) -> Family {
        Family::new(Type::Histogram, name, help)
    }

    /// Adds a sample of a counter or a gauge.
    pub fn add(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.samples.push(Sample {
            suffix: String::new(),
            labels: labels_of(labels),
            value,
        });
        self
    }

    /// Adds a histogram's samples: cumulative buckets (`bounds` in seconds)
    /// ending with `+Inf`, then `_sum` (seconds) and `_count`.
    pub fn add_histogram(
        &mut self,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum_seconds: f64,
        count: u64,
    ) -> &mut Self {
        let sample = |suffix: &str, extra: Option<String>, value: f64| {
            let mut l = labels_of(labels);
            if let Some(le) = extra {
                l.push(("le".to_string(), le));
            }
            Sample {
                suffix: suffix.to_string(),
                labels: l,
                value,
            }
        };
        for (bound, n) in buckets {
            self.samples
                .push(sample("_bucket", Some(format_value(*bound)), *n as f64));
        }
        self.samples
            .push(sample("_bucket", Some("+Inf".into()), count as f64));
        self.samples.push(sample("_sum", None, sum_seconds));
        self.samples.push(sample("_count", None, count as f64));
        self
    }

    /// Adds a stored histogram (milliseconds) in seconds.
    pub fn add_ms_histogram(&mut self, labels: &[(&str, &str)], h: &Histogram) -> &mut Self {
        let buckets: Vec<(f64, u64)> = h
            .cumulative()
            .into_iter()
            .map(|(ms, n)| (ms as f64 / 1000.0, n))
            .collect();
        self.add_histogram(labels, &buckets, h.sum_ms as f64 / 1000.0, h.count)
    }
}

/// A value as the text format writes it: integers without a fraction.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The text exposition format. Families without samples are left out.
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families.iter().filter(|f| !f.samples.is_empty()) {
        out.push_str(&format!("# HELP {} {}\n", f.name, escape_help(&f.help)));
        out.push_str(&format!("# TYPE {} {}\n", f.name, f.kind.as_str()));
        for s in &f.samples {
            out.push_str(&f.name);
            out.push_str(&s.suffix);
            if !s.labels.is_empty() {
                let l: Vec<String> = s
                    .labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                    .collect();
                out.push_str(&format!("{{{}}}", l.join(",")));
            }
            out.push(' ');
            out.push_str(&format_value(s.value));
            out.push('\n');
        }
    }
    out
}

/// Writes `text` to `path` atomically, so that a reader (node_exporter)
/// sees the old file or the new one, never a part: a temporary file in the
/// same folder (`.NAME.tmp`, which the textfile collector ignores, as it
/// reads only `*.prom`), written, fsync-ed, renamed over `path`, and the
/// folder fsync-ed. The file is mode 0644 whatever the umask, so that the
/// collector, another user, can read it.
pub fn write_textfile(path: &Path, text: &str) -> std::io::Result<()> {
    crate::frame::write_atomic(path, text.as_bytes(), 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_follows_the_exposition_format() {
        let mut c = Family::counter("berth_tasks_enqueued_total", "Tasks enqueued.");
        c.add(&[("kind", "Module\"Run\\")], 3.0);
        let mut g = Family::gauge("berth_disk_free_bytes", "Free bytes.\nSecond line.");
        g.add(&[], 1.5);
        let empty = Family::gauge("berth_nothing", "Left out.");
        let mut h = Family::histogram("berth_attempt_duration_seconds", "Durations.");
        let mut hist = Histogram::default();
        hist.observe(7);
        hist.observe(2_000);
        h.add_ms_histogram(&[("kind", "K")], &hist);
        let text = render(&[c, g, empty, h]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "# HELP berth_tasks_enqueued_total Tasks enqueued."
        );
        assert_eq!(lines[1], "# TYPE berth_tasks_enqueued_total counter");
        assert_eq!(
            lines[2],
            r#"berth_tasks_enqueued_total{kind="Module\"Run\\"} 3"#
        );
        assert_eq!(
            lines[3],
            r"# HELP berth_disk_free_bytes Free bytes.\nSecond line."
        );
        assert_eq!(lines[5], "berth_disk_free_bytes 1.5");
        assert!(!text.contains("berth_nothing"));
        assert!(
            text.contains("berth_attempt_duration_seconds_bucket{kind=\"K\",le=\"0.005\"} 0\n")
        );
        assert!(text.contains("berth_attempt_duration_seconds_bucket{kind=\"K\",le=\"0.01\"} 1\n"));
        assert!(text.contains("berth_attempt_duration_seconds_bucket{kind=\"K\",le=\"2.5\"} 2\n"));
        assert!(text.contains("berth_attempt_duration_seconds_bucket{kind=\"K\",le=\"+Inf\"} 2\n"));
        assert!(text.contains("berth_attempt_duration_seconds_sum{kind=\"K\"} 2.007\n"));
        assert!(text.contains("berth_attempt_duration_seconds_count{kind=\"K\"} 2\n"));
    }

    #[test]
    fn the_textfile_is_replaced_whole_and_readable_by_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.prom");
        write_textfile(&path, "a 1\n").unwrap();
        write_textfile(&path, "a 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a 2\n");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("berth.prom")]);
    }
}
