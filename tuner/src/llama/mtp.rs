//! llama.cpp's multi-token-prediction drafter (`draft-mtp`, common/speculative.cpp) for one
//! sequence or several, through native/mtp_slots.cpp (compiled by build.rs against llama.cpp's own
//! sources): a target context that also emits its last hidden state, and an MTP context of the same
//! model that runs only the NextN layer on it.
//!
//! The drafter owns both contexts: llama.cpp switches the target context to emit hidden states for
//! every token, so a baseline must never use it.

use super::{log_tail, take_log, Context, ContextSettings, LlamaError, Model, SeqToken};
use llama_cpp_sys_2 as sys;
use std::ptr::NonNull;
use std::sync::Arc;

/// native/mtp_slots.cpp's drafter.
#[repr(C)]
struct Native {
    _private: [u8; 0],
}

extern "C" {
    fn autotune_mtp_init(
        tgt: *mut sys::llama_context,
        dft: *mut sys::llama_context,
        n_max: i32,
        n_seq: u32,
    ) -> *mut Native;
    fn autotune_mtp_free(m: *mut Native);
    fn autotune_mtp_begin(m: *mut Native, seq: i32, prompt: *const i32, n: usize) -> i32;
    fn autotune_mtp_process(
        m: *mut Native,
        n: i32,
        tokens: *const i32,
        pos: *const i32,
        seqs: *const i32,
    ) -> i32;
    fn autotune_mtp_want(
        m: *mut Native,
        seq: i32,
        n_max: i32,
        pos0: i32,
        last: i32,
        history: *const i32,
        n: usize,
    ) -> i32;
    fn autotune_mtp_draft(m: *mut Native) -> i32;
    fn autotune_mtp_result(
        m: *const Native,
        seq: i32,
        out: *mut i32,
        cap: usize,
        len: *mut usize,
    ) -> i32;
    fn autotune_mtp_accept(m: *mut Native, seq: i32, n_accepted: u16) -> i32;
}

pub struct MtpDrafter {
    spec: NonNull<Native>,
    // Dropped in this order after `spec`: the MTP context refers to the target's (ctx_other).
    draft: Context,
    target: Context,
    n_max: usize,
}

// SAFETY: used from one thread at a time (the worker's loop), like its contexts.
unsafe impl Send for MtpDrafter {}

fn mtp_error(what: &str, status: i32) -> LlamaError {
    LlamaError::Decode {
        status,
        log: format!(
            "llama.cpp's MTP drafter failed to {what}: {}",
            log_tail(&take_log())
        ),
    }
}

/// One sequence's part of a [`MtpDrafter::draft_many`] call.
pub struct MtpWant<'a> {
    pub seq: i32,
    /// At most this many tokens (and no more than the drafter's n_max).
    pub n_max: usize,
    /// Position of `last`.
    pub n_past: i32,
    pub last: i32,
    /// The tokens the caches hold for this sequence.
    pub history: &'a [i32],
}

impl MtpDrafter {
    /// A target context with settings `s`, its MTP context (as llama-server makes it: same size, type
    /// MTP, bound to the target's), and the drafter proposing up to `n_max` tokens greedily (n_min 0,
    /// p_min 0: llama-server's defaults) for each of the `s.sequences` sequences. The model must have
    /// been loaded with its MTP layers.
    pub fn new(
        model: &Arc<Model>,
        s: &ContextSettings,
        n_max: u32,
    ) -> Result<MtpDrafter, LlamaError> {
        let target = Context::with_max_outputs(model, s, 0)?;
        let tptr = target.ptr.as_ptr();
        let draft = Context::with_params(model, s, 0, |p| {
            p.ctx_type = sys::LLAMA_CONTEXT_TYPE_MTP;
            p.n_rs_seq = 0;
            p.ctx_other = tptr;
        })?;
        take_log();
        // SAFETY: both contexts are valid and outlive the drafter (freed after it in Drop).
        let spec = unsafe {
            autotune_mtp_init(tptr, draft.ptr.as_ptr(), n_max as i32, s.sequences.max(1))
        };
        let spec = NonNull::new(spec).ok_or_else(|| mtp_error("start", -1))?;
        Ok(MtpDrafter {
            spec,
            draft,
            target,
            n_max: n_max as usize,
        })
    }

    /// The target context: decode with it, then hand the same tokens to [`MtpDrafter::process`].
    pub fn target(&mut self) -> &mut Context {
        &mut self.target
    }

    /// Empties both KV caches.
    pub fn clear(&mut self) {
        self.target.clear();
        self.draft.clear();
    }

    /// A new generation of sequence `seq` after `prompt` (which the target and
    /// [`MtpDrafter::process_seq`] have seen).
    pub fn begin(&mut self, seq: i32, prompt: &[i32]) -> Result<(), LlamaError> {
        // SAFETY: spec is valid; the drafter copies the tokens.
        let st =
            unsafe { autotune_mtp_begin(self.spec.as_ptr(), seq, prompt.as_ptr(), prompt.len()) };
        ok(st, "begin")
    }

    /// The MTP context catches up on the batch of sequence 0 the target just decoded (`tokens` at
    /// `pos0..`), pairing each token with the target's hidden state before it.
    pub fn process(&mut self, tokens: &[i32], pos0: i32) -> Result<(), LlamaError> {
        let batch: Vec<SeqToken> = (tokens.iter().enumerate())
            .map(|(i, &token)| SeqToken {
                token,
                pos: pos0 + i as i32,
                seq: 0,
                logits: true,
            })
            .collect();
        self.process_seq(&batch)
    }

    /// [`MtpDrafter::process`] for a batch of several sequences, each one's tokens consecutive.
    pub fn process_seq(&mut self, batch: &[SeqToken]) -> Result<(), LlamaError> {
        let tokens: Vec<i32> = batch.iter().map(|t| t.token).collect();
        let pos: Vec<i32> = batch.iter().map(|t| t.pos).collect();
        let seqs: Vec<i32> = batch.iter().map(|t| t.seq).collect();
        // SAFETY: three arrays of batch.len() entries; the drafter copies them.
        let st = unsafe {
            autotune_mtp_process(
                self.spec.as_ptr(),
                batch.len() as i32,
                tokens.as_ptr(),
                pos.as_ptr(),
                seqs.as_ptr(),
            )
        };
        ok(st, "process a batch")
    }

    /// Up to n_max drafted tokens of sequence 0 after `last` at position `n_past`, `history` being
    /// the tokens the caches hold. A non-empty draft must be answered with [`MtpDrafter::accept`].
    pub fn draft(
        &mut self,
        n_past: i32,
        last: i32,
        history: &[i32],
    ) -> Result<Vec<i32>, LlamaError> {
        let want = MtpWant {
            seq: 0,
            n_max: self.n_max,
            n_past,
            last,
            history,
        };
        Ok(self.draft_many(&[want])?.remove(0))
    }

    /// Drafts for several sequences in shared batches, as llama-server drafts for its slots: one
    /// draft per entry of `wants`, in its order. Each non-empty draft must be answered with
    /// [`MtpDrafter::accept`].
    pub fn draft_many(&mut self, wants: &[MtpWant]) -> Result<Vec<Vec<i32>>, LlamaError> {
        for w in wants {
            let n_max = w.n_max.min(self.n_max).max(1) as i32;
            // SAFETY: spec is valid; the drafter copies the history.
            let st = unsafe {
                autotune_mtp_want(
                    self.spec.as_ptr(),
                    w.seq,
                    n_max,
                    w.n_past,
                    w.last,
                    w.history.as_ptr(),
                    w.history.len(),
                )
            };
            ok(st, "start a draft")?;
        }
        // SAFETY: spec is valid.
        ok(unsafe { autotune_mtp_draft(self.spec.as_ptr()) }, "draft")?;
        let mut out = Vec::with_capacity(wants.len());
        for w in wants {
            let mut tokens = vec![0i32; self.n_max.max(1)];
            let mut len = 0usize;
            // SAFETY: `tokens` holds n_max tokens, the capacity passed; the drafter writes `len`.
            let st = unsafe {
                autotune_mtp_result(
                    self.spec.as_ptr(),
                    w.seq,
                    tokens.as_mut_ptr(),
                    tokens.len(),
                    &mut len,
                )
            };
            ok(st, "read a draft")?;
            tokens.truncate(len);
            out.push(tokens);
        }
        Ok(out)
    }

    /// How many of sequence `seq`'s last draft the target accepted.
    pub fn accept(&mut self, seq: i32, n_accepted: u16) -> Result<(), LlamaError> {
        // SAFETY: spec is valid.
        let st = unsafe { autotune_mtp_accept(self.spec.as_ptr(), seq, n_accepted) };
        ok(st, "accept")
    }

    /// Removes positions `from..` of sequence `seq` from the MTP context's cache.
    pub fn truncate_draft_seq(&mut self, seq: i32, from: i32) -> bool {
        self.draft.truncate_seq(seq, from)
    }

    /// The target context and the MTP context, to roll both back.
    pub fn contexts(&mut self) -> (&mut Context, &mut Context) {
        (&mut self.target, &mut self.draft)
    }

    /// Removes positions `from..` from the MTP context's cache (drafting leaves its steps there).
    pub fn truncate_draft(&mut self, from: i32) -> bool {
        self.draft.truncate(from)
    }
}

fn ok(status: i32, what: &str) -> Result<(), LlamaError> {
    if status == 0 {
        Ok(())
    } else {
        Err(mtp_error(what, status))
    }
}

impl Drop for MtpDrafter {
    fn drop(&mut self) {
        // SAFETY: we own the drafter; its contexts are still alive here.
        unsafe { autotune_mtp_free(self.spec.as_ptr()) }
    }
}
