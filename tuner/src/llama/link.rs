//! The link to a device, as ggml uses it: the round trip of a small read, and the rate of a large
//! write to the device and read back. For an RPC server this is the network between the hosts
//! (what every token's activations and every load's weights cross); for a local GPU, its bus.

use super::LlamaError;
use llama_cpp_sys_2 as sys;
use std::ffi::CString;
use std::time::{Duration, Instant};

/// What [`device_link`] measured.
#[derive(Debug, Clone, Copy)]
pub struct LinkProbe {
    /// The median round trip of a 4-byte read, seconds.
    pub round_trip_s: f64,
    /// Bytes per second of the best of the timed writes to the device, and of the reads back.
    pub upload_bytes_per_s: f64,
    pub download_bytes_per_s: f64,
    /// The bytes each timed transfer moved.
    pub bytes: u64,
}

/// Measures the link to `device`: `round_trips` 4-byte reads (median), then `passes` writes of a
/// `bytes` tensor in its memory and reads of it back (best of each, less one round trip). ggml's
/// RPC client sends a write without waiting for an answer, so each write is followed by a small
/// read, which the server answers only after it has taken the whole write. Below 10 MiB, as ggml
/// sends larger writes as a hash first.
pub fn device_link(
    device: &str,
    bytes: u64,
    round_trips: u32,
    passes: u32,
) -> Result<LinkProbe, LlamaError> {
    let name = CString::new(device).map_err(|_| LlamaError::UnknownDevice(device.into()))?;
    // SAFETY: ggml's backend registry is initialised (init()); the name is NUL-terminated.
    let dev = unsafe { sys::ggml_backend_dev_by_name(name.as_ptr()) };
    if dev.is_null() {
        return Err(LlamaError::UnknownDevice(device.into()));
    }
    let failed = |what: &str| LlamaError::Context(format!("link probe of {device}: {what}"));
    let bytes = bytes.max(4);
    // SAFETY: every pointer is checked before use and freed once, in reverse order of creation;
    // the tensor lives in `ctx`, its data in `buffer` on the device; reads and writes stay within
    // its `bytes`.
    unsafe {
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        if backend.is_null() {
            return Err(failed("the device did not start"));
        }
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: sys::ggml_tensor_overhead() * 2,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        if ctx.is_null() {
            sys::ggml_backend_free(backend);
            return Err(failed("no ggml context"));
        }
        let t = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_I8, bytes as i64);
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        let result = if buffer.is_null() {
            Err(failed("the device could not allocate the buffer"))
        } else {
            let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
            let mut back = vec![0u8; bytes as usize];
            let mut word = [0u8; 4];
            let small = || sys::ggml_backend_tensor_get(t, word.as_mut_ptr().cast(), 0, 4);
            let start = Instant::now();
            let probe = measure(
                || start.elapsed(),
                small,
                || sys::ggml_backend_tensor_set(t, data.as_ptr().cast(), 0, bytes as usize),
                || sys::ggml_backend_tensor_get(t, back.as_mut_ptr().cast(), 0, bytes as usize),
                bytes,
                round_trips,
                passes,
            );
            sys::ggml_backend_buffer_free(buffer);
            if back != data {
                Err(failed("what was read back is not what was written"))
            } else {
                Ok(probe)
            }
        };
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
        result
    }
}

/// The timing of [`device_link`], over any small read, write and read back, by the clock `now`.
fn measure(
    now: impl Fn() -> Duration,
    mut small: impl FnMut(),
    mut write: impl FnMut(),
    mut read: impl FnMut(),
    bytes: u64,
    round_trips: u32,
    passes: u32,
) -> LinkProbe {
    let time = |f: &mut dyn FnMut()| {
        let t = now();
        f();
        now().saturating_sub(t)
    };
    small(); // warm-up: the connection's first command
    let mut rtts: Vec<Duration> = (0..round_trips.max(1)).map(|_| time(&mut small)).collect();
    rtts.sort();
    let rtt = rtts[rtts.len() / 2];
    let rate = |d: Duration| {
        bytes as f64
            / d.saturating_sub(rtt)
                .max(Duration::from_micros(1))
                .as_secs_f64()
    };
    let (mut up, mut down) = (0f64, 0f64);
    for _ in 0..passes.max(1) {
        let w = time(&mut || {
            write();
            small();
        });
        up = up.max(rate(w));
        down = down.max(rate(time(&mut read)));
    }
    LinkProbe {
        round_trip_s: rtt.as_secs_f64(),
        upload_bytes_per_s: up,
        download_bytes_per_s: down,
        bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::cell::Cell;

    /// On a clock the transfers advance (no sleeping: a busy machine cannot move the figures).
    #[test]
    fn the_round_trip_is_the_median_and_rates_discount_it() {
        let clock = Cell::new(Duration::ZERO);
        let take = |ms: u64| clock.set(clock.get() + Duration::from_millis(ms));
        let mut n = 0;
        // Round trips of 1, 3, 2 ms (and a slow first one, the warm-up, left out); a write that
        // takes 9 ms plus the small read's 2 ms; a read of 6 ms, 4 of them past its round trip.
        let small = || {
            n += 1;
            take(match n {
                1 => 30,
                2 => 1,
                3 => 3,
                _ => 2,
            })
        };
        let p = measure(
            || clock.get(),
            small,
            || take(9),
            || take(6),
            1_000_000,
            3,
            1,
        );
        assert_eq!(
            p.round_trip_s, 0.002,
            "the median, not the mean or the warm-up: {p:?}"
        );
        // 1 MB over 9 ms and over 4 ms.
        assert!((p.upload_bytes_per_s - 1e6 / 0.009).abs() < 1.0, "{p:?}");
        assert!((p.download_bytes_per_s - 1e6 / 0.004).abs() < 1.0, "{p:?}");
    }

    /// Of several passes the best counts (a pass another program slowed is not the link).
    #[test]
    fn the_best_pass_is_the_rate() {
        let clock = Cell::new(Duration::ZERO);
        let take = |ms: u64| clock.set(clock.get() + Duration::from_millis(ms));
        let writes = Cell::new(0u64);
        let p = measure(
            || clock.get(),
            || take(1),
            || {
                writes.set(writes.get() + 1);
                take(if writes.get() == 1 { 50 } else { 10 })
            },
            || take(5),
            1_000_000,
            1,
            2,
        );
        assert!((p.upload_bytes_per_s - 1e6 / 0.010).abs() < 1.0, "{p:?}");
        assert_eq!(writes.get(), 2);
    }
}
