//! The `ollama` format: an Ollama Modelfile. Ollama takes context, threads, micro-batch and GPU
//! layers per model (`PARAMETER`s); the KV cache type and flash attention are server-wide
//! environment variables there; the rest cannot be set. Every knob of the table away from
//! llama.cpp's default that Ollama does not take gets an `# autotune:` comment, so nothing measured
//! is silently dropped and a new knob is never left out.
//!
//! Ollama's `num_batch` is llama.cpp's micro-batch: its runner makes a context with
//! `n_ubatch = num_batch` and `n_batch = num_batch × OLLAMA_NUM_PARALLEL` (`llama/llama.go`,
//! `NewContextParams`), so the profile's `-ub` is written as `num_batch`, and its `-b` gets a note
//! where Ollama's batch differs from it.

use super::exporter::{about, Exporter};
use crate::error::Result;
use crate::profile::Profile;
use crate::server_args::words;
use search_space::knob::{
    Batch, Devices, Flash, GpuLayers, KvCache, NumaKnob, TensorSplit, Threads, ThreadsBatch, Ubatch,
};
use search_space::{CacheType, Candidate, FlashAttn, Knob, KNOBS};
use std::fmt::Write as _;

pub struct Ollama;

impl Exporter for Ollama {
    fn takes_several(&self) -> bool {
        false
    }

    fn export(&self, ps: &[&Profile]) -> Result<String> {
        Ok(modelfile(ps[0]))
    }
}

fn modelfile(p: &Profile) -> String {
    let c = &p.winner;
    let mut out = String::new();
    out.push_str(&about(p, "# "));
    let model = p.model.path.to_string_lossy();
    if model.contains(char::is_whitespace) {
        let _ = writeln!(out, "FROM \"{model}\"");
    } else {
        let _ = writeln!(out, "FROM {model}");
    }
    // Ollama's num_ctx is one request's; it allocates that for each of OLLAMA_NUM_PARALLEL.
    let np = p.workload.n_parallel.max(1);
    let _ = writeln!(out, "PARAMETER num_ctx {}", p.workload.n_ctx / np);
    let _ = writeln!(out, "PARAMETER num_thread {}", c.threads);
    let _ = writeln!(out, "PARAMETER num_batch {}", c.n_ubatch);
    let _ = writeln!(out, "PARAMETER num_gpu {}", c.n_gpu_layers);

    if np > 1 {
        let _ = writeln!(
            out,
            "# autotune: {np} requests at once (llama.cpp -np {np}): set OLLAMA_NUM_PARALLEL={np} for the Ollama server"
        );
    }
    if c.n_batch != c.n_ubatch * np {
        let _ = writeln!(
            out,
            "# autotune: batch {} (llama.cpp -b {}): Ollama submits num_batch x OLLAMA_NUM_PARALLEL = {} tokens at once \
             and cannot set this",
            c.n_batch,
            c.n_batch,
            c.n_ubatch * np
        );
    }
    server_wide_notes(c, &mut out);
    for &k in KNOBS
        .iter()
        .filter(|k| !k.is_default(c) && !ollama_takes(**k))
    {
        let _ = writeln!(out, "# autotune: {}", knob_note(k, c));
    }
    speculation_notes(p, &mut out);
    out
}

/// The knobs Ollama takes, or that have a line of their own above: a Modelfile's `PARAMETER`
/// (threads, micro-batch, GPU layers), the server's own variable ([`server_wide_notes`]: KV cache,
/// flash attention), and the batch, which Ollama makes from the micro-batch.
fn ollama_takes(k: &dyn Knob) -> bool {
    let taken = [
        Threads.name(),
        Ubatch.name(),
        Batch.name(),
        GpuLayers.name(),
        KvCache.name(),
        Flash.name(),
    ];
    taken.contains(&k.name())
}

/// The note for a knob Ollama does not take: its name and value, how llama.cpp is told (its
/// llama-server options, or its environment variable) and what Ollama does instead.
fn knob_note(k: &dyn Knob, c: &Candidate) -> String {
    let (name, value) = (k.name(), k.value(c));
    if let Some((var, Some(v))) = k.env(c) {
        // Ollama's server runs its bundled ggml and llama.cpp in its own environment.
        return format!(
            "{name} {value} ({var}={v}): a Modelfile cannot set environment variables; set it for the \
             Ollama server (every model it runs gets it), whose bundled llama.cpp reads it if recent enough"
        );
    }
    let how = words(k.server(c)).join(" ");
    let instead = if name == ThreadsBatch.name() {
        "Ollama uses num_thread for both"
    } else if name == Devices.name() {
        "Ollama picks GPUs itself (limit them with CUDA_VISIBLE_DEVICES or similar)"
    } else if name == TensorSplit.name() {
        "Ollama splits by free memory itself"
    } else if name == NumaKnob.name() {
        "Ollama cannot set this (it chooses its NUMA mode itself)"
    } else {
        "Ollama cannot set this"
    };
    format!("{name} {value} (llama.cpp {how}): {instead}")
}

/// What Ollama sets server-wide, by its own environment variables: the KV cache type (one for K
/// and V, of three types) and flash attention. Written whatever their value: Ollama's defaults
/// are not llama.cpp's.
fn server_wide_notes(c: &Candidate, out: &mut String) {
    let ollama_kv = [CacheType::F16, CacheType::Q8_0, CacheType::Q4_0];
    if c.type_k == c.type_v && ollama_kv.contains(&c.type_k) {
        let _ = writeln!(
            out,
            "# autotune: KV cache {}: set OLLAMA_KV_CACHE_TYPE={} for the Ollama server",
            c.type_k, c.type_k
        );
    } else {
        let _ = writeln!(
            out,
            "# autotune: KV cache K={} V={}: Ollama has one OLLAMA_KV_CACHE_TYPE for K and V (f16, q8_0 or q4_0) \
             and cannot express this",
            c.type_k, c.type_v
        );
    }
    let flash = match c.flash_attn {
        FlashAttn::On => "flash attention on: set OLLAMA_FLASH_ATTENTION=1 for the Ollama server",
        FlashAttn::Off => "flash attention off: set OLLAMA_FLASH_ATTENTION=0 for the Ollama server",
        FlashAttn::Auto => "flash attention auto: leave OLLAMA_FLASH_ATTENTION unset",
    };
    let _ = writeln!(out, "# autotune: {flash}");
}

/// The `# autotune:` lines for a measured draft model, n-gram or MTP speculation: Ollama runs none.
fn speculation_notes(p: &Profile, out: &mut String) {
    if let Some(d) = &p.draft {
        let _ = writeln!(
            out,
            "# autotune: draft model {} (speculative decoding, {:.1} vs {:.1} t/s): Ollama cannot run a draft model",
            d.file_name, d.tg_tps, d.baseline_tg_tps
        );
    }
    if let Some(n) = &p.ngram {
        let _ = writeln!(
            out,
            "# autotune: n-gram speculation {} (size n {}, m {}; {:.1} vs {:.1} t/s): Ollama cannot speculate",
            n.spec_type, n.size_n, n.size_m, n.tg_tps, n.baseline_tg_tps
        );
    }
    if let Some(m) = &p.mtp {
        let _ = writeln!(
            out,
            "# autotune: MTP speculation {} (n_max {}; {:.1} vs {:.1} t/s): Ollama cannot speculate",
            crate::DRAFT_MTP, m.n_max, m.tg_tps, m.baseline_tg_tps
        );
    }
}
