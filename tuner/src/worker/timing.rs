//! The timed parts of a repetition, as llama-bench times them: prompt processing on an empty cache
//! and generation of single tokens, and both again after `depth` tokens in the cache (llama-bench's
//! `-d`), each synchronised before the clock stops; with several
//! sequences (llama-server's slots), their prompts in shared batches and one token of each per
//! step, timed together (aggregate tokens per second).

use crate::llama::{self, Context, SeqToken};
use crate::measuring::Workload;
use search_space::Phases;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, llama::LlamaError>;

/// A repetition's stopping rule (`MeasureRequest::give_up`): each timed phase the score counts is
/// charged its seconds per request (its time over the sequences sharing it), and runs with the
/// deadline what is left of the limit sets, so a repetition stops as soon as its own time proves
/// a request slower than the limit. The warm-up and untimed fills are not charged.
pub struct Cutoff {
    /// Seconds per request; `None`: no deadline.
    limit: Option<f64>,
    np: f64,
    spent: f64,
}

impl Cutoff {
    pub fn new(limit: Option<f64>, np: u32) -> Self {
        Cutoff {
            limit,
            np: f64::from(np.max(1)),
            spent: 0.0,
        }
    }

    /// No deadline: phases the score does not count (without depth every phase counts; with one,
    /// only those at depth).
    pub fn off() -> Self {
        Self::new(None, 1)
    }

    /// Runs one timed phase: armed with the deadline what is left of the limit allows, clocked
    /// until the device has finished (synchronised), charged its seconds per request. Seconds.
    fn timed(
        &mut self,
        ctx: &mut Context,
        phase: impl FnOnce(&mut Context) -> Result<()>,
    ) -> Result<f64> {
        if let Some(limit) = self.limit {
            let left = ((limit - self.spent) * self.np).max(0.0);
            ctx.set_deadline(Some(Instant::now() + Duration::from_secs_f64(left)));
        }
        let t = Instant::now();
        phase(ctx)?;
        ctx.synchronize();
        let elapsed = t.elapsed().as_secs_f64();
        if self.limit.is_some() {
            ctx.set_deadline(None);
            self.spent += elapsed / self.np;
        }
        Ok(elapsed)
    }
}

/// Generation steps of the discarded warm-up, after its prompt.
pub(crate) const WARM_UP_STEPS: u32 = 4;

/// The discarded warm-up: first touches of weights and buffers, the thread pool's start. An
/// `n`-token prompt per sequence, then [`WARM_UP_STEPS`] generation steps.
pub fn warm_up(ctx: &mut Context, tokens: &mut TokenSource, n: u32, np: u32) -> Result<()> {
    ctx.clear();
    if np <= 1 {
        ctx.decode(&mut tokens.prompt(n))?;
        for _ in 0..WARM_UP_STEPS {
            ctx.decode(&mut [tokens.next()])?;
        }
    } else {
        ctx.decode_sequences(&prompts(tokens, n, np))?;
        for step in 0..WARM_UP_STEPS {
            ctx.decode_sequences(&step_tokens(tokens, n + step, np))?;
        }
    }
    ctx.synchronize();
    Ok(())
}

/// Prompt processing: an empty cache, `n` tokens (of each of `np` sequences) in batches of
/// n_batch, synchronised before the clock stops.
pub fn prompt(
    ctx: &mut Context,
    tokens: &mut TokenSource,
    n: u32,
    np: u32,
    cut: &mut Cutoff,
) -> Result<f64> {
    ctx.clear();
    if np <= 1 {
        let mut prompt = tokens.prompt(n);
        let seconds = cut.timed(ctx, |ctx| ctx.decode(&mut prompt))?;
        return Ok(n as f64 / seconds);
    }
    let batch = prompts(tokens, n, np);
    timed_batch(ctx, &batch, cut)
}

/// One batch of several sequences' tokens, timed: tokens per second.
fn timed_batch(ctx: &mut Context, batch: &[SeqToken], cut: &mut Cutoff) -> Result<f64> {
    let seconds = cut.timed(ctx, |ctx| ctx.decode_sequences(batch))?;
    Ok(batch.len() as f64 / seconds)
}

/// Generation on an empty cache: `n` steps of one token per sequence.
pub fn generation(
    ctx: &mut Context,
    tokens: &mut TokenSource,
    n: u32,
    np: u32,
    cut: &mut Cutoff,
) -> Result<f64> {
    ctx.clear();
    steps(ctx, tokens, 0, n, np, cut)
}

/// As llama-bench's `-d`: `depth` tokens already in each sequence's cache (filled untimed), then
/// prompt processing of `n_prompt` tokens after them (pp at depth), then, the cache as it was before
/// that prompt, `n_gen` steps of generation (tg at depth). The prompt is removed where that restores
/// the cache exactly; where it would not (a sliding window the prompt moved on, a recurrent state),
/// each sequence's state is saved after the fill and restored, as llama-bench does; failing both,
/// the depth is filled again.
pub fn at_depth(
    ctx: &mut Context,
    tokens: &mut TokenSource,
    (w, np): (&Workload, u32),
    timed: Phases,
    cut: &mut Cutoff,
) -> Result<(f64, f64)> {
    let (depth, n_prompt, n_gen) = (w.depth, w.n_prompt, w.n_gen);
    fill(ctx, tokens, depth, np)?;
    if !timed.prompt {
        // Generation alone: nothing to rewind; the prompt's figure is lent (0 until then).
        return Ok((0.0, steps(ctx, tokens, depth, n_gen, np, cut)?));
    }
    let seqs = 0..np.max(1) as i32;
    let rewinds = ctx.model().cache_rewinds_exactly();
    let saved: Vec<Vec<u8>> = if rewinds {
        Vec::new()
    } else {
        seqs.clone().map(|seq| ctx.save_seq(seq)).collect()
    };
    let batch = prompts_from(tokens, depth, n_prompt, np);
    let pp = timed_batch(ctx, &batch, cut)?;
    let restored = if rewinds {
        seqs.clone().all(|seq| ctx.truncate_seq(seq, depth as i32))
    } else {
        ctx.clear();
        seqs.zip(&saved)
            .all(|(seq, state)| !state.is_empty() && ctx.restore_seq(state, seq))
    };
    if !timed.generation {
        return Ok((pp, 0.0));
    }
    if !restored {
        fill(ctx, tokens, depth, np)?;
    }
    let tg = steps(ctx, tokens, depth, n_gen, np, cut)?;
    Ok((pp, tg))
}

/// An empty cache, then `depth` tokens of each of `np` sequences, untimed.
fn fill(ctx: &mut Context, tokens: &mut TokenSource, depth: u32, np: u32) -> Result<()> {
    ctx.clear();
    if depth > 0 {
        ctx.decode_sequences(&prompts_from(tokens, 0, depth, np))?;
        ctx.synchronize();
    }
    Ok(())
}

/// `n` timed steps of one token per sequence, after `depth` tokens already in each one's cache.
fn steps(
    ctx: &mut Context,
    tokens: &mut TokenSource,
    depth: u32,
    n: u32,
    np: u32,
    cut: &mut Cutoff,
) -> Result<f64> {
    if np <= 1 {
        let seconds = cut.timed(ctx, |ctx| {
            for i in 0..n {
                let mut tok = [if depth == 0 && i == 0 {
                    tokens.bos
                } else {
                    tokens.next()
                }];
                ctx.decode(&mut tok)?;
            }
            Ok(())
        })?;
        return Ok(n as f64 / seconds);
    }
    let steps: Vec<Vec<SeqToken>> = (0..n).map(|i| step_tokens(tokens, depth + i, np)).collect();
    let seconds = cut.timed(ctx, |ctx| {
        steps.iter().try_for_each(|step| ctx.decode_sequences(step))
    })?;
    Ok((n * np) as f64 / seconds)
}

/// `np` prompts of `n` tokens, one sequence after another (as llama-server fills a batch from its
/// slots), with an output on each one's last token.
fn prompts(tokens: &mut TokenSource, n: u32, np: u32) -> Vec<SeqToken> {
    prompts_from(tokens, 0, n, np)
}

/// [`prompts`] at positions `start..start + n` of each sequence (after `start` tokens in its cache;
/// only a prompt at 0 begins with BOS).
fn prompts_from(tokens: &mut TokenSource, start: u32, n: u32, np: u32) -> Vec<SeqToken> {
    (0..np.max(1) as i32)
        .flat_map(|seq| {
            let prompt = if start == 0 {
                tokens.prompt(n)
            } else {
                (0..n).map(|_| tokens.next()).collect()
            };
            let last = prompt.len().saturating_sub(1);
            prompt
                .into_iter()
                .enumerate()
                .map(move |(i, token)| SeqToken {
                    token,
                    pos: (start as usize + i) as i32,
                    seq,
                    logits: i == last,
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One generation step: a token of each of `np` sequences at position `pos`, each with its output.
fn step_tokens(tokens: &mut TokenSource, pos: u32, np: u32) -> Vec<SeqToken> {
    (0..np as i32)
        .map(|seq| SeqToken {
            token: if pos == 0 { tokens.bos } else { tokens.next() },
            pos: pos as i32,
            seq,
            logits: true,
        })
        .collect()
}

/// Random token ids, like llama-bench (content does not change the speed of a dense model).
pub struct TokenSource {
    state: u64,
    n_vocab: i32,
    pub bos: i32,
}

impl TokenSource {
    pub fn new(seed: u64, n_vocab: i32, bos: i32) -> Self {
        TokenSource {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
            n_vocab: n_vocab.max(1),
            bos: bos.max(0),
        }
    }
    pub fn next(&mut self) -> i32 {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let v = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (v % self.n_vocab as u64) as i32
    }
    pub fn prompt(&mut self, n: u32) -> Vec<i32> {
        let mut v = Vec::with_capacity(n as usize);
        v.push(self.bos);
        while v.len() < n as usize {
            v.push(self.next());
        }
        v.truncate(n as usize);
        v
    }
}
