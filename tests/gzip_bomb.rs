//! A gzip bomb (10 GiB of zeros, compressed) is refused quickly and with
//! little memory. The allocator below counts the peak bytes this test
//! process holds, so the memory claim is measured, not argued.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use berth::budget::{Blob, Budget, BudgetError, gunzip_capped};

struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::SeqCst) + l.size();
            PEAK.fetch_max(now, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Writes bits least-significant first, as deflate does.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn put(&mut self, value: u64, count: u32) {
        self.acc |= value << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    /// Huffman codes go most-significant bit first.
    fn code(&mut self, code: u64, len: u32) {
        let rev = (0..len).fold(0, |r, i| r | (((code >> i) & 1) << (len - 1 - i)));
        self.put(rev, len);
    }
}

/// A gzip stream that inflates to about `size` zero bytes, built directly in
/// deflate's fixed-Huffman code: one literal 0, then "copy 258 bytes from
/// distance 1" repeated. Eight copies are 13 bytes, so the body is a repeated
/// 13-byte unit and a 10 GiB bomb is about 68 MB to hold.
fn bomb(size: u64) -> Vec<u8> {
    let mut b = Bits {
        out: vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff],
        acc: 0,
        n: 0,
    };
    b.put(1, 1); // final block
    b.put(1, 2); // fixed Huffman
    b.code(0x30, 8); // literal 0
    let copy = |b: &mut Bits| {
        b.code(0b1100_0101, 8); // length symbol 285: 258 bytes
        b.code(0, 5); // distance symbol 0: distance 1
    };
    copy(&mut b); // 3 + 8 + 13 = 24 bits: byte aligned again
    assert_eq!(b.n, 0);
    let start = b.out.len();
    for _ in 0..8 {
        copy(&mut b);
    }
    let unit = b.out[start..].to_vec();
    assert_eq!(unit.len(), 13);
    let units = size / (8 * 258);
    b.out.reserve(units as usize * 13);
    for _ in 1..units {
        b.out.extend_from_slice(&unit);
    }
    b.code(0, 7); // end of block
    b.put(0, 7);
    b.out.extend_from_slice(&[0; 8]); // CRC and size, never reached
    b.out
}

#[test]
fn a_small_bomb_really_inflates_to_zeros() {
    // The generator is honest: a 1 MiB bomb inflates to zeros within a larger cap.
    let out = gunzip_capped("payload", &bomb(1 << 20), 4 << 20);
    // The trailer's CRC is wrong on purpose, so a full read ends in a gzip error,
    // but only after inflating everything.
    match out {
        Err(BudgetError::BadGzip { .. }) => {}
        other => panic!("unexpected: {other:?}"),
    }
    let small = bomb(1 << 20);
    let mut dec = flate2::read::GzDecoder::new(&small[..]);
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0usize;
    loop {
        match std::io::Read::read(&mut dec, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                assert!(buf[..n].iter().all(|b| *b == 0));
                total += n;
            }
        }
    }
    assert!(total >= (1 << 20) - 8 * 258, "inflated {total}");
}

#[test]
fn a_10_gib_bomb_is_refused_quickly_with_little_memory() {
    let blob = Blob {
        compressed: true,
        bytes: bomb(10 << 30),
    };
    let budget = Budget::default();
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let started = std::time::Instant::now();
    let err = blob.to_json("payload", &budget).unwrap_err();
    let elapsed = started.elapsed();
    let peak_extra = PEAK.load(Ordering::SeqCst) - before;
    assert_eq!(
        err,
        BudgetError::Bomb {
            what: "payload",
            limit: 64 << 20
        }
    );
    assert_eq!(
        err.to_string(),
        "compressed payload inflates past the 64 MiB decompression limit"
    );
    // The cap is 64 MiB; the output grows to at most 64 MiB (from 32 MiB).
    assert!(
        peak_extra < 100 << 20,
        "peak extra memory {} MiB",
        peak_extra >> 20
    );
    // Inflating 64 MiB takes well under a second optimized; allow debug builds slack.
    assert!(elapsed.as_secs() < 30, "took {elapsed:?}");
}
