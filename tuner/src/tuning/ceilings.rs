//! The ceilings a run on the host alone is judged by, probed before it (a few seconds): generation
//! at the memory's read bandwidth over the bytes a token reads (the roofline's probe and its
//! reads), the prompt at the peak of llama.cpp's own matrix-multiply kernels (in a worker, on the
//! model's weight types) over the multiplications a token needs. None beside an offload device (a
//! split's bytes and each device's peak would be needed), none for a model the caches hold, none
//! for a request the ceilings do not bound (a depth, several at once), none from a busy probe.

use crate::engine::TuneSettings;
use crate::explain::bandwidth::{self, Bandwidth};
use crate::explain::roofline;
use crate::measuring::{Ceilings, Workload};
use crate::worker::{MatmulRequest, Request, Response, Worker};
use search_space::gguf::GgufInfo;
use search_space::size::format_size;
use search_space::{CacheType, Candidate};
use std::time::Duration;

/// A model must read this many times the last-level cache a token for its reads to come from
/// memory (the bandwidth probe's own multiple).
const CACHE_MULTIPLE: u64 = 4;

/// Weight types doing less than this share of a token's multiplications are not probed (each probe
/// takes up to a second): left out, the ceiling only rises (a bound still).
const MINOR_TYPE: f64 = 0.10;

/// Timed passes of the matrix-multiply probe, and the time after which no pass starts.
const MATMUL_PASSES: u32 = 3;
const MATMUL_TIME: Duration = Duration::from_millis(500);

/// Other programs' share of the CPUs above which the matrix-multiply probe's peak is low: no
/// ceiling (the bandwidth probe's rule, [`Bandwidth::busy`]).
const BUSY_SHARE: f64 = 0.25;

/// The ceilings of `s`'s run of the model `info` describes.
pub(super) fn probe(s: &TuneSettings, info: &GgufInfo) -> Ceilings {
    let w = &s.plan.workload;
    if s.offload || s.plan.exhaustive || w.depth > 0 || w.n_parallel > 1 {
        return Ceilings::default();
    }
    let mut c = Ceilings::default();
    if let Some((tps, line)) = bandwidth::measure_cpu().and_then(|b| generation(&b, info, w)) {
        c.generation_tps = Some(tps);
        c.method.push(line);
    }
    let threads = (s.threads_batch_options.iter().chain(&s.threads_options))
        .copied()
        .max()
        .unwrap_or(1);
    if let Some((tps, line)) = prompt(info, threads) {
        c.prompt_tps = Some(tps);
        c.method.push(line);
    }
    c
}

/// Generated tokens a second at the probed bandwidth over the fewest bytes a token could read
/// (the weights, and the smallest KV cache searched: a 4-bit one).
fn generation(b: &Bandwidth, info: &GgufInfo, w: &Workload) -> Option<(f64, String)> {
    if b.busy || b.bytes_per_s <= 0.0 {
        return None;
    }
    let c = Candidate {
        type_k: CacheType::Q4_0,
        type_v: CacheType::Q4_0,
        ..Candidate::llama_default(1, 0)
    };
    let r = roofline::token_reads(info, &c, w, false);
    let bytes = r.weight_bytes + r.kv_bytes;
    if bytes == 0
        || b.cache_bytes
            .is_some_and(|llc| bytes < CACHE_MULTIPLE * llc)
    {
        return None;
    }
    let line = format!(
        "generation: {} read a token at {:.1} GB/s ({})",
        format_size(bytes),
        b.bytes_per_s / 1e9,
        b.method
    );
    Some((b.bytes_per_s / bytes as f64, line))
}

/// Prompt tokens a second with every weight type multiplied at its probed peak (the best of the
/// CPU's buffer types at `threads`); `None` where a type that matters could not be probed.
fn prompt(info: &GgufInfo, threads: u32) -> Option<(f64, String)> {
    let by_type = roofline::multiplied_by_type(info);
    let total: u64 = by_type.iter().map(|(_, _, p)| p).sum();
    let watch = crate::busy::Watch::start(&[]);
    let mut worker = Worker::spawn().ok()?;
    let mut seconds = 0.0;
    let mut parts = Vec::new();
    for (id, name, params) in by_type {
        if (params as f64) < MINOR_TYPE * total as f64 {
            continue;
        }
        let request = Request::Matmul(MatmulRequest {
            ggml_type: id,
            threads,
            passes: MATMUL_PASSES,
            time_limit_ms: MATMUL_TIME.as_millis() as u64,
        });
        let answer = worker.call(&request, Duration::from_secs(60), &|| false);
        let Ok(Response::Matmul {
            flops_per_s,
            buffer,
            ..
        }) = answer
        else {
            return None;
        };
        seconds += 2.0 * params as f64 / flops_per_s;
        parts.push(format!(
            "{name} {:.0} GFLOP/s ({buffer})",
            flops_per_s / 1e9
        ));
    }
    worker.quit();
    let busy = watch.share(Duration::ZERO).is_some_and(|s| s > BUSY_SHARE);
    (seconds > 0.0 && !busy).then(|| {
        let line = format!(
            "the prompt: {:.1} GFLOP a token at ggml's matrix-multiply peak with {threads} threads: {}",
            2.0 * total as f64 / 1e9,
            parts.join(", ")
        );
        (1.0 / seconds, line)
    })
}

/// The longest `--quick`'s request may take at its ceilings: its minute then holds llama.cpp's
/// defaults and a thread count beside them, each loaded, warmed up and measured three times, where
/// the machine reaches half its ceilings (a 2-core VM whose other core is busy reaches less).
const QUICK_REQUEST: Duration = Duration::from_secs(3);
/// The shortest prompt and generation a shortened request keeps.
const QUICK_PROMPT: u32 = 32;
const QUICK_GEN: u32 = 8;

/// `--quick`'s request where even at the ceilings the workload's would take longer than
/// [`QUICK_REQUEST`] (a 7B model on a few cores takes most of a minute): the prompt and the
/// generation shortened alike, to take that long there. The rates of a shorter request stand for
/// the workload's (on a CPU, a prompt's rate hardly depends on its length past a few dozen tokens).
pub(super) fn quick_workload(w: &Workload, c: &Ceilings) -> Option<Workload> {
    let (pp, tg) = (c.prompt_tps?, c.generation_tps?);
    let fastest = f64::from(w.n_prompt) / pp + f64::from(w.n_gen) / tg;
    let want = QUICK_REQUEST.as_secs_f64();
    if fastest <= want {
        return None;
    }
    let k = want / fastest;
    // Whole steps of a quarter of the least, so that the next run on this machine, whose probes
    // differ by a few percent, measures the same request and reuses what this one measured.
    let cut = |n: u32, least: u32| {
        let step = least / 4;
        ((f64::from(n) * k) as u32 / step * step).max(least).min(n)
    };
    Some(Workload {
        n_prompt: cut(w.n_prompt, QUICK_PROMPT),
        n_gen: cut(w.n_gen, QUICK_GEN),
        ..w.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(n_prompt: u32, n_gen: u32) -> Workload {
        Workload {
            n_ctx: 4096,
            n_prompt,
            n_gen,
            depth: 0,
            n_parallel: 1,
            name: String::new(),
        }
    }

    #[test]
    fn quick_shortens_a_request_its_minute_cannot_hold() {
        let slow = Ceilings {
            prompt_tps: Some(32.0),
            generation_tps: Some(8.0),
            method: Vec::new(),
        };
        // 512 / 32 + 64 / 8 = 24 s at the ceilings: an eighth of it (64 and 8 tokens, in steps of
        // 8 and 2).
        let q = quick_workload(&w(512, 64), &slow).expect("shortened");
        assert_eq!((q.n_prompt, q.n_gen, q.n_ctx), (64, 8, 4096));
        assert!(f64::from(q.n_prompt) / 32.0 + f64::from(q.n_gen) / 8.0 <= 3.0);
        // A small model's request fits as it is; without both ceilings nothing is said.
        let fast = Ceilings {
            prompt_tps: Some(2000.0),
            generation_tps: Some(100.0),
            method: Vec::new(),
        };
        assert_eq!(quick_workload(&w(512, 64), &fast), None);
        let half = Ceilings {
            prompt_tps: None,
            ..slow.clone()
        };
        assert_eq!(quick_workload(&w(512, 64), &half), None);
        // Never below the least prompt and generation.
        let crawl = Ceilings {
            prompt_tps: Some(1.0),
            generation_tps: Some(0.1),
            method: Vec::new(),
        };
        let q = quick_workload(&w(512, 64), &crawl).unwrap();
        assert_eq!((q.n_prompt, q.n_gen), (QUICK_PROMPT, QUICK_GEN));
    }
}
