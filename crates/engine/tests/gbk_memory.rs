//! The in-memory form of a GroupByKey costs at most twice the encoded data it
//! holds, measured under the allocator the server runs with (mimalloc), as
//! the bytes of every live allocation (their usable sizes, so size-class
//! rounding counts).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

use weir_engine::group_by_key::GroupByKeyBuffer;
use weir_graph::Windowing;
use weir_model::{Coder, PaneInfo, Timestamp, Window, WindowedValue};

/// mimalloc, counting the usable bytes of live allocations.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

fn usable(p: *const u8) -> usize {
    // SAFETY: `p` was returned by mimalloc and is still live.
    unsafe { libmimalloc_sys::mi_usable_size(p.cast()) }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(usable(p), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        LIVE.fetch_sub(usable(p), Ordering::Relaxed);
        unsafe { mimalloc::MiMalloc.dealloc(p, layout) }
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let before = usable(p);
        let q = unsafe { mimalloc::MiMalloc.realloc(p, layout, new_size) };
        if !q.is_null() {
            LIVE.fetch_sub(before, Ordering::Relaxed);
            LIVE.fetch_add(usable(q), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A `KV<bytes, bytes>` at `ts` in `window`, and the bytes of its KV.
fn element(key: &[u8], value: &[u8], ts: i64, window: Window) -> (Vec<u8>, usize) {
    let mut kv = vec![key.len() as u8];
    kv.extend_from_slice(key);
    kv.push(value.len() as u8);
    kv.extend_from_slice(value);
    let n = kv.len();
    let mut out = Vec::new();
    WindowedValue {
        timestamp: Timestamp(ts),
        windows: vec![window],
        pane: PaneInfo::NO_FIRING,
        value: kv,
    }
    .encode(&mut out);
    (out, n)
}

/// Buffers `n` elements, the `i`th with key `key(i)`, a 90-byte value and
/// window `window(i)`, making `groups` (key, window) groups. Returns the bytes the buffer holds per byte of
/// encoded KVs (keys and values, not timestamps and windows), and its own
/// estimate of what it holds per measured byte.
fn measure(
    n: usize,
    groups: usize,
    windowing: Windowing,
    window_coder: Coder,
    key: impl Fn(usize) -> Vec<u8>,
    window: impl Fn(usize) -> Window,
) -> (f64, f64) {
    let coder = Coder::Kv(Box::new(Coder::Bytes), Box::new(Coder::Bytes));
    let mut b = GroupByKeyBuffer::new(coder, window_coder, windowing);
    let before = LIVE.load(Ordering::Relaxed);
    let mut encoded = 0;
    let value = [7u8; 90];
    for i in 0..n {
        let (e, kv) = element(&key(i), &value, i as i64, window(i));
        encoded += kv;
        b.insert(&e).unwrap();
    }
    let held = LIVE.load(Ordering::Relaxed) - before;
    let ratio = held as f64 / encoded as f64;
    let estimate = b.memory_estimate() as f64 / held as f64;
    eprintln!(
        "{n} elements, {groups} groups: {held} bytes held for {encoded} encoded: {ratio:.2}x (estimate {estimate:.2} of held)"
    );
    // Every group fires once.
    assert_eq!(b.take_complete(|_| true).len(), groups);
    assert!(b.is_empty());
    (ratio, estimate)
}

fn global(n: usize, keys: usize) -> (f64, f64) {
    measure(
        n,
        n.min(keys),
        Windowing::global(),
        Coder::GlobalWindow,
        |i| format!("{:010}", i % keys).into_bytes(),
        |_| Window::Global,
    )
}

// One test: the allocator's count is process-wide, so shapes are measured
// one after another.
#[test]
fn buffer_costs_under_twice_the_encoded_data() {
    one_value_per_key();
    many_values_per_key();
    fixed_windows();
}

fn one_value_per_key() {
    // The GroupByKey benchmark's shape: distinct 10-byte keys.
    for n in [100_000, 300_000, 1_000_000] {
        let (ratio, estimate) = global(n, n);
        assert!(ratio <= 2.0, "{n} keys: {ratio:.2}x");
        assert!((0.8..=1.25).contains(&estimate), "{n} keys: estimate {estimate:.2} of held");
    }
}

fn many_values_per_key() {
    // A load test's shape: few keys, thousands of values each. Sizes
    // around where a doubling vector would just have grown.
    for n in [200_000, 290_000, 330_000] {
        let (ratio, estimate) = global(n, 100);
        assert!(ratio <= 1.6, "{n} values on 100 keys: {ratio:.2}x");
        assert!((0.6..=1.25).contains(&estimate), "{n} values: estimate {estimate:.2} of held");
    }
}

fn fixed_windows() {
    // Distinct keys in 10 fixed windows of 1 s: windows indexed by time.
    let windowing = Windowing {
        window_fn: weir_graph::WindowFn::NonMerging,
        ..Windowing::global()
    };
    let (ratio, _) = measure(
        300_000,
        300_000,
        windowing,
        Coder::IntervalWindow,
        |i| format!("{i:010}").into_bytes(),
        |i| {
            let start = (i % 10) as i64 * 1000;
            Window::Interval {
                start: Timestamp(start),
                end: Timestamp(start + 1000),
            }
        },
    );
    assert!(ratio <= 2.0, "fixed windows: {ratio:.2}x");
}
