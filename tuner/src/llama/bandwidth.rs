//! The read bandwidth of a device's memory, measured with its own ggml kernels.

use super::LlamaError;
use llama_cpp_sys_2 as sys;
use std::ffi::CString;

/// What [`device_read_bandwidth`] measured.
#[derive(Debug, Clone, Copy)]
pub struct ProbeResult {
    /// The best pass's bytes per second.
    pub bytes_per_s: f64,
    /// The matrix's bytes (what each pass read).
    pub bytes: u64,
    /// The passes timed.
    pub passes: u32,
}

/// The read bandwidth of a device's memory, measured by that device's own kernels: a matrix-vector
/// product (what generating a token does with every weight matrix) over an f32 matrix of about
/// `bytes` in the device's memory, timed around a synchronised compute, best of `passes` after a
/// warm-up, with no pass after the first started once `time_limit` has gone by.
pub fn device_read_bandwidth(
    device: &str,
    bytes: u64,
    passes: u32,
    time_limit: std::time::Duration,
) -> Result<ProbeResult, LlamaError> {
    const K: i64 = 4096;
    let name = CString::new(device).map_err(|_| LlamaError::UnknownDevice(device.into()))?;
    // SAFETY: ggml's backend registry is initialised (init()); the name is NUL-terminated.
    let dev = unsafe { sys::ggml_backend_dev_by_name(name.as_ptr()) };
    if dev.is_null() {
        return Err(LlamaError::UnknownDevice(device.into()));
    }
    let rows = (bytes / (4 * K as u64)).max(1) as i64;
    let matrix_bytes = (rows * K * 4) as u64;
    let failed = |what: &str| LlamaError::Context(format!("bandwidth probe on {device}: {what}"));
    // SAFETY: every pointer below is checked before use and freed once, in reverse order of
    // creation; the graph and tensors live in `ctx`, whose metadata buffer ggml allocates.
    unsafe {
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        if backend.is_null() {
            return Err(failed("the device did not start"));
        }
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: sys::ggml_tensor_overhead() * 4 + sys::ggml_graph_overhead(),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        if ctx.is_null() {
            sys::ggml_backend_free(backend);
            return Err(failed("no ggml context"));
        }
        let w = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, K, rows);
        let x = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, K);
        let y = sys::ggml_mul_mat(ctx, w, x);
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        let result = if buffer.is_null() {
            Err(failed("the device could not allocate the matrix"))
        } else {
            // Written before timing (0x01 bytes: small normal floats), so no page is a shared zero page.
            sys::ggml_backend_buffer_clear(buffer, 1);
            let graph = sys::ggml_new_graph(ctx);
            sys::ggml_build_forward_expand(graph, y);
            // One pass, finished: after synchronize, reading a result back waits for the compute
            // on every backend (an RPC server answers a later command only after the graph it was
            // sent has run; its synchronize is a no-op).
            let pass = || {
                let status = sys::ggml_backend_graph_compute(backend, graph);
                sys::ggml_backend_synchronize(backend);
                let mut first = 0f32;
                sys::ggml_backend_tensor_get(y, (&mut first as *mut f32).cast(), 0, 4);
                status
            };
            let (status, best, timed) = timed_passes(pass, matrix_bytes, passes, time_limit);
            sys::ggml_backend_buffer_free(buffer);
            if status == sys::GGML_STATUS_SUCCESS {
                Ok(ProbeResult {
                    bytes_per_s: best,
                    bytes: matrix_bytes,
                    passes: timed,
                })
            } else {
                Err(failed(&format!("compute failed with status {status}")))
            }
        };
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
        result
    }
}

/// A warm-up pass, then up to `passes` timed ones (at least one; none started after `time_limit`
/// from the warm-up's start: a slow device, a CPU Vulkan driver reading a few MB/s, stops there).
/// The last status, the best pass's bytes per second, and the passes timed.
fn timed_passes(
    mut pass: impl FnMut() -> sys::ggml_status,
    bytes: u64,
    passes: u32,
    time_limit: std::time::Duration,
) -> (sys::ggml_status, f64, u32) {
    let mut best = 0.0f64;
    let started = std::time::Instant::now();
    let mut status = pass(); // warm-up
    let mut timed = 0;
    while timed < passes.max(1) && (timed == 0 || started.elapsed() < time_limit) {
        if status != sys::GGML_STATUS_SUCCESS {
            break;
        }
        timed += 1;
        let t = std::time::Instant::now();
        status = pass();
        let secs = t.elapsed().as_secs_f64();
        if secs > 0.0 {
            best = best.max(bytes as f64 / secs);
        }
    }
    (status, best, timed)
}
