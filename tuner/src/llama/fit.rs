//! llama.cpp's own fit routine (`common_fit_params`, what llama-server runs by default) asked for a
//! placement under autotune's budgets, in a worker process: it loads the model several times with
//! `no_alloc` and can abort like any other llama.cpp call. `autotune fit` compares its choice with
//! autotune's own.
//!
//! The fit only changes parameters still at llama.cpp's defaults (layers, tensor split, buffer
//! overrides), keeps the context size given, treats host memory as unlimited, and leaves a margin of
//! free memory per device: the margin is set to free − budget so that each device's usable memory is
//! its autotune budget.

use super::{cstr, LlamaError};
use crate::llama;
use llama_cpp_sys_2 as sys;
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FitRequest {
    pub model: PathBuf,
    /// ggml RPC servers to connect first (they become devices).
    pub rpc: Vec<String>,
    pub n_ctx: u32,
    /// Sequences decoded at once (`-np`), each with `n_ctx / sequences` of the KV cache.
    #[serde(default = "profiles::serde_one::one")]
    pub sequences: u32,
    /// Memory each device may use (autotune's budgets); devices not listed keep `default_margin` free.
    pub budgets: profiles::Budgets,
    pub default_margin: u64,
}

/// One tensor-buffer override llama.cpp's fit set: tensors matching `pattern` go to `buffer_type`
/// (its ggml name, what llama-server's `-ot` expects), which belongs to `device`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TensorOverride {
    pub pattern: String,
    pub buffer_type: String,
    pub device: String,
}

/// A device the fit planned for, with the margin it was told to keep free.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FitDevice {
    pub name: String,
    pub free: u64,
    pub budget: u64,
    pub margin: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FitAnswer {
    /// 0 success, 1 no allocation projected to fit, 2 error (common_params_fit_status).
    pub status: i32,
    pub n_gpu_layers: i32,
    pub n_ctx: u32,
    /// Layers per non-CPU device (only set by the fit when there are several).
    pub tensor_split: Vec<f32>,
    pub overrides: Vec<TensorOverride>,
    /// The devices in the model's order (the order of `tensor_split`).
    pub devices: Vec<FitDevice>,
    /// The fit's last log lines (why it failed, when it did).
    pub log_tail: String,
}

impl FitAnswer {
    pub fn status_name(&self) -> &'static str {
        match self.status {
            0 => "success",
            1 => "failure",
            _ => "error",
        }
    }
}

/// The devices llama.cpp gives a model, in its order (`llama::devices`: RPC servers first, each GPU
/// once), with their registry handles.
fn model_devices() -> Vec<(sys::ggml_backend_dev_t, String)> {
    llama::devices()
        .into_iter()
        .filter(|d| d.takes_layers())
        .filter_map(|d| {
            let name = CString::new(d.name.as_str()).ok()?;
            // SAFETY: looks a registered device's name up in ggml's registry.
            let dev = unsafe { sys::ggml_backend_dev_by_name(name.as_ptr()) };
            (!dev.is_null()).then_some((dev, d.name))
        })
        .collect()
}

/// Runs `common_fit_params` (in a worker: it can abort the process); `Err` with the stage that
/// failed (`rpc`, `load`) and why.
pub fn fit(r: &FitRequest) -> Result<FitAnswer, (&'static str, LlamaError)> {
    llama::rpc_add_servers(&r.rpc).map_err(|e| ("rpc", e))?;
    let Some(path) = r.model.to_str().and_then(|p| CString::new(p).ok()) else {
        return Err(("load", LlamaError::BadPath(r.model.display().to_string())));
    };
    let free: Vec<(String, u64)> = llama::devices()
        .into_iter()
        .map(|d| (d.name, d.memory_free))
        .collect();
    let devs = model_devices();
    let fit_devices = fit_devices(r, &devs, &free);
    Ok(fit_params(&path, &devs, fit_devices, r.n_ctx, r.sequences))
}

/// Each model device's free memory (from `free`, by name), autotune's budget on it (the request's,
/// or free memory less the default margin), and the margin that leaves the fit exactly that budget.
fn fit_devices(
    r: &FitRequest,
    devs: &[(sys::ggml_backend_dev_t, String)],
    free: &[(String, u64)],
) -> Vec<FitDevice> {
    devs.iter()
        .map(|(_, name)| {
            let free = free.iter().find(|(n, _)| n == name).map_or(0, |(_, f)| *f);
            let budget = (r.budgets.of(name)).unwrap_or(free.saturating_sub(r.default_margin));
            FitDevice {
                name: name.clone(),
                free,
                budget,
                margin: free.saturating_sub(budget),
            }
        })
        .collect()
}

/// Calls llama.cpp's fit for the model at `path` on `devs` with their margins, and answers with
/// what it chose.
fn fit_params(
    path: &CString,
    devs: &[(sys::ggml_backend_dev_t, String)],
    fit_devices: Vec<FitDevice>,
    n_ctx: u32,
    sequences: u32,
) -> FitAnswer {
    // SAFETY: plain getters.
    let (max_devices, max_overrides) = unsafe {
        (
            sys::llama_max_devices(),
            sys::llama_max_tensor_buft_overrides(),
        )
    };
    let mut margins: Vec<usize> = fit_devices.iter().map(|d| d.margin as usize).collect();
    margins.resize(max_devices.max(1), 0);
    let mut split = vec![0f32; max_devices.max(1)];
    let mut overrides = vec![
        sys::llama_model_tensor_buft_override {
            pattern: std::ptr::null(),
            buft: std::ptr::null_mut(),
        };
        max_overrides.max(1)
    ];
    let mut dev_list: Vec<sys::ggml_backend_dev_t> = devs.iter().map(|(d, _)| *d).collect();
    dev_list.push(std::ptr::null_mut());
    // SAFETY: default params are plain data.
    let mut mparams = unsafe { sys::llama_model_default_params() };
    // SAFETY: as above.
    let mut cparams = unsafe { sys::llama_context_default_params() };
    if !devs.is_empty() {
        mparams.devices = dev_list.as_mut_ptr();
    }
    cparams.n_ctx = n_ctx;
    cparams.n_seq_max = sequences.max(1);
    cparams.kv_unified = false;
    // The sliding-window cache and the outputs llama-server's context has (see `Context::like_server`).
    cparams.swa_full = false;
    cparams.n_outputs_max = llama::server_outputs(sequences.max(1));
    cparams.n_outputs_max_per_seq = 1;
    llama::take_log();
    // SAFETY: every buffer has the length llama.cpp documents (llama_max_devices floats and margins,
    // llama_max_tensor_buft_overrides entries) and outlives the call; the override patterns it writes
    // are static strings inside llama.cpp.
    let status = unsafe {
        sys::llama_rs_fit_params(
            path.as_ptr(),
            &mut mparams,
            &mut cparams,
            split.as_mut_ptr(),
            overrides.as_mut_ptr(),
            margins.as_mut_ptr(),
            n_ctx,
            std::ptr::null(),
            sys::GGML_LOG_LEVEL_INFO,
        )
    };
    let log = llama::take_log();
    let chosen = if mparams.tensor_buft_overrides.is_null() {
        Vec::new()
    } else {
        chosen_overrides(&overrides)
    };
    let tensor_split = if devs.len() > 1 && split[..devs.len()].iter().any(|v| *v != 0.0) {
        split[..devs.len()].to_vec()
    } else {
        Vec::new()
    };
    FitAnswer {
        status,
        n_gpu_layers: mparams.n_gpu_layers,
        n_ctx: cparams.n_ctx,
        tensor_split,
        overrides: chosen,
        devices: fit_devices,
        log_tail: llama::log_tail(&log),
    }
}

/// The buffer overrides the fit wrote, up to the first empty entry.
fn chosen_overrides(overrides: &[sys::llama_model_tensor_buft_override]) -> Vec<TensorOverride> {
    let mut chosen = Vec::new();
    for o in overrides {
        if o.pattern.is_null() {
            break;
        }
        // SAFETY: the fit wrote a NUL-terminated pattern and a registered buffer type.
        let (pattern, buffer_type, device) = unsafe {
            let dev = sys::ggml_backend_buft_get_device(o.buft);
            (
                cstr(o.pattern),
                cstr(sys::ggml_backend_buft_name(o.buft)),
                // The host's buffer type has no device of its own here: it is the CPU.
                if dev.is_null() {
                    "CPU".to_string()
                } else {
                    cstr(sys::ggml_backend_dev_name(dev))
                },
            )
        };
        chosen.push(TensorOverride {
            pattern,
            buffer_type,
            device,
        });
    }
    chosen
}

/// The `--n-cpu-moe N` that sets the same overrides, when the fit's overrides are exactly "the
/// expert tensors of layers 0..N on the CPU" (or of every layer); `None` otherwise (use `-ot`).
pub fn as_n_cpu_moe(overrides: &[TensorOverride], n_layer: u32) -> Option<u32> {
    if overrides.is_empty() || overrides.iter().any(|o| o.device != "CPU") {
        return None;
    }
    const TAIL: &str = "\\.ffn_(up|down|gate_up|gate)_(ch|)exps";
    if overrides.len() == 1 && overrides[0].pattern == format!("blk\\.\\d+{TAIL}") {
        return Some(n_layer);
    }
    let mut layers: Vec<u32> = overrides
        .iter()
        .map(|o| {
            o.pattern
                .strip_prefix("blk\\.")?
                .strip_suffix(TAIL)?
                .parse()
                .ok()
        })
        .collect::<Option<_>>()?;
    layers.sort_unstable();
    let n = layers.len() as u32;
    (layers == (0..n).collect::<Vec<_>>()).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(p: &str) -> TensorOverride {
        TensorOverride {
            pattern: p.into(),
            buffer_type: "CPU".into(),
            device: "CPU".into(),
        }
    }

    #[test]
    fn expert_overrides_of_the_first_layers_are_n_cpu_moe() {
        let o: Vec<_> = (0..3)
            .map(|i| cpu(&format!("blk\\.{i}\\.ffn_(up|down|gate_up|gate)_(ch|)exps")))
            .collect();
        assert_eq!(as_n_cpu_moe(&o, 8), Some(3));
        assert_eq!(
            as_n_cpu_moe(
                &[cpu("blk\\.\\d+\\.ffn_(up|down|gate_up|gate)_(ch|)exps")],
                8
            ),
            Some(8)
        );
        // The last layers (as the fit places them) or a partial layer are not expressible.
        assert_eq!(as_n_cpu_moe(&o[1..], 8), None);
        assert_eq!(as_n_cpu_moe(&[cpu("blk\\.0\\.ffn_down.*")], 8), None);
        assert_eq!(as_n_cpu_moe(&[], 8), None);
    }
}
