//! A llama.cpp context over a loaded model: creation with context settings, decoding (timed or with
//! logits), and KV-cache edits.

use super::{log_tail, take_log, ContextSettings, LlamaError, Model};
use llama_cpp_sys_2 as sys;
use search_space::{CacheType, FlashAttn};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub(super) fn ggml_type(t: CacheType) -> sys::ggml_type {
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

/// One token of a multi-sequence batch ([`Context::decode_sequences`]).
#[derive(Debug, Clone, Copy)]
pub struct SeqToken {
    pub token: i32,
    pub pos: i32,
    pub seq: i32,
    /// Whether this token gets an output (logits).
    pub logits: bool,
}

/// A llama.cpp context; it holds its model alive (`Arc`), so a worker can keep both across requests.
pub struct Context {
    pub(super) ptr: NonNull<sys::llama_context>,
    model: Arc<Model>,
    n_batch: u32,
    /// Read by llama.cpp's abort callback while a deadline is set (boxed: its address is the
    /// callback's data, and must not move with the context).
    deadline: Box<Deadline>,
}

/// A point in time the abort callback compares with the clock: nanoseconds from `epoch`, or
/// `u64::MAX` for none (the callback may be called from the CPU backend's threads at once).
struct Deadline {
    epoch: Instant,
    at_ns: AtomicU64,
}

impl Deadline {
    fn passed(&self) -> bool {
        let at = self.at_ns.load(Ordering::Relaxed);
        at != u64::MAX && self.epoch.elapsed().as_nanos() >= u128::from(at)
    }
}

/// llama.cpp's abort callback: true once the context's deadline has passed. The CPU backend asks
/// between the graph's operations; llama_decode then returns 2 (aborted).
unsafe extern "C" fn abort_at_deadline(data: *mut std::ffi::c_void) -> bool {
    // SAFETY: `data` is the context's boxed `Deadline`, registered only while the context lives.
    unsafe { &*(data as *const Deadline) }.passed()
}

/// The outputs (logits) per batch llama-server reserves for a target without speculation: one per
/// slot, `-np` or its default 4 slots.
pub fn server_outputs(sequences: u32) -> u32 {
    if sequences > 1 {
        sequences
    } else {
        4
    }
}

// SAFETY: a context is used from one thread at a time (the worker's loop).
unsafe impl Send for Context {}

impl Context {
    pub fn new(model: &Arc<Model>, s: &ContextSettings) -> Result<Context, LlamaError> {
        Self::with_max_outputs(model, s, 0)
    }

    /// A context as llama-server makes its target's without speculation: at most one output (logits)
    /// per sequence in a batch, for every slot (`server_output_limits`: `-np`, else its default 4).
    /// Its compute and output buffers are then the server's: with llama.h's default (an output for
    /// every token of a batch) a micro-batch's logits alone reserve `n_ubatch × n_vocab` floats,
    /// 512 MiB for a 262k vocabulary at `-ub 512`, which the server never allocates. Measurements
    /// ask for one output per sequence in a batch, as the server does.
    pub fn like_server(model: &Arc<Model>, s: &ContextSettings) -> Result<Context, LlamaError> {
        Self::with_params(model, s, server_outputs(s.sequences), |p| {
            p.n_outputs_max_per_seq = 1;
        })
    }

    /// A context whose batches have at most `n_outputs_max` outputs (logits) each, 0 = n_batch. A
    /// speculative draft needs 1, as llama-server's draft context has, which keeps its compute buffer
    /// small.
    pub fn with_max_outputs(
        model: &Arc<Model>,
        s: &ContextSettings,
        n_outputs_max: u32,
    ) -> Result<Context, LlamaError> {
        Self::with_params(model, s, n_outputs_max, |_| {})
    }

    /// A context with `edit` applied to its llama.cpp parameters last (an MTP draft context's type).
    pub(super) fn with_params(
        model: &Arc<Model>,
        s: &ContextSettings,
        n_outputs_max: u32,
        edit: impl FnOnce(&mut sys::llama_context_params),
    ) -> Result<Context, LlamaError> {
        // SAFETY: default params are plain data.
        let mut p = unsafe { sys::llama_context_default_params() };
        p.n_outputs_max = n_outputs_max;
        p.n_ctx = s.n_ctx;
        p.n_batch = s.n_batch;
        p.n_ubatch = s.n_ubatch;
        p.n_seq_max = s.sequences.max(1);
        p.kv_unified = false;
        // A sliding-window cache of the window's size, as llama-server (common's default) and
        // llama-bench make it: llama.h's own default keeps every position in those layers, which
        // takes more memory and slows attention at depth on models with sliding windows (Gemma 2
        // and 3, gpt-oss, ...), so neither the fit nor the speed would be the server's.
        p.swa_full = false;
        p.n_threads = s.threads as i32;
        p.n_threads_batch = s.threads_batch.unwrap_or(s.threads) as i32;
        p.type_k = ggml_type(s.type_k);
        p.type_v = ggml_type(s.type_v);
        p.flash_attn_type = match s.flash_attn {
            FlashAttn::Off => sys::LLAMA_FLASH_ATTN_TYPE_DISABLED,
            FlashAttn::On => sys::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            FlashAttn::Auto => sys::LLAMA_FLASH_ATTN_TYPE_AUTO,
        };
        p.op_offload = s.op_offload.is_on();
        p.offload_kqv = s.kv_offload.is_on();
        p.no_perf = true;
        edit(&mut p);
        super::settings::set_environment(search_space::Side::Context, &s.env);
        take_log();
        // SAFETY: model is valid and outlives the context (borrow).
        let ptr = unsafe { sys::llama_init_from_model(model.ptr.as_ptr(), p) };
        NonNull::new(ptr)
            .map(|ptr| Context {
                ptr,
                model: Arc::clone(model),
                n_batch: s.n_batch,
                deadline: Box::new(Deadline {
                    epoch: Instant::now(),
                    at_ns: AtomicU64::new(u64::MAX),
                }),
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

    /// Decoding stops with [`LlamaError::Aborted`] once `at` has passed: between batches, and
    /// inside one where the backend asks llama.cpp's abort callback (the CPU backend does, between
    /// operations; a GPU backend finishes the batch it has). `None` removes the deadline and the
    /// callback (a measurement without one runs exactly as llama-bench's).
    pub fn set_deadline(&mut self, at: Option<Instant>) {
        let ns = at.map_or(u64::MAX, |t| {
            let d = t.saturating_duration_since(self.deadline.epoch);
            u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
        });
        self.deadline.at_ns.store(ns, Ordering::Relaxed);
        let data = &*self.deadline as *const Deadline as *mut std::ffi::c_void;
        // SAFETY: the context is valid; the data outlives it (dropped after llama_free).
        unsafe {
            match at {
                Some(_) => {
                    sys::llama_set_abort_callback(self.ptr.as_ptr(), Some(abort_at_deadline), data)
                }
                None => {
                    sys::llama_set_abort_callback(self.ptr.as_ptr(), None, std::ptr::null_mut())
                }
            }
        }
    }

    /// The error of a decode that returned `status`: [`LlamaError::Aborted`] when the deadline
    /// stopped it.
    fn decode_error(&self, status: i32) -> LlamaError {
        if self.deadline.passed() {
            take_log();
            return LlamaError::Aborted;
        }
        LlamaError::Decode {
            status,
            log: log_tail(&take_log()),
        }
    }

    fn check_deadline(&self) -> Result<(), LlamaError> {
        if self.deadline.passed() {
            return Err(LlamaError::Aborted);
        }
        Ok(())
    }

    /// Decodes `tokens` in chunks of n_batch, continuing the sequence in the KV cache.
    pub fn decode(&mut self, tokens: &mut [i32]) -> Result<(), LlamaError> {
        for chunk in tokens.chunks_mut(self.n_batch.max(1) as usize) {
            self.check_deadline()?;
            // SAFETY: the batch views `chunk`, which outlives the call; positions are assigned by
            // llama.cpp from the memory's current end.
            let status = unsafe {
                sys::llama_decode(
                    self.ptr.as_ptr(),
                    sys::llama_batch_get_one(chunk.as_mut_ptr(), chunk.len() as i32),
                )
            };
            if status != 0 {
                return Err(self.decode_error(status));
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
        self.decode_seq_at(tokens, pos0, 0, all_logits)
    }

    /// [`Context::decode_at`] for sequence `seq` (one slot of several).
    pub fn decode_seq_at(
        &mut self,
        tokens: &[i32],
        pos0: i32,
        seq: i32,
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
        let last = tokens.len().saturating_sub(1);
        let batch: Vec<SeqToken> = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| SeqToken {
                token,
                pos: pos0 + i as i32,
                seq,
                logits: all_logits || i == last,
            })
            .collect();
        self.decode_sequences(&batch)
    }

    /// Decodes tokens of several sequences (llama-server's slots) in chunks of n_batch: each at its
    /// own position and sequence, with an output (logits) where `logits` says, as a server asks for
    /// one per sequence. Positions must continue what each sequence has in the KV cache.
    pub fn decode_sequences(&mut self, tokens: &[SeqToken]) -> Result<(), LlamaError> {
        let n_batch = self.n_batch.max(1) as usize;
        for chunk in tokens.chunks(n_batch) {
            self.check_deadline()?;
            let n = chunk.len() as i32;
            // SAFETY: the batch is allocated for n tokens with one sequence id each; every field set
            // is within those sizes, and it is freed after the decode.
            unsafe {
                let batch = sys::llama_batch_init(n, 0, 1);
                for (i, t) in chunk.iter().enumerate() {
                    *batch.token.add(i) = t.token;
                    *batch.pos.add(i) = t.pos;
                    *batch.n_seq_id.add(i) = 1;
                    *(*batch.seq_id.add(i)) = t.seq;
                    *batch.logits.add(i) = i8::from(t.logits);
                }
                let mut b = batch;
                b.n_tokens = n;
                let status = sys::llama_decode(self.ptr.as_ptr(), b);
                sys::llama_batch_free(batch);
                if status != 0 {
                    return Err(self.decode_error(status));
                }
            }
        }
        Ok(())
    }

    /// Removes positions `from..` of sequence 0 from the KV cache (rolling back rejected draft
    /// tokens). False when llama.cpp cannot remove part of the sequence.
    pub fn truncate(&mut self, from: i32) -> bool {
        self.truncate_seq(0, from)
    }

    /// [`Context::truncate`] for sequence `seq`.
    pub fn truncate_seq(&mut self, seq: i32, from: i32) -> bool {
        // SAFETY: context is valid; the memory handle belongs to it.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), seq, from, -1) }
    }

    /// llama.cpp's own copy of sequence `seq`'s state (its KV cache cells or recurrent state), for
    /// [`Context::restore_seq`].
    pub fn save_seq(&self, seq: i32) -> Vec<u8> {
        let ctx = self.ptr.as_ptr();
        // SAFETY: context is valid; the buffer is `size` bytes and llama.cpp writes at most that.
        unsafe {
            let size = sys::llama_state_seq_get_size(ctx, seq);
            let mut buf = vec![0u8; size];
            let n = sys::llama_state_seq_get_data(ctx, buf.as_mut_ptr(), size, seq);
            buf.truncate(n);
            buf
        }
    }

    /// Puts a state from [`Context::save_seq`] into sequence `seq`; false when llama.cpp refuses it.
    pub fn restore_seq(&mut self, state: &[u8], seq: i32) -> bool {
        // SAFETY: context is valid; llama.cpp reads at most `state.len()` bytes.
        unsafe {
            sys::llama_state_seq_set_data(self.ptr.as_ptr(), state.as_ptr(), state.len(), seq) != 0
        }
    }

    /// Decodes `tokens` (several sequences) as one batch, so that [`Context::logits_ith`] reads
    /// every output of it by its index in `tokens`: an error when they exceed n_batch.
    pub fn decode_one_batch(&mut self, tokens: &[SeqToken]) -> Result<(), LlamaError> {
        if tokens.len() > self.n_batch.max(1) as usize {
            return Err(LlamaError::Decode {
                status: -1,
                log: format!("{} tokens exceed n_batch {}", tokens.len(), self.n_batch),
            });
        }
        self.decode_sequences(tokens)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: we own the context.
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}
