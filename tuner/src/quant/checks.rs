//! The worker side of the checks of a profile's output: the f16-cache reference's greedy choice at
//! each position of a server's own generation (`apply --exec --check-only`), and a long-context
//! retrieval, facts placed deep in a full context and asked for at its end (`autotune verify`).
//! Both load the model in the worker, where a llama.cpp abort is the check's failure, not
//! autotune's.

use crate::llama::{Context, ContextSettings, Model, ModelSettings};
use crate::worker::protocol::Response;
pub use crate::worker::protocol::{Fact, GreedyRequest, RetrievalAnswer, RetrievalRequest};
use std::sync::Arc;

fn failed(stage: &str, message: impl Into<String>) -> Response {
    Response::Failed {
        stage: stage.into(),
        message: message.into(),
    }
}

/// The index of the largest logit.
fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as i32
}

/// Answers a [`GreedyRequest`] with the reference's top-1 token at each position from `from` on.
pub fn greedy(q: &GreedyRequest) -> Response {
    let model = match Model::load(&q.model, &ModelSettings::default()) {
        Ok(m) => Arc::new(m),
        Err(e) => return failed("load", e.to_string()),
    };
    let n = q.tokens.len() as u32;
    let settings = ContextSettings::defaults(n.div_ceil(256).max(1) * 256, q.threads.max(1))
        .with_knobs(|c| (c.n_batch, c.n_ubatch) = (n.max(1), n.clamp(1, 512)));
    let mut ctx = match Context::new(&model, &settings) {
        Ok(c) => c,
        Err(e) => return failed("context", e.to_string()),
    };
    let from = q.from.min(q.tokens.len());
    let decoded = (if from > 0 {
        ctx.decode_at(&q.tokens[..from], 0, false)
    } else {
        Ok(())
    })
    .and_then(|()| ctx.decode_at(&q.tokens[from..], from as i32, true));
    if let Err(e) = decoded {
        return failed("decode", e.to_string());
    }
    let top1 = (0..q.tokens.len() - from)
        .map(|i| argmax(ctx.logits_ith(i as i32)))
        .collect();
    Response::Greedy { top1 }
}

/// Answers a [`RetrievalRequest`]: for each fact, a context as full as the request's, the fact at
/// its depth, the question at the end, and the model's greedy answer.
pub fn retrieval(q: &RetrievalRequest) -> Response {
    let model = match Model::load(&q.model, &q.settings) {
        Ok(m) => Arc::new(m),
        Err(e) => return failed("load", e.to_string()),
    };
    let filler = match model.tokenize(&q.filler) {
        Ok(t) if !t.is_empty() => t,
        Ok(_) => return failed("tokenize", "the filler text has no tokens"),
        Err(e) => return failed("tokenize", e),
    };
    let mut answers = Vec::new();
    for fact in &q.facts {
        let prompt = match prompt(&model, &filler, fact, q) {
            Ok(p) => p,
            Err(e) => return failed("tokenize", e),
        };
        match answer(&model, &prompt, q) {
            Ok(text) => answers.push(text),
            Err(e) => return failed("decode", e),
        }
    }
    Response::Retrieved(RetrievalAnswer {
        answers,
        tokens: q.context.n_ctx,
    })
}

/// The prompt of one fact: the filler cycled to fill the context less the answer's room, the
/// fact's sentence at `depth` of it, its question at the end.
fn prompt(
    model: &Model,
    filler: &[i32],
    fact: &Fact,
    q: &RetrievalRequest,
) -> Result<Vec<i32>, String> {
    let sentence = model.tokenize(&format!(" {} ", fact.sentence))?;
    let question = model.tokenize(&format!("\n\n{}", fact.question))?;
    let bos: Vec<i32> = model.add_bos().then(|| model.bos()).into_iter().collect();
    let room = (q.context.n_ctx as usize).saturating_sub(q.n_gen as usize + 1);
    let fill = room
        .checked_sub(bos.len() + sentence.len() + question.len())
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("a context of {} tokens holds no filler", q.context.n_ctx))?;
    let at = (fill as f64 * q.depth) as usize;
    let text: Vec<i32> = (0..fill).map(|i| filler[i % filler.len()]).collect();
    Ok(bos
        .into_iter()
        .chain(text[..at].iter().copied())
        .chain(sentence)
        .chain(text[at..].iter().copied())
        .chain(question)
        .collect())
}

/// The model's greedy continuation of `prompt`, `n_gen` tokens at most (an end-of-generation
/// token ends it), as text.
fn answer(model: &Arc<Model>, prompt: &[i32], q: &RetrievalRequest) -> Result<String, String> {
    let mut ctx = Context::new(model, &q.context).map_err(|e| e.to_string())?;
    ctx.decode_at(prompt, 0, false).map_err(|e| e.to_string())?;
    let mut text = Vec::new();
    for pos in (prompt.len() as i32..).take(q.n_gen as usize) {
        let next = argmax(ctx.last_logits());
        if model.is_eog(next) {
            break;
        }
        text.extend_from_slice(model.token_text(next));
        ctx.decode_at(&[next], pos, false)
            .map_err(|e| e.to_string())?;
    }
    // SentencePiece's word boundary is a space.
    Ok(String::from_utf8_lossy(&text).replace('\u{2581}', " "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_logit_wins_and_a_tie_goes_to_the_first() {
        assert_eq!(argmax(&[0.1, 2.0, -1.0, 2.0]), 1);
        assert_eq!(argmax(&[3.0]), 0);
    }
}
