//! A crash test's child: this test binary re-executed to enqueue forever,
//! printing each id only after its commit returned, and the parent's side
//! that reads those acknowledged ids.

use std::io::{Read, Write};
use std::sync::mpsc;

use berth::store::{Placement, Store};
use berth::task::TaskSpec;

/// Ends the line libtest started ("test NAME ... " without a newline), so
/// that the first id gets a line of its own.
pub fn end_libtest_line() {
    let mut out = std::io::stdout().lock();
    out.write_all(b"\n")
        .and_then(|()| out.flush())
        .expect("stdout");
}

/// Enqueues `spec` last in its queue, in a commit of its own, and returns
/// its id once the commit returned (acknowledged, in `sync` mode).
pub fn enqueue_acked(store: &Store, spec: TaskSpec) -> u64 {
    let task = spec
        .into_task(store.clock().now_ms(), store.budget())
        .expect("into_task");
    let mut w = store.write();
    let id = w.enqueue(task, Some(Placement::Last)).expect("enqueue");
    w.commit().expect("commit");
    id
}

/// Enqueues `spec(0)`, `spec(1)`, ... forever, printing each id after its
/// commit returned.
pub fn produce(store: &Store, spec: impl Fn(u64) -> TaskSpec) -> ! {
    for i in 0u64.. {
        let id = enqueue_acked(store, spec(i));
        // One write per line, under the stdout lock, flushed: a line the
        // parent reads is an id whose commit returned.
        let mut out = std::io::stdout().lock();
        out.write_all(format!("{id}\n").as_bytes())
            .and_then(|()| out.flush())
            .expect("writing to stdout");
    }
    unreachable!()
}

/// Reads the child's stdout to EOF, sending every complete line that is a
/// pure integer (libtest prints its own lines too).
pub fn read_ids(out: impl Read + Send + 'static, tx: mpsc::Sender<u64>) {
    let (lines_tx, lines) = mpsc::channel();
    let forward = std::thread::spawn(move || super::forward_lines(out, lines_tx));
    for text in lines {
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            let _ = tx.send(text.parse().expect("digits"));
        }
    }
    let _ = forward.join();
}
