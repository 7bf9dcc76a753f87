//! A short probe of the CPU's memory read bandwidth, for the roofline.
//!
//! Method: fill a buffer several times larger than the last-level cache (so the reads come from RAM,
//! not from cache), each part first written by the thread that reads it (on several NUMA nodes each
//! thread then reads its own node's memory, as a decoding thread reads what it first touched), then
//! read it with every CPU at once, each thread summing its own contiguous
//! chunk, and keep the best of a few passes (the best pass is the one least disturbed by other work on
//! the machine). About a second in all, most of it filling the buffer. It is a plain streaming read,
//! like the weight reads of token generation; it does not try the tricks (non-temporal loads,
//! prefetch tuning) of STREAM-like benchmarks, so it reports what ordinary code reaches, which is
//! also what llama.cpp's kernels reach.
//!
//! Other devices (a GPU, an RPC server) are measured with their own kernels, in a worker process:
//! a matrix-vector product over an f32 matrix in the device's memory (what generating a token does
//! with each weight matrix), best of a few passes; see `llama::device_read_bandwidth`.

use std::time::{Duration, Instant};

/// The matrix a device's probe reads, and how many timed passes.
const DEVICE_MATRIX: u64 = 512 << 20;
const DEVICE_PASSES: u32 = 5;
/// Passes after the first stop once the probe has taken this long (warm-up included).
const DEVICE_TIME: Duration = Duration::from_secs(3);

/// Measures each device's memory read bandwidth (connecting the run's RPC servers first), one
/// worker for all; a device whose probe fails is left out with a warning on stderr.
pub fn measure_devices(devices: &[String], rpc: &[String]) -> Vec<profiles::DeviceBandwidth> {
    let full: Vec<(String, u64)> = devices.iter().map(|d| (d.clone(), u64::MAX)).collect();
    measure_devices_within(&full, rpc)
}

/// [`measure_devices`] with each device's budget (bytes): the probe's matrix takes at most half of
/// it (a budget holds what else the device runs), and no more than the probe's usual size.
pub fn measure_devices_within(
    devices: &[(String, u64)],
    rpc: &[String],
) -> Vec<profiles::DeviceBandwidth> {
    use crate::worker::{BandwidthRequest, Request, Response};
    if devices.is_empty() {
        return Vec::new();
    }
    let mut worker = match crate::worker::Worker::spawn() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("autotune: warning: no device bandwidth probe: {e}");
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (device, budget) in devices {
        let request = Request::Bandwidth(BandwidthRequest {
            device: device.clone(),
            rpc: rpc.to_vec(),
            bytes: DEVICE_MATRIX.min(budget / 2),
            passes: DEVICE_PASSES,
            time_limit_ms: DEVICE_TIME.as_millis() as u64,
        });
        match worker.call(&request, Duration::from_secs(120), &|| false) {
            Ok(Response::Bandwidth {
                bytes_per_s,
                bytes,
                passes,
            }) => out.push(profiles::DeviceBandwidth {
                device: device.clone(),
                bytes_per_s,
                method: device_method(device, bytes, passes),
            }),
            Ok(Response::Failed { message, .. }) => {
                eprintln!("autotune: warning: bandwidth of {device} not measured: {message}")
            }
            Ok(_) => eprintln!(
                "autotune: warning: bandwidth of {device} not measured: unexpected answer"
            ),
            Err(f) => {
                eprintln!("autotune: warning: bandwidth of {device} not measured: {f}");
                // The worker is gone; the next device gets a fresh one.
                match crate::worker::Worker::spawn() {
                    Ok(w) => worker = w,
                    Err(_) => return out,
                }
            }
        }
    }
    worker.quit();
    out
}

/// The method line of a device's probe.
fn device_method(device: &str, bytes: u64, passes: u32) -> String {
    let passes = match passes {
        1 => "one pass (a slow device: the probe's time limit)".to_string(),
        n if n < DEVICE_PASSES => format!("best of {n} passes (the probe's time limit)"),
        n => format!("best of {n} passes"),
    };
    format!(
        "matrix-vector product over a {} f32 matrix by {device}'s own kernels, {passes}",
        search_space::size::format_size(bytes)
    )
}

/// The smallest and largest buffer the probe reads.
const MIN_BUFFER: u64 = 256 << 20;
const MAX_BUFFER: u64 = 1 << 30;
/// The buffer is this many times the last-level cache, when that stays within the bounds above.
const CACHE_MULTIPLE: u64 = 4;
/// Passes: at least this many, then more while the time below allows.
const MIN_PASSES: u32 = 3;
const MAX_PASSES: u32 = 8;
const READ_TIME: Duration = Duration::from_millis(600);

/// A measured read bandwidth.
#[derive(Debug, Clone, PartialEq)]
pub struct Bandwidth {
    pub bytes_per_s: f64,
    /// One line: buffer size, threads, passes.
    pub method: String,
    /// Other programs took more than [`BUSY_PROBE_SHARE`] of the CPUs while it read: the figure
    /// is low, and no ceiling.
    pub busy: bool,
    /// The last-level cache it read past, where the machine says.
    pub cache_bytes: Option<u64>,
}

/// Measures the CPU's memory read bandwidth; `None` when the machine has too little free memory
/// for a buffer that would defeat the cache.
pub fn measure_cpu() -> Option<Bandwidth> {
    let llc = last_level_cache_bytes();
    let available = crate::ram::available_now().unwrap_or(u64::MAX);
    let size = buffer_size(llc, available)?;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let words = (size / 8) as usize;
    let chunk = words.div_ceil(threads);
    let buffer = filled(words, chunk)?;
    let started = Instant::now();
    let mut best = 0.0f64;
    let mut passes = 0;
    let watch = crate::busy::Watch::start(&[]);
    while passes < MIN_PASSES || (passes < MAX_PASSES && started.elapsed() < READ_TIME) {
        let t = Instant::now();
        std::thread::scope(|s| {
            for part in buffer.chunks(chunk) {
                s.spawn(move || {
                    std::hint::black_box(part.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
                });
            }
        });
        let secs = t.elapsed().as_secs_f64();
        if secs > 0.0 {
            best = best.max(size as f64 / secs);
        }
        passes += 1;
    }
    let cache = match llc {
        Some(c) => format!(
            " ({:.1}× the {} last-level cache)",
            size as f64 / c as f64,
            search_space::size::format_size(c)
        ),
        None => String::new(),
    };
    let share = watch.share(Duration::ZERO);
    let busy = busy_note(share);
    Some(Bandwidth {
        busy: share.is_some_and(|s| s > BUSY_PROBE_SHARE),
        cache_bytes: llc,
        bytes_per_s: best,
        method: format!(
            "read of a {} buffer{cache} by {threads} threads, best of {passes} passes{busy}",
            search_space::size::format_size(size)
        ),
    })
}

/// `words` non-zero words (untouched pages all map to one shared zero page, which would be read
/// from cache), each `chunk` of them written first by the thread that reads it in the probe: the
/// kernel places a page on the NUMA node of the thread that first touches it, as the weights a
/// decoding thread reads (one thread filling it all would put the buffer on its node, and the
/// probe would read one node's memory). `None` where the memory cannot be had.
fn filled(words: usize, chunk: usize) -> Option<Vec<u64>> {
    let mut buffer: Vec<u64> = Vec::new();
    buffer.try_reserve_exact(words).ok()?;
    std::thread::scope(|s| {
        for part in buffer.spare_capacity_mut()[..words].chunks_mut(chunk.max(1)) {
            s.spawn(move || {
                for w in part {
                    w.write(0x0101_0101_0101_0101);
                }
            });
        }
    });
    // SAFETY: the threads above wrote every one of the first `words` elements, within the
    // capacity reserved for them.
    unsafe { buffer.set_len(words) };
    Some(buffer)
}

/// The probe's buffer: `CACHE_MULTIPLE` × the cache, within bounds, and at most a quarter of the free
/// memory; `None` when that leaves less than the smallest useful buffer.
fn buffer_size(llc: Option<u64>, available: u64) -> Option<u64> {
    let wanted = llc
        .map_or(MIN_BUFFER, |c| c.saturating_mul(CACHE_MULTIPLE))
        .clamp(MIN_BUFFER, MAX_BUFFER);
    let size = wanted.min(available / 4) & !0xfff;
    (size >= MIN_BUFFER / 4).then_some(size)
}

/// ", while other programs took N% of the CPUs' time: an underestimate" where other work (the
/// hypervisor's steal included) took more than [`BUSY_PROBE_SHARE`] of the CPUs while the probe
/// read (`share`, [`crate::busy::Watch`]); empty otherwise. The figure is the best pass's: a
/// moment's work beside one pass (a worker's pages being freed) takes little from the share and
/// nothing from the best.
fn busy_note(share: Option<f64>) -> String {
    match share {
        Some(s) if s > BUSY_PROBE_SHARE => format!(
            ", while other programs took {:.0}% of the CPUs' time: an underestimate",
            s * 100.0
        ),
        _ => String::new(),
    }
}

/// Other programs' share of the CPUs' time above which the probe's figure is said to be low: a
/// quarter, one busy thread on two cores being half.
const BUSY_PROBE_SHARE: f64 = 0.25;

/// The largest cache of CPU 0 (Linux sysfs), in bytes.
fn last_level_cache_bytes() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| search_space::size::parse_size(s.trim()).ok())
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_called_busy_when_others_took_more_than_a_quarter_of_the_cpus() {
        assert_eq!(busy_note(Some(0.05)), "");
        assert_eq!(busy_note(Some(0.25)), "");
        assert_eq!(
            busy_note(Some(0.5)),
            ", while other programs took 50% of the CPUs' time: an underestimate"
        );
        assert_eq!(busy_note(None), "");
    }

    #[test]
    fn a_device_method_says_when_the_time_limit_cut_the_passes() {
        let m = |passes| device_method("Vulkan0", 512 << 20, passes);
        assert_eq!(
            m(5),
            "matrix-vector product over a 512.0 MiB f32 matrix by Vulkan0's own kernels, best of 5 passes"
        );
        assert!(
            m(3).ends_with("best of 3 passes (the probe's time limit)"),
            "{}",
            m(3)
        );
        assert!(
            m(1).ends_with("one pass (a slow device: the probe's time limit)"),
            "{}",
            m(1)
        );
    }

    #[test]
    fn the_buffer_outgrows_the_cache_within_bounds() {
        assert_eq!(buffer_size(Some(32 << 20), u64::MAX), Some(256 << 20));
        assert_eq!(buffer_size(Some(128 << 20), u64::MAX), Some(512 << 20));
        assert_eq!(buffer_size(Some(480 << 20), u64::MAX), Some(1 << 30));
        assert_eq!(buffer_size(None, u64::MAX), Some(256 << 20));
        // Little free memory: a quarter of it, or nothing when that is too small to mean anything.
        assert_eq!(buffer_size(Some(32 << 20), 1 << 30), Some(256 << 20));
        assert_eq!(buffer_size(Some(32 << 20), 512 << 20), Some(128 << 20));
        assert_eq!(buffer_size(Some(32 << 20), 100 << 20), None);
    }
}
