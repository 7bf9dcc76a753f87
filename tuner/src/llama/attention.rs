//! Whether a device runs flash attention over a K/V cache pair: what llama.cpp's scheduler asks
//! (the device's `supports_op` for the attention op, with the model's head sizes and the pair's
//! types), then the op computed once on the device over a tiny cache, the decode of one token and
//! of a small batch. A device that declines the op would have it run on the CPU instead (with
//! `-fa on`), or the context refused (a quantized V cache needs flash attention); one whose kernel
//! aborts ends the worker, which the parent records as "does not run it".

use super::context::ggml_type;
use super::LlamaError;
use llama_cpp_sys_2 as sys;
use search_space::CacheType;
use std::ffi::CString;

/// The attention's shape: head sizes of K and V, query and K/V heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttentionShape {
    pub head_k: u32,
    pub head_v: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
}

/// Cache positions of the tiny cache the op attends over.
const N_KV: i64 = 256;

/// Whether `device` runs flash attention with a `type_k` K cache and a `type_v` V cache of this
/// shape: it says so for a decode (one token) and a small batch, and computes both.
pub fn runs_kv_pair(
    device: &str,
    (type_k, type_v): (CacheType, CacheType),
    shape: AttentionShape,
) -> Result<bool, LlamaError> {
    let name = CString::new(device).map_err(|_| LlamaError::UnknownDevice(device.into()))?;
    // SAFETY: ggml's backend registry is initialised (init()); the name is NUL-terminated.
    let dev = unsafe { sys::ggml_backend_dev_by_name(name.as_ptr()) };
    if dev.is_null() {
        return Err(LlamaError::UnknownDevice(device.into()));
    }
    let failed = |what: &str| LlamaError::Context(format!("attention probe on {device}: {what}"));
    let (hk, hv) = (i64::from(shape.head_k), i64::from(shape.head_v));
    let (nh, nkv) = (i64::from(shape.n_head), i64::from(shape.n_head_kv.max(1)));
    // SAFETY: every pointer is checked before use and freed once, in reverse order of creation;
    // the tensors and the graph live in `ctx`, whose metadata buffer ggml allocates.
    unsafe {
        let ctx = sys::ggml_init(sys::ggml_init_params {
            mem_size: sys::ggml_tensor_overhead() * 12 + sys::ggml_graph_overhead(),
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        });
        if ctx.is_null() {
            return Err(failed("no ggml context"));
        }
        let k = sys::ggml_new_tensor_4d(ctx, ggml_type(type_k), hk, N_KV, nkv, 1);
        let v = sys::ggml_new_tensor_4d(ctx, ggml_type(type_v), hv, N_KV, nkv, 1);
        let ops: Vec<*mut sys::ggml_tensor> = [1i64, 8]
            .iter()
            .map(|&batch| {
                let q = sys::ggml_new_tensor_4d(ctx, sys::GGML_TYPE_F32, hk, batch, nh, 1);
                let mask = sys::ggml_new_tensor_4d(ctx, sys::GGML_TYPE_F16, N_KV, batch, 1, 1);
                let scale = 1.0 / (hk as f32).sqrt();
                sys::ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0, 0.0)
            })
            .collect();
        let declined = ops
            .iter()
            .any(|&op| !sys::ggml_backend_dev_supports_op(dev, op));
        let result = if declined {
            Ok(false)
        } else {
            compute(dev, ctx, &ops).map_err(|e| failed(&e))
        };
        sys::ggml_free(ctx);
        result
    }
}

/// Computes `ops` (of `ctx`) on `dev` over zeroed tensors: whether it ran. `dev` is a registered
/// device; `ctx` holds `ops` and has room for a graph ([`runs_kv_pair`]'s).
fn compute(
    dev: sys::ggml_backend_dev_t,
    ctx: *mut sys::ggml_context,
    ops: &[*mut sys::ggml_tensor],
) -> Result<bool, String> {
    // SAFETY: the backend and the buffer are checked before use and freed once, the buffer
    // before the backend; the graph lives in `ctx`, which outlives this call.
    unsafe {
        let backend = sys::ggml_backend_dev_init(dev, std::ptr::null());
        if backend.is_null() {
            return Err("the device did not start".into());
        }
        let buffer = sys::ggml_backend_alloc_ctx_tensors(ctx, backend);
        let result = if buffer.is_null() {
            Err("the device could not allocate the tiny cache".to_string())
        } else {
            sys::ggml_backend_buffer_clear(buffer, 0);
            let graph = sys::ggml_new_graph(ctx);
            for &op in ops {
                sys::ggml_build_forward_expand(graph, op);
            }
            let status = sys::ggml_backend_graph_compute(backend, graph);
            sys::ggml_backend_synchronize(backend);
            sys::ggml_backend_buffer_free(buffer);
            Ok(status == sys::GGML_STATUS_SUCCESS)
        };
        sys::ggml_backend_free(backend);
        result
    }
}
