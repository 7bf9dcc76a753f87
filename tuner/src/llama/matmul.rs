//! The peak of the CPU's matrix multiplication for a prompt, by ggml's own kernels: a weight matrix
//! of the model's type times a micro-batch of activations, as prompt processing multiplies every
//! weight, in the CPU's own buffer (plain kernels) or in one of its extra buffer types (the
//! repacked and AMX kernels, where they take the type).

use super::LlamaError;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_void, CStr};
use std::time::{Duration, Instant};

/// The weight matrix's columns (its input) and rows, and the micro-batch's tokens (llama.cpp's
/// default micro-batch): large enough for the multiplication to be bound by compute, small enough
/// for a pass to take a few milliseconds on a fast machine and a tenth of a second on two cores.
const K: i64 = 2048;
const N: i64 = 2048;
const TOKENS: i64 = 512;

/// What [`cpu_matmul_rate`] measured.
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulRate {
    /// The best pass's multiply-adds a second, counted as two operations each.
    pub flops_per_s: f64,
    /// The buffer type the weights were in (`CPU`, `CPU_REPACK`, `AMX`).
    pub buffer: String,
    pub passes: u32,
}

/// The CPU's matrix-multiply rate on weights of ggml type `ggml_type` with `threads` threads: the
/// best over the CPU's own buffer and each extra buffer type that takes the type, each the best of
/// up to `passes` timed passes after a warm-up (none started after `time_limit`).
pub fn cpu_matmul_rate(
    ggml_type: u32,
    threads: u32,
    passes: u32,
    time_limit: Duration,
) -> Result<MatmulRate, LlamaError> {
    let failed = |what: &str| LlamaError::Context(format!("matrix-multiply probe: {what}"));
    // SAFETY: ggml's registry is initialised (init()); every pointer is checked before use.
    unsafe {
        let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        if dev.is_null() {
            return Err(failed("no CPU device"));
        }
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        if backend.is_null() {
            return Err(failed("the CPU backend did not start"));
        }
        let reg = sys::ggml_backend_dev_backend_reg(dev);
        if let Some(set) =
            proc::<sys::ggml_backend_set_n_threads_t>(reg, c"ggml_backend_set_n_threads")
        {
            set(backend, threads.max(1) as i32);
        }
        let mut bufts: Vec<sys::ggml_backend_buffer_type_t> =
            vec![sys::ggml_backend_dev_buffer_type(dev)];
        if let Some(extra) = proc::<sys::ggml_backend_dev_get_extra_bufts_t>(
            reg,
            c"ggml_backend_dev_get_extra_bufts",
        ) {
            let mut p = extra(dev);
            while !p.is_null() && !(*p).is_null() {
                bufts.push(*p);
                p = p.add(1);
            }
        }
        let mut best: Option<MatmulRate> = None;
        let mut last_err = None;
        for buft in bufts {
            match rate_in(dev, backend, buft, ggml_type, passes, time_limit) {
                Ok(Some(r)) if best.as_ref().is_none_or(|b| r.flops_per_s > b.flops_per_s) => {
                    best = Some(r)
                }
                Ok(_) => {}
                Err(e) => last_err = Some(e),
            }
        }
        sys::ggml_backend_free(backend);
        best.ok_or_else(|| last_err.unwrap_or_else(|| failed("no buffer type took the weights")))
    }
}

/// A registry's function by name, as the type `T` (an `Option` of an `extern "C" fn`).
///
/// # Safety
/// `T` must be the function's type as ggml declares it.
unsafe fn proc<T: Copy + Default>(reg: sys::ggml_backend_reg_t, name: &CStr) -> T {
    if reg.is_null() {
        return T::default();
    }
    // SAFETY: a registry lookup by a NUL-terminated name; the caller names the function's type.
    unsafe {
        let p: *mut c_void = sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
        if p.is_null() {
            return T::default();
        }
        std::mem::transmute_copy(&p)
    }
}

/// The rate with the weights in `buft`; `None` where that buffer type does not take them (an
/// extra buffer type's kernels are for some types and shapes only).
///
/// # Safety
/// `dev` and `backend` are the CPU's, live.
unsafe fn rate_in(
    dev: sys::ggml_backend_dev_t,
    backend: sys::ggml_backend_t,
    buft: sys::ggml_backend_buffer_type_t,
    ggml_type: u32,
    passes: u32,
    time_limit: Duration,
) -> Result<Option<MatmulRate>, LlamaError> {
    // SAFETY: `dev` and `backend` are the CPU's, live; every pointer is checked before use and
    // freed once.
    unsafe {
        let failed = |what: &str| LlamaError::Context(format!("matrix-multiply probe: {what}"));
        let meta = |n: usize| sys::ggml_init_params {
            mem_size: sys::ggml_tensor_overhead() * n + sys::ggml_graph_overhead(),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        let (cw, cx) = (sys::ggml_init(meta(1)), sys::ggml_init(meta(2)));
        if cw.is_null() || cx.is_null() {
            return Err(failed("no ggml context"));
        }
        let w = sys::ggml_new_tensor_2d(cw, ggml_type as sys::ggml_type, K, N);
        let x = sys::ggml_new_tensor_2d(cx, sys::GGML_TYPE_F32, K, TOKENS);
        let y = sys::ggml_mul_mat(cx, w, x);
        let bw = sys::ggml_backend_alloc_ctx_tensors_from_buft(cw, buft);
        let bx = sys::ggml_backend_alloc_ctx_tensors(cx, backend);
        let name = CStr::from_ptr(sys::ggml_backend_buft_name(buft))
            .to_string_lossy()
            .into_owned();
        let result = if bw.is_null() || bx.is_null() {
            Err(failed("the matrices could not be allocated"))
        } else if !sys::ggml_backend_dev_supports_op(dev, y) {
            Ok(None)
        } else {
            // Bytes of 0x3C: normal scales and values in every type (f16 1.06, f32 0.0115), so no
            // subnormal slows the arithmetic; written through the buffer (repacked where it repacks).
            let bytes = vec![0x3Cu8; sys::ggml_nbytes(w)];
            sys::ggml_backend_tensor_set(w, bytes.as_ptr().cast(), 0, bytes.len());
            sys::ggml_backend_buffer_clear(bx, 0x3C);
            let graph = sys::ggml_new_graph(cx);
            sys::ggml_build_forward_expand(graph, y);
            let flops = 2.0 * (K * N * TOKENS) as f64;
            let (ok, best, timed) = timed(
                || sys::ggml_backend_graph_compute(backend, graph),
                passes,
                time_limit,
            );
            ok.then(|| MatmulRate {
                flops_per_s: flops / best,
                buffer: name,
                passes: timed,
            })
            .ok_or_else(|| failed("the multiplication failed"))
            .map(Some)
        };
        for b in [bw, bx] {
            if !b.is_null() {
                sys::ggml_backend_buffer_free(b);
            }
        }
        sys::ggml_free(cw);
        sys::ggml_free(cx);
        result
    }
}

/// A warm-up, then up to `passes` timed passes (at least one; none started after `limit`): whether
/// every pass succeeded, the best pass's seconds, the passes timed.
fn timed(
    mut pass: impl FnMut() -> sys::ggml_status,
    passes: u32,
    limit: Duration,
) -> (bool, f64, u32) {
    let started = Instant::now();
    let mut ok = pass() == sys::GGML_STATUS_SUCCESS;
    let (mut best, mut n) = (f64::INFINITY, 0);
    while ok && n < passes.max(1) && (n == 0 || started.elapsed() < limit) {
        let t = Instant::now();
        ok = pass() == sys::GGML_STATUS_SUCCESS;
        best = best.min(t.elapsed().as_secs_f64().max(1e-9));
        n += 1;
    }
    (ok && n > 0, best, n)
}
