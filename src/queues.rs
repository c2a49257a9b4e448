//! Queue names and their order: the main queue, the parallel queues that
//! group children run in, and the natural order in which `queue list` shows
//! the queues after `main` (`parallel_queue_2` before `parallel_queue_10`).

use std::cmp::Ordering;

/// The main queue: `queue list` shows it first.
pub const MAIN: &str = "main";

/// Parallel queues a data dir lists when no daemon ever said how many it
/// runs (the daemon's default, `parallel_queues`).
pub const DEFAULT_PARALLEL_QUEUES: usize = 10;

/// The name of parallel queue `i`.
pub fn parallel_queue(i: usize) -> String {
    format!("parallel_queue_{i}")
}

/// Orders names digit runs by value: `q2` < `q10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(c), Some(d)) if c.is_ascii_digit() && d.is_ascii_digit() => {
                let xl = x.iter().take_while(|c| c.is_ascii_digit()).count();
                let yl = y.iter().take_while(|c| c.is_ascii_digit()).count();
                let (xn, yn) = (trim_zeros(&x[..xl]), trim_zeros(&y[..yl]));
                let o = xn.len().cmp(&yn.len()).then_with(|| xn.cmp(yn));
                if o != Ordering::Equal {
                    return o;
                }
                x = &x[xl..];
                y = &y[yl..];
            }
            (Some(c), Some(d)) => {
                if c != d {
                    return c.cmp(d);
                }
                x = &x[1..];
                y = &y[1..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let n = d.iter().take_while(|c| **c == b'0').count();
    &d[n.min(d.len().saturating_sub(1))..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_order_puts_2_before_10() {
        let mut v = vec![
            "parallel_queue_10",
            "parallel_queue_2",
            "alpha",
            "parallel_queue_0",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            vec![
                "alpha",
                "parallel_queue_0",
                "parallel_queue_2",
                "parallel_queue_10"
            ]
        );
    }
}
