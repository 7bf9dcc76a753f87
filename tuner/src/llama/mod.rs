//! Safe wrappers over the few llama.cpp calls the tuner needs, one file per job: backend start-up and
//! devices, model and context lifetimes (timed decoding), RPC servers, and what llama.cpp logs about
//! its buffers and memory.
//!
//! The measurement loop talks to the C API (`llama-cpp-sys-2`) directly, the way llama-bench does,
//! because the knobs it measures (`use_extra_bufts`, `no_alloc`, flash-attention type) are not all
//! exposed by the higher-level `llama-cpp-2` wrapper. Everything unsafe stays in this module.

mod attention;
mod backend;
mod bandwidth;
mod breakdown;
mod context;
mod device;
mod devices;
pub mod fit;
mod link;
mod log;
mod matmul;
mod model;
mod mtp;
mod rpc;
pub mod rpc_check;
pub mod rpc_endpoint;
mod settings;

pub use attention::{runs_kv_pair, AttentionShape};
pub use backend::{
    backend_modules, backends, buffer_type_by_name, build_info, init, numa_init, startup_log,
    system_info, BackendModule,
};
pub use bandwidth::device_read_bandwidth;
pub use breakdown::{breakdown_per_device, memory_breakdown, predicted_mapping};
pub use context::{server_outputs, Context, SeqToken};
pub use device::DeviceInfo;
pub use devices::{device_free_for, device_view, devices, SkippedDevice};
pub use link::device_link;
#[cfg(test)]
pub use log::loaded_modules;
pub use log::{bytes_per_device, cpu_variant, log_tail, parse_buffer_reports, take_log};
pub use matmul::cpu_matmul_rate;
pub use model::{quantize_model, Model, NO_DEVICE};
pub use mtp::{MtpDrafter, MtpWant};
pub use rpc::{rpc_add_servers, rpc_start_server};
pub use settings::{dense_ffn_pattern, expert_pattern, ContextSettings, ModelSettings};

use std::ffi::{c_char, CStr};

/// A failure reported by llama.cpp (not a crash: crashes kill the worker process).
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("llama.cpp could not load the model: {0}")]
    ModelLoad(String),
    #[error("llama.cpp could not create a context: {0}")]
    Context(String),
    #[error("llama_decode failed with status {status}: {log}")]
    Decode { status: i32, log: String },
    /// Stopped at the deadline [`Context::set_deadline`] set.
    #[error("stopped at its deadline")]
    Aborted,
    #[error("unknown device '{0}' (see `autotune doctor` for the device names)")]
    UnknownDevice(String),
    #[error("{0}")]
    Rpc(String),
    #[error("path is not valid UTF-8 or contains NUL: {0}")]
    BadPath(String),
}

/// # Safety
/// `p` is null or a NUL-terminated string.
pub(crate) unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: caller passes a NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}
