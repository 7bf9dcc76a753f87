//! Safe wrappers over the few llama.cpp calls the tuner needs: backend start-up, devices, model and
//! context lifetimes, timed decoding, and the log lines llama.cpp writes about its buffers.
//!
//! The measurement loop talks to the C API (`llama-cpp-sys-2`) directly, the way llama-bench does,
//! because the knobs it measures (`use_extra_bufts`, `no_alloc`, flash-attention type) are not all
//! exposed by the higher-level `llama-cpp-2` wrapper. Everything unsafe stays in this file.

use llama_cpp_sys_2 as sys;
pub use profiles::measurements::BufferReport;
use search_space::{CacheType, FlashAttn};
use serde::{Deserialize, Serialize};
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, OnceLock};

/// A failure reported by llama.cpp (not a crash: crashes kill the worker process).
#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("llama.cpp could not load the model: {0}")]
    ModelLoad(String),
    #[error("llama.cpp could not create a context: {0}")]
    Context(String),
    #[error("llama_decode failed with status {status}: {log}")]
    Decode { status: i32, log: String },
    #[error("unknown device '{0}' (see `autotune doctor` for the device names)")]
    UnknownDevice(String),
    #[error("rpc: {0}")]
    Rpc(String),
    #[error("path is not valid UTF-8 or contains NUL: {0}")]
    BadPath(String),
}

/// Devices and backends as llama.cpp sees them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub description: String,
    pub backend: String,
    /// cpu, gpu, igpu, accel
    pub kind: String,
    pub memory_free: u64,
    pub memory_total: u64,
}

impl DeviceInfo {
    /// A device served by a ggml RPC server (`RPC0`, …).
    pub fn is_rpc(&self) -> bool {
        self.backend.eq_ignore_ascii_case("RPC")
    }
}

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
static ECHO_LOG: OnceLock<bool> = OnceLock::new();
static BACKEND: OnceLock<llama_cpp_2::llama_backend::LlamaBackend> = OnceLock::new();

extern "C" fn log_callback(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let line = unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    if *ECHO_LOG.get().unwrap_or(&false) {
        eprint!("{line}");
    }
    let _ = level;
    if let Ok(mut log) = LOG.lock() {
        // Continuation lines (level CONT) are appended to the previous entry.
        if level == sys::GGML_LOG_LEVEL_CONT {
            if let Some(last) = log.last_mut() {
                last.push_str(&line);
                return;
            }
        }
        log.push(line);
        if log.len() > 20_000 {
            log.drain(..10_000);
        }
    }
}

/// Takes (and clears) what llama.cpp has logged since the last call.
pub fn take_log() -> Vec<String> {
    LOG.lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default()
}

/// The last error-looking lines of a log, for failure reasons.
pub fn log_tail(log: &[String]) -> String {
    let errors: Vec<&str> = log
        .iter()
        .map(|s| s.trim())
        .filter(|s| s.contains("error") || s.contains("failed") || s.contains("ERROR"))
        .collect();
    let lines = if errors.is_empty() {
        log.iter().map(|s| s.trim()).collect::<Vec<_>>()
    } else {
        errors
    };
    lines
        .iter()
        .rev()
        .take(2)
        .rev()
        .cloned()
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Starts llama.cpp once per process: routes its log into our buffer (echoed to stderr when `echo`),
/// and loads every backend module present (CPU variants, CUDA, Vulkan, RPC, ...).
pub fn init(echo: bool) {
    let _ = ECHO_LOG.set(echo);
    BACKEND.get_or_init(|| {
        // SAFETY: the callback is a plain function that lives for the whole program.
        unsafe { sys::llama_log_set(Some(log_callback), std::ptr::null_mut()) };
        load_backend_modules();
        llama_cpp_2::llama_backend::LlamaBackend::init()
            .expect("llama.cpp backend initialises once")
    });
}

/// Backend modules are looked for in `AUTOTUNE_BACKEND_DIR`, next to the executable (`backends/`),
/// in `<exe dir>/../lib/autotune` (what `scripts/install` writes: `PREFIX/bin/autotune` beside
/// `PREFIX/lib/autotune/`), and in the directory the build wrote them to. The installed layouts come
/// before the build's directory, so an installed binary loads its own modules even while the build
/// it came from still exists.
fn load_backend_modules() {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("AUTOTUNE_BACKEND_DIR") {
        dirs.push(d.into());
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(bin) = exe.parent() {
            dirs.push(bin.join("backends"));
            if let Some(prefix) = bin.parent() {
                dirs.push(prefix.join("lib").join("autotune"));
            }
        }
    }
    if let Some(d) = sys::BACKENDS_DIR {
        dirs.push(d.into());
    }
    for d in dirs {
        let has_cpu = std::fs::read_dir(&d)
            .map(|it| {
                it.flatten()
                    .any(|e| e.file_name().to_string_lossy().contains("ggml-cpu"))
            })
            .unwrap_or(false);
        if has_cpu {
            let _ = MODULE_DIR.set(d.clone());
            llama_cpp_2::llama_backend::load_backends_from_path(&d);
            return;
        }
    }
    // SAFETY: plain call; searches ggml's default locations.
    unsafe { sys::ggml_backend_load_all() };
}

pub fn devices() -> Vec<DeviceInfo> {
    llama_cpp_2::list_llama_ggml_backend_devices()
        .into_iter()
        .map(|d| DeviceInfo {
            name: d.name,
            description: d.description,
            backend: d.backend,
            kind: match d.device_type {
                llama_cpp_2::LlamaBackendDeviceType::Cpu => "cpu",
                llama_cpp_2::LlamaBackendDeviceType::Gpu => "gpu",
                llama_cpp_2::LlamaBackendDeviceType::IntegratedGpu => "igpu",
                llama_cpp_2::LlamaBackendDeviceType::Accelerator => "accel",
                _ => "unknown",
            }
            .to_string(),
            memory_free: d.memory_free as u64,
            memory_total: d.memory_total as u64,
        })
        .collect()
}

/// Names of the registered backends (`CPU`, `RPC`, `CUDA`, ...).
pub fn backends() -> Vec<String> {
    // SAFETY: plain getters over ggml's registry; names are static strings.
    unsafe {
        (0..sys::ggml_backend_reg_count())
            .map(|i| cstr(sys::ggml_backend_reg_name(sys::ggml_backend_reg_get(i))))
            .collect()
    }
}

/// The directory `init` loaded the backend modules from; unset when ggml searched by itself.
static MODULE_DIR: OnceLock<std::path::PathBuf> = OnceLock::new();

/// One backend module file (`libggml-<name>.so`) of the directory `init` loaded modules from.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BackendModule {
    pub file: String,
    /// The backend ggml registered from this file (`CPU`, `CUDA`, `RPC`, ...); None when ggml did
    /// not load it (another CPU variant was chosen, or the file could not be opened).
    pub backend: Option<String>,
    /// Devices that backend has now (a CUDA module without an NVIDIA driver registers none).
    pub devices: usize,
}

/// The module directory and each module in it, with the backend ggml registered from it (matched
/// by ggml's "loaded CUDA backend from DIR/libggml-cuda.so" lines in `log`, what `init` logged) and
/// that backend's device count. Empty for a build without loadable modules.
pub fn backend_modules(log: &[String]) -> (Option<std::path::PathBuf>, Vec<BackendModule>) {
    let Some(dir) = MODULE_DIR.get() else {
        return (None, Vec::new());
    };
    let loaded = loaded_modules(log);
    // SAFETY: plain getters over ggml's registry; names are static strings.
    let counts: Vec<(String, usize)> = unsafe {
        (0..sys::ggml_backend_reg_count())
            .map(|i| {
                let reg = sys::ggml_backend_reg_get(i);
                (
                    cstr(sys::ggml_backend_reg_name(reg)),
                    sys::ggml_backend_reg_dev_count(reg),
                )
            })
            .collect()
    };
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| {
                    f.starts_with("libggml-") && f.ends_with(".so") && f != "libggml-base.so"
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let modules = files
        .into_iter()
        .map(|file| {
            let backend = loaded
                .iter()
                .find(|(_, f)| *f == file)
                .map(|(b, _)| b.clone());
            let devices = backend
                .as_ref()
                .and_then(|b| counts.iter().find(|(n, _)| n == b))
                .map_or(0, |(_, c)| *c);
            BackendModule {
                file,
                backend,
                devices,
            }
        })
        .collect();
    (Some(dir.clone()), modules)
}

/// `(backend, file name)` of each "load_backend: loaded CUDA backend from /dir/libggml-cuda.so"
/// line ggml logged.
pub fn loaded_modules(log: &[String]) -> Vec<(String, String)> {
    log.iter()
        .filter_map(|l| {
            let rest = &l[l.find("loaded ")? + "loaded ".len()..];
            let (name, path) = rest.split_once(" backend from ")?;
            let file = Path::new(path.trim())
                .file_name()?
                .to_string_lossy()
                .into_owned();
            Some((name.to_string(), file))
        })
        .collect()
}

/// llama.cpp's own system information line (`CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | ...`).
pub fn system_info() -> String {
    // SAFETY: returns a static string.
    unsafe { cstr(sys::llama_print_system_info()) }
        .trim()
        .to_string()
}

/// The CPU variant ggml loaded (from the module file name it logged, or from system info).
pub fn cpu_variant(log: &[String]) -> Option<String> {
    log.iter().find_map(|l| {
        let i = l.find("libggml-cpu-")?;
        let rest = &l[i + "libggml-cpu-".len()..];
        Some(rest.split(".so").next()?.to_string())
    })
}

extern "C" {
    // Globals of llama.cpp's build-info (C++ globals are not name-mangled).
    static LLAMA_BUILD_NUMBER: i32;
    static LLAMA_COMMIT: *const c_char;
}

/// The llama.cpp build this binary links: its version the way llama.cpp's tools print it
/// (`0.6.0-dev (build N, commit C)`), and the commit.
pub fn build_info() -> (String, String) {
    // SAFETY: read-only globals initialised at load time.
    let (number, commit) = unsafe { (LLAMA_BUILD_NUMBER, cstr(LLAMA_COMMIT)) };
    let commit = if commit.is_empty() || commit == "unknown" {
        "llama-cpp-sys-2 0.1.161".to_string()
    } else {
        commit
    };
    // The same sources built another way (-O2 vs -O3, other flags) measure differently: the
    // compiler settings are part of the build's identity (measurement cache keys, profile staleness).
    let commit = match option_env!("AUTOTUNE_LLAMA_BUILD_CONFIG") {
        Some(config) => format!("{commit} ({config})"),
        None => commit,
    };
    (
        format!("{LLAMA_VERSION} (build {number}, commit {commit})"),
        commit,
    )
}

/// llama.cpp's version (its CMakeLists' LLAMA_VERSION) of the sources llama-cpp-sys-2 0.1.161 vendors.
pub const LLAMA_VERSION: &str = "0.6.0-dev";

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

/// Model-side settings: a change here needs a new model load.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelSettings {
    pub n_gpu_layers: u32,
    pub devices: Vec<String>,
    pub use_extra_bufts: bool,
    /// Only simulate allocations (dry run): sizes are logged, nothing is computed.
    #[serde(default)]
    pub no_alloc: bool,
    /// ggml RPC servers (`host:port`) to connect before loading: they become devices.
    #[serde(default)]
    pub rpc: Vec<String>,
    /// MoE: expert tensors of the first N layers stay in host memory (llama.cpp's --n-cpu-moe).
    #[serde(default)]
    pub n_cpu_moe: u32,
    /// Tensors whose names match a pattern go to a buffer type (llama.cpp's `-ot PATTERN=BUFT`); the
    /// buffer type is named by its ggml name or its device's name (`CPU`, `RPC0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_overrides: Vec<(String, String)>,
    /// Share of the offloaded layers per non-CPU device (llama.cpp's `-ts`); empty = llama.cpp's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u32>,
    /// llama.cpp's `-sm`: whole layers per device, or rows of every layer across devices.
    #[serde(default, skip_serializing_if = "search_space::SplitMode::is_layer")]
    pub split_mode: search_space::SplitMode,
}

impl Default for ModelSettings {
    /// llama.cpp's own defaults on this machine's devices: nothing offloaded, extra buffer types
    /// (weight repack / AMX) on, a real load.
    fn default() -> Self {
        ModelSettings {
            n_gpu_layers: 0,
            devices: Vec::new(),
            use_extra_bufts: true,
            no_alloc: false,
            rpc: Vec::new(),
            n_cpu_moe: 0,
            tensor_overrides: Vec::new(),
            tensor_split: Vec::new(),
            split_mode: search_space::SplitMode::Layer,
        }
    }
}

/// A buffer type by its ggml name (`CPU`, `RPC0[127.0.0.1:50052]`, `CUDA0`) or its device's name.
pub fn buffer_type_by_name(name: &str) -> Option<sys::ggml_backend_buffer_type_t> {
    // SAFETY: registry getters; names are static strings.
    unsafe {
        (0..sys::ggml_backend_dev_count()).find_map(|i| {
            let dev = sys::ggml_backend_dev_get(i);
            let buft = sys::ggml_backend_dev_buffer_type(dev);
            (cstr(sys::ggml_backend_dev_name(dev)) == name
                || cstr(sys::ggml_backend_buft_name(buft)) == name)
                .then_some(buft)
        })
    }
}

/// The tensor-name pattern of one layer's expert tensors, as llama.cpp's `--n-cpu-moe` writes it
/// (covers the fused `gate_up` tensors and the `chexps` variant too).
pub fn expert_pattern(layer: u32) -> String {
    format!("blk\\.{layer}\\.ffn_(up|down|gate|gate_up)_(ch|)exps")
}

/// Context-side settings: a change here needs only a new context.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ContextSettings {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub threads: u32,
    pub type_k: CacheType,
    pub type_v: CacheType,
    pub flash_attn: FlashAttn,
}

pub struct Model {
    ptr: NonNull<sys::llama_model>,
}

// SAFETY: a llama_model is immutable after loading and may be shared between threads.
unsafe impl Send for Model {}

impl Model {
    pub fn load(path: &Path, s: &ModelSettings) -> Result<Model, LlamaError> {
        let cpath = path
            .to_str()
            .and_then(|p| CString::new(p).ok())
            .ok_or_else(|| LlamaError::BadPath(path.display().to_string()))?;
        let mut devs: Vec<sys::ggml_backend_dev_t> = Vec::new();
        for name in &s.devices {
            let cname =
                CString::new(name.as_str()).map_err(|_| LlamaError::UnknownDevice(name.clone()))?;
            // SAFETY: looks a name up in ggml's device registry.
            let dev = unsafe { sys::ggml_backend_dev_by_name(cname.as_ptr()) };
            if dev.is_null() {
                return Err(LlamaError::UnknownDevice(name.clone()));
            }
            devs.push(dev);
        }
        devs.push(std::ptr::null_mut());
        // Expert tensors of the first n_cpu_moe layers → the CPU's buffer type (NULL-terminated list).
        let patterns: Vec<CString> = (0..s.n_cpu_moe)
            .map(|i| CString::new(expert_pattern(i)).expect("no NUL in pattern"))
            .collect();
        let mut overrides: Vec<sys::llama_model_tensor_buft_override> = Vec::new();
        let manual: Vec<(CString, sys::ggml_backend_buffer_type_t)> = s
            .tensor_overrides
            .iter()
            .map(|(pattern, buft)| {
                let p = CString::new(pattern.as_str()).map_err(|_| {
                    LlamaError::ModelLoad(format!("bad tensor pattern '{pattern}'"))
                })?;
                let b = buffer_type_by_name(buft)
                    .ok_or_else(|| LlamaError::UnknownDevice(buft.clone()))?;
                Ok((p, b))
            })
            .collect::<Result<_, LlamaError>>()?;
        for (p, b) in &manual {
            overrides.push(sys::llama_model_tensor_buft_override {
                pattern: p.as_ptr(),
                buft: *b,
            });
        }
        if !patterns.is_empty() {
            // SAFETY: registry lookups.
            let cpu_buft = unsafe {
                sys::ggml_backend_dev_buffer_type(sys::ggml_backend_dev_by_type(
                    sys::GGML_BACKEND_DEVICE_TYPE_CPU,
                ))
            };
            for p in &patterns {
                overrides.push(sys::llama_model_tensor_buft_override {
                    pattern: p.as_ptr(),
                    buft: cpu_buft,
                });
            }
        }
        if !overrides.is_empty() {
            overrides.push(sys::llama_model_tensor_buft_override {
                pattern: std::ptr::null(),
                buft: std::ptr::null_mut(),
            });
        }
        // llama.cpp reads llama_max_devices() entries.
        // SAFETY: plain getter.
        let mut split = vec![0f32; unsafe { sys::llama_max_devices() }];
        for (slot, v) in split.iter_mut().zip(&s.tensor_split) {
            *slot = *v as f32;
        }
        // SAFETY: default params are plain data.
        let mut p = unsafe { sys::llama_model_default_params() };
        p.n_gpu_layers = s.n_gpu_layers.min(i32::MAX as u32) as i32;
        p.use_extra_bufts = s.use_extra_bufts;
        p.no_alloc = s.no_alloc;
        if s.no_alloc {
            // As llama.cpp's own fit routine does: no mmap in a dry run, so host buffers are counted.
            p.load_mode = sys::LLAMA_LOAD_MODE_NONE;
        }
        if !s.devices.is_empty() {
            p.devices = devs.as_mut_ptr();
        }
        if !overrides.is_empty() {
            p.tensor_buft_overrides = overrides.as_ptr();
        }
        if !s.tensor_split.is_empty() {
            p.tensor_split = split.as_ptr();
        }
        if s.split_mode == search_space::SplitMode::Row {
            p.split_mode = sys::LLAMA_SPLIT_MODE_ROW;
        }
        take_log();
        // SAFETY: path and device list outlive the call; llama.cpp copies what it keeps.
        let ptr = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), p) };
        NonNull::new(ptr)
            .map(|ptr| Model { ptr })
            .ok_or_else(|| LlamaError::ModelLoad(log_tail(&take_log())))
    }

    pub fn n_vocab(&self) -> i32 {
        // SAFETY: model pointer is valid for self's lifetime.
        unsafe { sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(self.ptr.as_ptr())) }
    }

    pub fn bos(&self) -> i32 {
        // SAFETY: as above.
        unsafe { sys::llama_vocab_bos(sys::llama_model_get_vocab(self.ptr.as_ptr())) }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: we own the model; contexts borrow it and are dropped first.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

fn ggml_type(t: CacheType) -> sys::ggml_type {
    match t {
        CacheType::F32 => sys::GGML_TYPE_F32,
        CacheType::F16 => sys::GGML_TYPE_F16,
        CacheType::Bf16 => sys::GGML_TYPE_BF16,
        CacheType::Q8_0 => sys::GGML_TYPE_Q8_0,
        CacheType::Q5_1 => sys::GGML_TYPE_Q5_1,
        CacheType::Q5_0 => sys::GGML_TYPE_Q5_0,
        CacheType::Q4_1 => sys::GGML_TYPE_Q4_1,
        CacheType::Q4_0 => sys::GGML_TYPE_Q4_0,
        CacheType::Iq4Nl => sys::GGML_TYPE_IQ4_NL,
    }
}

/// A llama.cpp context; it holds its model alive (`Arc`), so a worker can keep both across requests.
pub struct Context {
    ptr: NonNull<sys::llama_context>,
    model: Arc<Model>,
    n_batch: u32,
}

// SAFETY: a context is used from one thread at a time (the worker's loop).
unsafe impl Send for Context {}

impl Context {
    pub fn new(model: &Arc<Model>, s: &ContextSettings) -> Result<Context, LlamaError> {
        Self::with_max_outputs(model, s, 0)
    }

    /// A context whose batches have at most `n_outputs_max` outputs (logits) each, 0 = n_batch. A
    /// speculative draft needs 1, as llama-server's draft context has, which keeps its compute buffer
    /// small.
    pub fn with_max_outputs(
        model: &Arc<Model>,
        s: &ContextSettings,
        n_outputs_max: u32,
    ) -> Result<Context, LlamaError> {
        // SAFETY: default params are plain data.
        let mut p = unsafe { sys::llama_context_default_params() };
        p.n_outputs_max = n_outputs_max;
        p.n_ctx = s.n_ctx;
        p.n_batch = s.n_batch;
        p.n_ubatch = s.n_ubatch;
        p.n_seq_max = 1;
        p.n_threads = s.threads as i32;
        p.n_threads_batch = s.threads as i32;
        p.type_k = ggml_type(s.type_k);
        p.type_v = ggml_type(s.type_v);
        p.flash_attn_type = match s.flash_attn {
            FlashAttn::Off => sys::LLAMA_FLASH_ATTN_TYPE_DISABLED,
            FlashAttn::On => sys::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            FlashAttn::Auto => sys::LLAMA_FLASH_ATTN_TYPE_AUTO,
        };
        p.no_perf = true;
        take_log();
        // SAFETY: model is valid and outlives the context (borrow).
        let ptr = unsafe { sys::llama_init_from_model(model.ptr.as_ptr(), p) };
        NonNull::new(ptr)
            .map(|ptr| Context {
                ptr,
                model: Arc::clone(model),
                n_batch: s.n_batch,
            })
            .ok_or_else(|| LlamaError::Context(log_tail(&take_log())))
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Empties the KV cache.
    pub fn clear(&mut self) {
        // SAFETY: context is valid; memory handle belongs to it.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) }
    }

    /// Decodes `tokens` in chunks of n_batch, continuing the sequence in the KV cache.
    pub fn decode(&mut self, tokens: &mut [i32]) -> Result<(), LlamaError> {
        for chunk in tokens.chunks_mut(self.n_batch.max(1) as usize) {
            // SAFETY: the batch views `chunk`, which outlives the call; positions are assigned by
            // llama.cpp from the memory's current end.
            let status = unsafe {
                sys::llama_decode(
                    self.ptr.as_ptr(),
                    sys::llama_batch_get_one(chunk.as_mut_ptr(), chunk.len() as i32),
                )
            };
            if status != 0 {
                return Err(LlamaError::Decode {
                    status,
                    log: log_tail(&take_log()),
                });
            }
        }
        Ok(())
    }

    /// Waits until the device has really finished: without it an asynchronous backend "finishes"
    /// a prompt at tens of thousands of tokens per second.
    pub fn synchronize(&mut self) {
        // SAFETY: context is valid.
        unsafe { sys::llama_synchronize(self.ptr.as_ptr()) }
    }

    /// Logits of the last output (n_vocab floats).
    pub fn last_logits(&self) -> &[f32] {
        // SAFETY: llama.cpp keeps n_vocab logits for output -1 until the next decode.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), -1);
            if p.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(p, self.model.n_vocab() as usize)
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: we own the context.
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}

/// Reads the buffer sizes llama.cpp logs while loading a model and creating a context.
pub fn parse_buffer_reports(log: &[String]) -> Vec<BufferReport> {
    let mut out = Vec::new();
    for line in log {
        let Some(idx) = line.find(" buffer size") else {
            continue;
        };
        let Some(eq) = line[idx..].find('=') else {
            continue;
        };
        let head = line[..idx].trim();
        let mut words = head.rsplitn(2, char::is_whitespace);
        let what = words.next().unwrap_or("").to_string();
        let buffer = words
            .next()
            .unwrap_or("")
            .rsplit(|c: char| c.is_whitespace())
            .next()
            .unwrap_or("")
            .to_string();
        let tail = line[idx + eq + 1..].trim();
        let mut parts = tail.split_whitespace();
        let (Some(num), Some(unit)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(v) = num.parse::<f64>() else { continue };
        let mult = match unit {
            "MiB" => 1024.0 * 1024.0,
            "KiB" => 1024.0,
            "GiB" => 1024.0 * 1024.0 * 1024.0,
            "B" => 1.0,
            _ => continue,
        };
        if buffer.is_empty() || what.is_empty() {
            continue;
        }
        out.push(BufferReport {
            buffer,
            what,
            bytes: (v * mult) as u64,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama_buffer_lines() {
        let log = vec![
            "load_tensors:   CPU_Mapped model buffer size =   241.00 MiB\n".to_string(),
            "llama_kv_cache:        CPU KV buffer size =    72.00 MiB\n".to_string(),
            "sched_reserve:        CPU compute buffer size =   258.50 MiB\n".to_string(),
            "load_tensors: RPC0[127.0.0.1:50052] model buffer size =    10.00 MiB\n".to_string(),
            "unrelated line\n".to_string(),
        ];
        let r = parse_buffer_reports(&log);
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].buffer, "CPU_Mapped");
        assert_eq!(r[0].what, "model");
        assert_eq!(r[0].bytes, 241 * 1024 * 1024);
        assert_eq!(r[1].what, "KV");
        assert_eq!(r[3].buffer, "RPC0[127.0.0.1:50052]");
    }
}

/// Which device a llama.cpp buffer lives on: device-named buffers (`CUDA0`, `RPC0[host:port]`) belong
/// to that device; host buffers (`CPU`, `CPU_Mapped`, `CPU_REPACK`, `CUDA_Host`, ...) to the CPU.
pub fn buffer_device(buffer: &str, devices: &[DeviceInfo]) -> String {
    if buffer.starts_with("CPU") || buffer.ends_with("_Host") {
        return "CPU".to_string();
    }
    devices
        .iter()
        .filter(|d| d.kind != "cpu")
        .filter(|d| buffer.starts_with(&d.name) || buffer.contains(&d.description))
        .max_by_key(|d| d.name.len())
        .map(|d| d.name.clone())
        .unwrap_or_else(|| buffer.split('[').next().unwrap_or(buffer).to_string())
}

/// Sums buffer reports per device.
pub fn bytes_per_device(
    buffers: &[BufferReport],
    devices: &[DeviceInfo],
) -> Vec<profiles::measurements::DeviceBytes> {
    let mut map: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for b in buffers {
        *map.entry(buffer_device(&b.buffer, devices)).or_default() += b.bytes;
    }
    map.into_iter()
        .map(|(device, bytes)| profiles::measurements::DeviceBytes { device, bytes })
        .collect()
}

/// Free memory per non-CPU device right now (device name → free bytes).
pub fn device_free() -> Vec<(String, u64)> {
    devices()
        .into_iter()
        .filter(|d| d.kind != "cpu")
        .map(|d| (d.name, d.memory_free))
        .collect()
}

/// The read bandwidth of a device's memory, measured by that device's own kernels: a matrix-vector
/// product (what generating a token does with every weight matrix) over an f32 matrix of about
/// `bytes` in the device's memory, timed around a synchronised compute, best of `passes` after a
/// warm-up. Returns (bytes per second, the matrix's bytes).
pub fn device_read_bandwidth(
    device: &str,
    bytes: u64,
    passes: u32,
) -> Result<(f64, u64), LlamaError> {
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
            let mut best = 0.0f64;
            let mut status = pass(); // warm-up
            for _ in 0..passes.max(1) {
                if status != sys::GGML_STATUS_SUCCESS {
                    break;
                }
                let t = std::time::Instant::now();
                status = pass();
                let secs = t.elapsed().as_secs_f64();
                if secs > 0.0 {
                    best = best.max(matrix_bytes as f64 / secs);
                }
            }
            sys::ggml_backend_buffer_free(buffer);
            if status == sys::GGML_STATUS_SUCCESS {
                Ok((best, matrix_bytes))
            } else {
                Err(failed(&format!("compute failed with status {status}")))
            }
        };
        sys::ggml_free(ctx);
        sys::ggml_backend_free(backend);
        result
    }
}

fn rpc_proc(name: &str) -> Option<*mut c_void> {
    // SAFETY: registry lookups by static names.
    unsafe {
        let reg = sys::ggml_backend_reg_by_name(c"RPC".as_ptr());
        if reg.is_null() {
            return None;
        }
        let cname = CString::new(name).ok()?;
        let p = sys::ggml_backend_reg_get_proc_address(reg, cname.as_ptr());
        (!p.is_null()).then_some(p)
    }
}

static RPC_SERVERS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Connects to every ggml RPC server of a run (`host:port` each); stops at the first that fails.
pub fn rpc_add_servers(endpoints: &[String]) -> Result<(), LlamaError> {
    endpoints.iter().try_for_each(|e| rpc_add_server(e))
}

/// Connects to a ggml RPC server (`host:port`), which then appears as a non-CPU device. Idempotent.
pub fn rpc_add_server(endpoint: &str) -> Result<(), LlamaError> {
    let mut added = RPC_SERVERS
        .lock()
        .map_err(|_| LlamaError::Rpc("lock poisoned".into()))?;
    if added.iter().any(|e| e == endpoint) {
        return Ok(());
    }
    let p = rpc_proc("ggml_backend_rpc_add_server")
        .ok_or_else(|| LlamaError::Rpc("this build has no RPC backend".into()))?;
    let c = CString::new(endpoint)
        .map_err(|_| LlamaError::Rpc(format!("bad endpoint '{endpoint}'")))?;
    // ggml aborts the process when it cannot reach the server: check first.
    use std::net::ToSocketAddrs;
    let addr = endpoint
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| LlamaError::Rpc(format!("'{endpoint}' is not a host:port address")))?;
    std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(3))
        .map_err(|e| LlamaError::Rpc(format!("cannot connect to the RPC server at {endpoint}: {e} (start one with `autotune rpc-serve`)")))?;
    // SAFETY: the proc address has this signature in ggml-rpc.h.
    let reg = unsafe {
        let f: unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t =
            std::mem::transmute(p);
        f(c.as_ptr())
    };
    if reg.is_null() {
        return Err(LlamaError::Rpc(format!(
            "cannot connect to the RPC server at {endpoint}"
        )));
    }
    // SAFETY: registers the returned backend registry with ggml.
    unsafe { sys::ggml_backend_register(reg) };
    added.push(endpoint.to_string());
    Ok(())
}

/// Serves this machine's CPU as a ggml RPC device on `endpoint`; blocks for ever.
pub fn rpc_start_server(endpoint: &str, threads: usize) -> Result<(), LlamaError> {
    let p = rpc_proc("ggml_backend_rpc_start_server")
        .ok_or_else(|| LlamaError::Rpc("this build has no RPC backend".into()))?;
    let c = CString::new(endpoint)
        .map_err(|_| LlamaError::Rpc(format!("bad endpoint '{endpoint}'")))?;
    // SAFETY: plain registry lookup.
    let mut cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if cpu.is_null() {
        return Err(LlamaError::Rpc("no CPU device to serve".into()));
    }
    // SAFETY: the proc address has this signature in ggml-rpc.h; the device pointer outlives the call.
    unsafe {
        let f: unsafe extern "C" fn(
            *const c_char,
            *const c_char,
            usize,
            usize,
            *mut sys::ggml_backend_dev_t,
        ) = std::mem::transmute(p);
        f(c.as_ptr(), std::ptr::null(), threads, 1, &mut cpu);
    }
    Ok(())
}

// llama.cpp's common library (linked as libllama-common) prints the memory breakdown — the same
// numbers its own fit routine (`--fit`) plans with — through its own logger. These are plain C++
// functions with C-compatible signatures; their mangled names are stable for this vendored build.
#[link(name = "llama-common")]
extern "C" {
    #[link_name = "_Z15common_log_mainv"]
    fn common_log_main() -> *mut c_void;
    #[link_name = "_Z19common_log_set_fileP10common_logPKc"]
    fn common_log_set_file(log: *mut c_void, path: *const c_char);
    #[link_name = "_Z30common_log_set_verbosity_tholdi"]
    fn common_log_set_verbosity_thold(v: i32);
}

/// One row of llama.cpp's memory breakdown, in bytes (MiB granularity).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BreakdownRow {
    /// A device name (`RPC0`, `CUDA0`), `Host`, or a buffer type name.
    pub name: String,
    pub model: u64,
    pub context: u64,
    pub compute: u64,
}

impl BreakdownRow {
    pub fn total(&self) -> u64 {
        self.model + self.context + self.compute
    }
}

/// llama.cpp's own accounting of a context's memory per device (weights, KV/context, compute),
/// valid for dry-run (`no_alloc`) loads too: what its fit routine plans with.
pub fn memory_breakdown(ctx: &Context) -> Vec<BreakdownRow> {
    let path = std::env::temp_dir().join(format!("autotune-breakdown-{}.log", std::process::id()));
    let Some(cpath) = path.to_str().and_then(|p| CString::new(p).ok()) else {
        return Vec::new();
    };
    // SAFETY: the logger is a process-wide singleton; set_file pauses (drains) and resumes its thread.
    unsafe {
        let log = common_log_main();
        common_log_set_verbosity_thold(4); // LOG_LEVEL_TRACE: the breakdown table is a trace message
        common_log_set_file(log, cpath.as_ptr());
        sys::llama_rs_memory_breakdown_print(ctx.ptr.as_ptr());
        common_log_set_file(log, std::ptr::null()); // drains the queue and closes the file
        common_log_set_verbosity_thold(0);
    }
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    parse_breakdown(&text)
}

/// Parses the rows of `common_memory_breakdown_print`:
/// `  - RPC0 (desc) | total = free + (self = model + context + compute) + unaccounted |` and
/// `  - Host | self = model + context + compute |`.
pub fn parse_breakdown(text: &str) -> Vec<BreakdownRow> {
    const MIB: u64 = 1024 * 1024;
    let mut rows = Vec::new();
    for line in text.lines() {
        let Some(dash) = line.find("|   - ").or_else(|| line.find("| - ")) else {
            continue;
        };
        let rest = &line[dash + 1..];
        let mut cells = rest.split('|');
        let (Some(label), Some(values)) = (cells.next(), cells.next()) else {
            continue;
        };
        let name = label.trim().trim_start_matches('-').trim();
        let name = name.split(" (").next().unwrap_or(name).trim().to_string();
        let nums: Vec<u64> = values
            .split(|c: char| !c.is_ascii_digit() && c != '-')
            .filter_map(|t| t.parse::<i64>().ok())
            .map(|v| v.max(0) as u64)
            .collect();
        // device rows: total free self model context compute unaccounted; others: self model context compute
        let (model, context, compute) = match nums.len() {
            7 => (nums[3], nums[4], nums[5]),
            4 => (nums[1], nums[2], nums[3]),
            _ => continue,
        };
        rows.push(BreakdownRow {
            name,
            model: model * MIB,
            context: context * MIB,
            compute: compute * MIB,
        });
    }
    rows
}

/// Bytes per device from a breakdown: host rows (`Host`, CPU buffer types) count for the CPU.
pub fn breakdown_per_device(rows: &[BreakdownRow]) -> Vec<profiles::measurements::DeviceBytes> {
    let mut map: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for r in rows {
        let dev = if r.name == "Host" || r.name.starts_with("CPU") {
            "CPU".to_string()
        } else {
            r.name.clone()
        };
        *map.entry(dev).or_default() += r.total();
    }
    map.into_iter()
        .map(|(device, bytes)| profiles::measurements::DeviceBytes { device, bytes })
        .collect()
}

#[cfg(test)]
mod breakdown_tests {
    use super::*;

    #[test]
    fn parses_the_breakdown_table() {
        let text = "common_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |\n\
common_memory_breakdown_print: |   - RPC0 (127.0.0.1:50052) | 24105 = 23000 + (805 = 241 +  36 + 528) + 300 |\n\
common_memory_breakdown_print: |   - Host                   |                   3 =   0 +   0 +   3                |\n";
        let rows = parse_breakdown(text);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].name, "RPC0");
        assert_eq!(rows[0].model, 241 * 1024 * 1024);
        assert_eq!(rows[0].compute, 528 * 1024 * 1024);
        assert_eq!(rows[1].name, "Host");
        assert_eq!(breakdown_per_device(&rows)[0].device, "CPU");
    }
}

// ---- Quantization ladders and quality (used by `quant::serve` in the worker) ----

impl Model {
    /// The text's tokens in this model's vocabulary, without BOS/EOS (the caller adds them).
    pub fn tokenize(&self, text: &str) -> Result<Vec<i32>, String> {
        let len = i32::try_from(text.len()).map_err(|_| "text too long to tokenize".to_string())?;
        // SAFETY: the vocab belongs to the model; llama_tokenize reads `len` bytes of `text` and writes at
        // most `cap` tokens; a negative result is the size it needs.
        unsafe {
            let vocab = sys::llama_model_get_vocab(self.ptr.as_ptr());
            let mut cap = text.len() + 16;
            loop {
                let mut out = vec![0i32; cap];
                let n = sys::llama_tokenize(
                    vocab,
                    text.as_ptr().cast(),
                    len,
                    out.as_mut_ptr(),
                    cap as i32,
                    false,
                    false,
                );
                if n >= 0 {
                    out.truncate(n as usize);
                    return Ok(out);
                }
                if (-n) as usize <= cap {
                    return Err(format!("llama_tokenize failed ({n})"));
                }
                cap = (-n) as usize;
            }
        }
    }
}

impl Context {
    /// Decodes `tokens` from position 0 of an empty cache as one batch with an output (logits) for
    /// every token; read them with [`Context::logits_ith`]. `tokens.len()` must not exceed n_batch.
    pub fn decode_with_all_logits(&mut self, tokens: &[i32]) -> Result<(), LlamaError> {
        self.clear();
        let n = tokens.len() as i32;
        // SAFETY: the batch is allocated for n tokens with one sequence id each, every field we set
        // is within those sizes, and it is freed after the decode.
        unsafe {
            let batch = sys::llama_batch_init(n, 0, 1);
            for (i, &t) in tokens.iter().enumerate() {
                *batch.token.add(i) = t;
                *batch.pos.add(i) = i as i32;
                *batch.n_seq_id.add(i) = 1;
                *(*batch.seq_id.add(i)) = 0;
                *batch.logits.add(i) = 1;
            }
            let mut b = batch;
            b.n_tokens = n;
            let status = sys::llama_decode(self.ptr.as_ptr(), b);
            sys::llama_batch_free(batch);
            if status != 0 {
                return Err(LlamaError::Decode {
                    status,
                    log: log_tail(&take_log()),
                });
            }
        }
        Ok(())
    }

    /// Logits (n_vocab floats) of output `i` of the last decode.
    pub fn logits_ith(&self, i: i32) -> &[f32] {
        // SAFETY: llama.cpp keeps the outputs of the last decode until the next one; NULL for a bad id.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), i);
            if p.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(p, self.model.n_vocab() as usize)
            }
        }
    }
}

/// Writes `dst` as `src` quantized to the llama file type `ftype` (llama.cpp's quantizer, as
/// `llama-quantize` runs it). `allow_requantize` lets it start from already quantized tensors.
/// The error is llama.cpp's last error lines.
pub fn quantize_model(
    src: &Path,
    dst: &Path,
    ftype: u32,
    allow_requantize: bool,
    threads: u32,
) -> Result<(), String> {
    let c = |p: &Path| {
        p.to_str()
            .and_then(|s| CString::new(s).ok())
            .ok_or_else(|| format!("path is not valid UTF-8 or contains NUL: {}", p.display()))
    };
    let (csrc, cdst) = (c(src)?, c(dst)?);
    // SAFETY: default params are plain data; the paths outlive the call.
    let status = unsafe {
        let mut p = sys::llama_model_quantize_default_params();
        p.nthread = threads as i32;
        p.ftype = ftype as sys::llama_ftype;
        p.allow_requantize = allow_requantize;
        sys::llama_model_quantize(csrc.as_ptr(), cdst.as_ptr(), &p)
    };
    if status != 0 {
        return Err(format!(
            "llama_model_quantize failed: {}",
            log_tail(&take_log())
        ));
    }
    Ok(())
}

impl Model {
    /// Whether the vocabulary wants a BOS token at the start of a text.
    pub fn add_bos(&self) -> bool {
        // SAFETY: model pointer is valid for self's lifetime.
        unsafe { sys::llama_vocab_get_add_bos(sys::llama_model_get_vocab(self.ptr.as_ptr())) }
    }
}

// ---- Speculative decoding (used by `speculative::serve` in the worker) ----

impl Model {
    /// Loads only the vocabulary of a GGUF file (no weights, nothing allocated for them): enough to
    /// compare two models' vocabularies the way llama.cpp's speculative decoding does.
    pub fn load_vocab_only(path: &Path) -> Result<Model, LlamaError> {
        let cpath = path
            .to_str()
            .and_then(|p| CString::new(p).ok())
            .ok_or_else(|| LlamaError::BadPath(path.display().to_string()))?;
        // SAFETY: default params are plain data.
        let mut p = unsafe { sys::llama_model_default_params() };
        p.vocab_only = true;
        p.n_gpu_layers = 0;
        take_log();
        // SAFETY: the path outlives the call.
        let ptr = unsafe { sys::llama_model_load_from_file(cpath.as_ptr(), p) };
        NonNull::new(ptr)
            .map(|ptr| Model { ptr })
            .ok_or_else(|| LlamaError::ModelLoad(log_tail(&take_log())))
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: model pointer is valid for self's lifetime; the vocab lives as long as the model.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    /// llama.cpp's vocabulary type number (`LLAMA_VOCAB_TYPE_*`: 1 SPM, 2 BPE, 3 WPM, 4 UGM, ...).
    pub fn vocab_type(&self) -> u32 {
        // SAFETY: valid vocab.
        unsafe { sys::llama_vocab_type(self.vocab()) as u32 }
    }

    pub fn eos(&self) -> i32 {
        // SAFETY: valid vocab.
        unsafe { sys::llama_vocab_eos(self.vocab()) }
    }

    /// Whether the vocabulary wants an EOS token at the end of a text.
    pub fn add_eos(&self) -> bool {
        // SAFETY: valid vocab.
        unsafe { sys::llama_vocab_get_add_eos(self.vocab()) }
    }

    /// The stored text of token `id` (as bytes; empty for an id out of range).
    pub fn token_text(&self, id: i32) -> &[u8] {
        if id < 0 || id >= self.n_vocab() {
            return &[];
        }
        // SAFETY: the id is in range; the text lives as long as the model.
        unsafe {
            let p = sys::llama_vocab_get_text(self.vocab(), id);
            if p.is_null() {
                &[]
            } else {
                CStr::from_ptr(p).to_bytes()
            }
        }
    }

    /// Whether `id` ends a generation (EOS, EOT, ...).
    pub fn is_eog(&self, id: i32) -> bool {
        // SAFETY: valid vocab; llama.cpp checks the id against its set of end tokens.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), id) }
    }
}

impl Context {
    /// Decodes `tokens` as sequence 0 at positions `pos0..`, continuing what is in the KV cache, in
    /// chunks of n_batch. With `all_logits` every token gets an output (read them with
    /// [`Context::logits_ith`], indexed from 0 within the batch; `tokens` must then fit one batch),
    /// else only the last token does ([`Context::last_logits`]).
    pub fn decode_at(
        &mut self,
        tokens: &[i32],
        pos0: i32,
        all_logits: bool,
    ) -> Result<(), LlamaError> {
        let n_batch = self.n_batch.max(1) as usize;
        if all_logits && tokens.len() > n_batch {
            return Err(LlamaError::Decode {
                status: -1,
                log: format!(
                    "{} tokens with logits exceed n_batch {n_batch}",
                    tokens.len()
                ),
            });
        }
        let chunks = tokens.len().div_ceil(n_batch);
        for (c, chunk) in tokens.chunks(n_batch).enumerate() {
            let last_chunk = c + 1 == chunks;
            let n = chunk.len() as i32;
            let start = pos0 + (c * n_batch) as i32;
            // SAFETY: the batch is allocated for n tokens with one sequence id each; every field set
            // is within those sizes, and it is freed after the decode.
            unsafe {
                let batch = sys::llama_batch_init(n, 0, 1);
                for (i, &t) in chunk.iter().enumerate() {
                    *batch.token.add(i) = t;
                    *batch.pos.add(i) = start + i as i32;
                    *batch.n_seq_id.add(i) = 1;
                    *(*batch.seq_id.add(i)) = 0;
                    *batch.logits.add(i) =
                        i8::from(all_logits || (last_chunk && i + 1 == chunk.len()));
                }
                let mut b = batch;
                b.n_tokens = n;
                let status = sys::llama_decode(self.ptr.as_ptr(), b);
                sys::llama_batch_free(batch);
                if status != 0 {
                    return Err(LlamaError::Decode {
                        status,
                        log: log_tail(&take_log()),
                    });
                }
            }
        }
        Ok(())
    }

    /// Removes positions `from..` of sequence 0 from the KV cache (rolling back rejected draft
    /// tokens). False when llama.cpp cannot remove part of the sequence.
    pub fn truncate(&mut self, from: i32) -> bool {
        // SAFETY: context is valid; the memory handle belongs to it.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), 0, from, -1) }
    }
}
