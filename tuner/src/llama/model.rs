//! A loaded llama.cpp model (weights or only its vocabulary): loading with placement settings,
//! vocabulary queries and tokenizing, and llama.cpp's quantizer.

use super::{
    buffer_type_by_name, dense_ffn_pattern, expert_pattern, log_tail, take_log, LlamaError,
    ModelSettings,
};
use llama_cpp_sys_2 as sys;
use std::ffi::{CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

pub struct Model {
    pub(super) ptr: NonNull<sys::llama_model>,
}

// SAFETY: a llama_model is immutable after loading and may be shared between threads.
unsafe impl Send for Model {}
// SAFETY: as above: nothing mutates a loaded model; contexts on it only read it.
unsafe impl Sync for Model {}

impl Model {
    pub fn load(path: &Path, s: &ModelSettings) -> Result<Model, LlamaError> {
        Self::load_with(path, s, false)
    }

    /// Loads the model; with `load_mtp` its multi-token-prediction (NextN) layers too, which
    /// llama.cpp skips by default and an MTP draft context needs.
    pub fn load_with(path: &Path, s: &ModelSettings, load_mtp: bool) -> Result<Model, LlamaError> {
        let cpath = c_path(path)?;
        super::numa_init(s.numa)?;
        let mut devs = device_list(&s.devices)?;
        // The CStrings the overrides point into live in `overrides` until the load returns.
        let overrides = BuftOverrides::new(s)?;
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
        p.load_mtp = load_mtp;
        p.no_host = s.host_buffer == search_space::HostBuffer::Cpu;
        if s.no_alloc || s.host_buffer == search_space::HostBuffer::Pinned {
            // As llama.cpp's own fit routine does: no mmap in a dry run, so host buffers are counted.
            // A real load without mmap puts host weights in a device's pinned host buffer.
            p.load_mode = sys::LLAMA_LOAD_MODE_NONE;
        }
        if !s.devices.is_empty() {
            p.devices = devs.as_mut_ptr();
        }
        if !overrides.list.is_empty() {
            p.tensor_buft_overrides = overrides.list.as_ptr();
        }
        if !s.tensor_split.is_empty() {
            p.tensor_split = split.as_ptr();
        }
        p.split_mode = match s.split_mode {
            search_space::SplitMode::Layer => sys::LLAMA_SPLIT_MODE_LAYER,
            search_space::SplitMode::Row => sys::LLAMA_SPLIT_MODE_ROW,
            search_space::SplitMode::Tensor => sys::LLAMA_SPLIT_MODE_TENSOR,
        };
        take_log();
        // SAFETY: path, device list and overrides outlive the call; llama.cpp copies what it keeps.
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

    /// Whether removing the end of a sequence from the KV cache leaves exactly what was there before
    /// those positions were added: not for a sliding window (positions that left the window are gone)
    /// or a recurrent state (which llama.cpp cannot cut).
    pub fn cache_rewinds_exactly(&self) -> bool {
        let m = self.ptr.as_ptr();
        // SAFETY: model pointer is valid for self's lifetime; these only read its hyperparameters.
        unsafe {
            sys::llama_model_n_swa(m) == 0
                && !sys::llama_model_is_recurrent(m)
                && !sys::llama_model_is_hybrid(m)
        }
    }

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

    /// Whether the vocabulary wants a BOS token at the start of a text.
    pub fn add_bos(&self) -> bool {
        // SAFETY: model pointer is valid for self's lifetime.
        unsafe { sys::llama_vocab_get_add_bos(sys::llama_model_get_vocab(self.ptr.as_ptr())) }
    }

    /// Loads only the vocabulary of a GGUF file (no weights, nothing allocated for them): enough to
    /// compare two models' vocabularies the way llama.cpp's speculative decoding does.
    pub fn load_vocab_only(path: &Path) -> Result<Model, LlamaError> {
        let cpath = c_path(path)?;
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

fn c_path(path: &Path) -> Result<CString, LlamaError> {
    path.to_str()
        .and_then(|p| CString::new(p).ok())
        .ok_or_else(|| LlamaError::BadPath(path.display().to_string()))
}

/// The device list of a model on the CPU alone (llama.cpp's `--device none`).
pub const NO_DEVICE: &str = "none";

/// Devices by name, NULL-terminated, as `llama_model_params.devices` wants them; [`NO_DEVICE`]
/// alone is the empty list: the CPU alone, as llama.cpp's `--device none` (no device's host
/// buffer, no operation offloaded).
fn device_list(names: &[String]) -> Result<Vec<sys::ggml_backend_dev_t>, LlamaError> {
    let mut devs: Vec<sys::ggml_backend_dev_t> = Vec::new();
    for name in names.iter().filter(|n| *n != NO_DEVICE) {
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
    Ok(devs)
}

/// Tensor buffer-type overrides (the manual ones, then the expert tensors of the first n_cpu_moe
/// layers and the dense FFN tensors of the first n_cpu_ffn → the CPU's buffer type), NULL-terminated when not empty; `list` points into `_patterns`.
struct BuftOverrides {
    _patterns: Vec<CString>,
    list: Vec<sys::llama_model_tensor_buft_override>,
}

impl BuftOverrides {
    fn new(s: &ModelSettings) -> Result<BuftOverrides, LlamaError> {
        let mut targets: Vec<(CString, sys::ggml_backend_buffer_type_t)> = s
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
        if s.n_cpu_moe > 0 || s.n_cpu_ffn > 0 {
            // SAFETY: registry lookups.
            let cpu_buft = unsafe {
                sys::ggml_backend_dev_buffer_type(sys::ggml_backend_dev_by_type(
                    sys::GGML_BACKEND_DEVICE_TYPE_CPU,
                ))
            };
            let patterns = (0..s.n_cpu_moe)
                .map(expert_pattern)
                .chain((0..s.n_cpu_ffn).map(dense_ffn_pattern));
            for pattern in patterns {
                let p = CString::new(pattern).expect("no NUL in pattern");
                targets.push((p, cpu_buft));
            }
        }
        let mut list: Vec<sys::llama_model_tensor_buft_override> = targets
            .iter()
            .map(|(p, b)| sys::llama_model_tensor_buft_override {
                pattern: p.as_ptr(),
                buft: *b,
            })
            .collect();
        if !list.is_empty() {
            list.push(sys::llama_model_tensor_buft_override {
                pattern: std::ptr::null(),
                buft: std::ptr::null_mut(),
            });
        }
        let patterns = targets.into_iter().map(|(p, _)| p).collect();
        Ok(BuftOverrides {
            _patterns: patterns,
            list,
        })
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: we own the model; contexts borrow it and are dropped first.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
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
