//! The check of a started server's output against the f16-cache reference (`apply --exec
//! --check-only`): the server generates greedily from the check's prompt, and llama.cpp linked into
//! autotune (the model with f16 caches, on the CPU: the server holds the devices) says at each
//! position of that generation which token it finds most likely. Their top-1 agreement is the share
//! that match: the quality figure where it is used, beside the one the gate measured. A server
//! whose cache or build changes what the model says agrees less.

use super::server::{self, ServerProcess};
use crate::exit::{self, Exit};
use crate::stored::one_line;
use crate::worker::{Request, Response, Worker};
use profiles::Profile;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Tokens the server generates for the check.
pub const TOKENS: u32 = 32;

/// The server's greedy generation against the f16-cache reference.
#[derive(Debug, Clone, Serialize)]
pub struct Agreement {
    /// The server's K/V cache pair (`q8_0/q8_0`).
    pub kv: String,
    /// Tokens the server generated, and how many of them the reference found most likely too.
    pub tokens: usize,
    pub agreed: usize,
    /// `agreed / tokens`.
    pub top1: f64,
    /// The top-1 agreement the profile's quality gate measured for its pair, where it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_top1: Option<f64>,
}

impl Agreement {
    /// The line `apply` prints.
    pub fn line(&self) -> String {
        let gate = self.gate_top1.map_or(String::new(), |g| {
            format!("; the quality gate measured top-1 {:.1}%", 100.0 * g)
        });
        format!(
            "kv={}: the server's greedy output agrees with the f16-cache reference on {} of {} tokens (top-1 {:.1}%){gate}",
            self.kv,
            self.agreed,
            self.tokens,
            100.0 * self.top1
        )
    }
}

/// Has the server generate [`TOKENS`] greedily and the reference choose at each of their positions.
pub fn check(
    proc: &mut ServerProcess,
    url: &str,
    p: &Profile,
    signal: &AtomicUsize,
) -> anyhow::Result<Agreement> {
    let timeout = Duration::from_secs(300);
    let slot = profiles::slot_ctx(p.workload.n_ctx, p.workload.n_parallel);
    let mut prompt = tokenize(url, server::PROMPT, timeout)?;
    // Room for the generation in a slot: the prompt's last tokens after its first (BOS).
    let room = (slot as usize).saturating_sub(TOKENS as usize + 2).max(2);
    if prompt.len() > room {
        let cut = prompt.len() - room + 1;
        prompt.drain(1..cut);
    }
    let body = serde_json::Value::from(prompt.clone());
    let answer = server::complete(proc, url, &body, TOKENS, timeout, signal)?;
    let generated: Vec<i32> = (answer.tokens.iter())
        .filter_map(|&t| i32::try_from(t).ok())
        .collect();
    if generated.is_empty() {
        return Err(Exit::new(
            exit::ERROR,
            "llama-server did not return the generated tokens (`return_tokens`): a build too old for the quality check",
        ));
    }
    let mut sequence = prompt.clone();
    sequence.extend_from_slice(&generated[..generated.len() - 1]);
    let top1 = reference_top1(p, sequence, prompt.len() - 1, signal)?;
    let agreed = (top1.iter().zip(&generated))
        .filter(|(a, b)| a == b)
        .count();
    Ok(Agreement {
        kv: p.winner.kv_label(),
        tokens: generated.len(),
        agreed,
        top1: agreed as f64 / generated.len() as f64,
        gate_top1: (p.quality.as_ref())
            .and_then(|q| q.check(&p.winner))
            .and_then(|c| c.figures.as_ref().map(|f| f.top1)),
    })
}

/// The server's tokens of `text`, its special ones (BOS) first.
fn tokenize(url: &str, text: &str, timeout: Duration) -> anyhow::Result<Vec<i32>> {
    #[derive(Deserialize)]
    struct Tokens {
        tokens: Vec<i64>,
    }
    let endpoint = format!("{url}/tokenize");
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let body = serde_json::json!({ "content": text, "add_special": true });
    let answer: Tokens = match agent.post(&endpoint).send_json(body) {
        Ok(r) => r.into_json().map_err(|e| {
            Exit::new(
                exit::ERROR,
                format!("unexpected answer from {endpoint}: {e}"),
            )
        })?,
        Err(e) => {
            return Err(Exit::new(
                exit::ERROR,
                format!("{endpoint}: {}", one_line(&e.to_string())),
            ))
        }
    };
    Ok(answer
        .tokens
        .into_iter()
        .filter_map(|t| i32::try_from(t).ok())
        .collect())
}

/// The f16-cache reference's most likely token at each position of `sequence` from `from` on, in
/// a worker (llama.cpp aborts on some failures).
fn reference_top1(
    p: &Profile,
    sequence: Vec<i32>,
    from: usize,
    signal: &AtomicUsize,
) -> anyhow::Result<Vec<i32>> {
    let request = Request::Greedy(crate::worker::protocol::GreedyRequest {
        model: p.model.path.clone(),
        tokens: sequence,
        from,
        threads: crate::session::default_threads(),
    });
    let mut worker = Worker::spawn()
        .map_err(|e| Exit::new(exit::ERROR, format!("cannot start a worker: {e}")))?;
    let stop = || signal.load(Ordering::Relaxed) != 0;
    let answer = worker.call(&request, Duration::from_secs(3600), &stop);
    worker.quit();
    match answer {
        Ok(Response::Greedy { top1 }) => Ok(top1),
        Ok(_) => Err(Exit::new(exit::ERROR, "unexpected answer from the worker")),
        Err(f) => Err(Exit::new(
            exit::ERROR,
            format!(
                "the f16-cache reference could not be run: {}",
                one_line(&f.to_string())
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_the_agreement_and_the_gates() {
        let a = Agreement {
            kv: "q8_0/q8_0".into(),
            tokens: 32,
            agreed: 31,
            top1: 31.0 / 32.0,
            gate_top1: Some(0.952),
        };
        assert_eq!(
            a.line(),
            "kv=q8_0/q8_0: the server's greedy output agrees with the f16-cache reference on 31 of 32 tokens (top-1 96.9%); the quality gate measured top-1 95.2%"
        );
    }
}
