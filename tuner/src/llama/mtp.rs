//! llama.cpp's multi-token-prediction drafter (`draft-mtp`, common/speculative.cpp, through the
//! `llama_rs_mtp_speculative_*` wrappers of `llama-cpp-sys-2`): a target context that also emits its
//! last hidden state, and an MTP context of the same model that runs only the NextN layer on it.
//!
//! The drafter owns both contexts: llama.cpp switches the target context to emit hidden states for
//! every token, so a baseline must never use it.

use super::{log_tail, take_log, Context, ContextSettings, LlamaError, Model};
use llama_cpp_sys_2 as sys;
use std::ptr::NonNull;
use std::sync::Arc;

pub struct MtpDrafter {
    spec: NonNull<sys::llama_rs_mtp_speculative>,
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

impl MtpDrafter {
    /// A target context with settings `s`, its MTP context (as llama-server makes it: same size, type
    /// MTP, bound to the target's), and the drafter proposing up to `n_max` tokens greedily (n_min 0,
    /// p_min 0: llama-server's defaults). The model must have been loaded with its MTP layers.
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
            sys::llama_rs_mtp_speculative_init(tptr, draft.ptr.as_ptr(), n_max as i32, 0, 0.0)
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

    /// A new generation after `prompt` (which the target and [`MtpDrafter::process`] have seen).
    pub fn begin(&mut self, prompt: &[i32]) -> Result<(), LlamaError> {
        // SAFETY: spec is valid; the wrapper copies the tokens.
        let st = unsafe {
            sys::llama_rs_mtp_speculative_begin(self.spec.as_ptr(), prompt.as_ptr(), prompt.len())
        };
        ok(st, "begin")
    }

    /// The MTP context catches up on the batch the target just decoded (`tokens` at `pos0..`),
    /// pairing each token with the target's hidden state before it.
    pub fn process(
        &mut self,
        tokens: &[i32],
        pos0: i32,
        all_logits: bool,
    ) -> Result<(), LlamaError> {
        let n = tokens.len() as i32;
        // SAFETY: the batch is allocated for n tokens with one sequence id each and freed after the
        // call; the wrapper copies what it keeps.
        let st = unsafe {
            let batch = sys::llama_batch_init(n, 0, 1);
            for (i, &t) in tokens.iter().enumerate() {
                *batch.token.add(i) = t;
                *batch.pos.add(i) = pos0 + i as i32;
                *batch.n_seq_id.add(i) = 1;
                *(*batch.seq_id.add(i)) = 0;
                *batch.logits.add(i) = i8::from(all_logits || i + 1 == tokens.len());
            }
            let mut b = batch;
            b.n_tokens = n;
            let st = sys::llama_rs_mtp_speculative_process(self.spec.as_ptr(), &b);
            sys::llama_batch_free(batch);
            st
        };
        ok(st, "process a batch")
    }

    /// Up to n_max drafted tokens after `last` at position `n_past`, `history` being the tokens the
    /// caches hold. A non-empty draft must be answered with [`MtpDrafter::accept`].
    pub fn draft(
        &mut self,
        n_past: i32,
        last: i32,
        history: &[i32],
    ) -> Result<Vec<i32>, LlamaError> {
        let mut out = vec![0i32; self.n_max.max(1)];
        let mut len = 0usize;
        // SAFETY: `out` holds n_max tokens, the capacity passed; the wrapper writes `len` of them.
        let st = unsafe {
            sys::llama_rs_mtp_speculative_draft(
                self.spec.as_ptr(),
                n_past,
                last,
                history.as_ptr(),
                history.len(),
                out.as_mut_ptr(),
                out.len(),
                &mut len,
            )
        };
        ok(st, "draft")?;
        out.truncate(len);
        Ok(out)
    }

    /// How many of the last draft's tokens the target accepted.
    pub fn accept(&mut self, n_accepted: u16) -> Result<(), LlamaError> {
        // SAFETY: spec is valid.
        let st = unsafe { sys::llama_rs_mtp_speculative_accept(self.spec.as_ptr(), n_accepted) };
        ok(st, "accept")
    }

    /// Removes positions `from..` from the MTP context's cache (drafting leaves its steps there).
    pub fn truncate_draft(&mut self, from: i32) -> bool {
        self.draft.truncate(from)
    }
}

fn ok(status: sys::llama_rs_status, what: &str) -> Result<(), LlamaError> {
    if status == sys::LLAMA_RS_STATUS_OK {
        Ok(())
    } else {
        Err(mtp_error(what, status))
    }
}

impl Drop for MtpDrafter {
    fn drop(&mut self) {
        // SAFETY: we own the drafter; its contexts are still alive here.
        unsafe { sys::llama_rs_mtp_speculative_free(self.spec.as_ptr()) }
    }
}
