//! A counting allocator, per thread: how many bytes the calling thread has
//! allocated and not freed, and the peak of that since [`measure`] began.
//! Counting per thread keeps a measurement honest while other threads (other
//! tests, sled's threads) allocate at the same time.
//!
//! `realloc` is left to `GlobalAlloc`'s default (allocate, copy, free), so a
//! vector that grows is counted with both its old and its new buffer, as a
//! real reallocation that moves may need.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(n: isize) {
    // `try_with`: a thread being torn down may still free memory.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + n;
        live.set(now);
        let _ = PEAK.try_with(|peak| {
            if now > peak.get() {
                peak.set(now);
            }
        });
    });
}

/// Blocks of this size or more are mapped from the kernel, one mapping
/// each, and unmapped when freed: they come zeroed for free. Opening a sled
/// database allocates several zeroed megabytes (its page table, its IO
/// buffers) that malloc would clear with memset once it reuses freed memory
/// for them, which made that most of the cost of a store_ops input.
const MAPPED: usize = 1 << 20;
const PAGE: usize = 4096;

fn mapped(layout: Layout) -> bool {
    layout.size() >= MAPPED && layout.align() <= PAGE
}

/// A fresh anonymous mapping: zeroed.
unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

// SAFETY: small blocks are passed on to the system allocator unchanged and
// large ones are whole page-aligned mappings of their own, unmapped with
// the same size; the counters are plain thread-local cells that never
// allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = if mapped(layout) {
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc(layout) }
        };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = if mapped(layout) {
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        };
        if !p.is_null() {
            add(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if mapped(layout) {
            // SAFETY: `ptr` is the start of a mapping of exactly this size.
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
        } else {
            unsafe { System.dealloc(ptr, layout) };
        }
        add(-(layout.size() as isize));
    }
}

/// Runs `f` and returns its value with the peak of the bytes this thread
/// held during it beyond what it held before (the value's own memory
/// included, if it is still held).
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let r = f();
    let peak = PEAK.with(Cell::get);
    (r, (peak - base).max(0) as usize)
}

/// Whether the counting allocator is the global one (it is wherever this
/// module is compiled in; this guards the memory assertions against a
/// build that left it out).
pub fn counting() -> bool {
    let (_, peak) = measure(|| std::hint::black_box(vec![0u8; 4096]));
    peak >= 4096
}
