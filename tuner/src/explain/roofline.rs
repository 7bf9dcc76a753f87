//! Bytes read per generated token, from the GGUF tensor sizes, and the roofline they imply.
//!
//! Generating one token runs every layer once, so it reads:
//! - every weight tensor once, except the token-embedding table, of which only the row of the token is
//!   read (a lookup). When the file has no `output.weight`, the output projection is tied to the
//!   embedding table and reads it whole.
//! - for a mixture of experts, only the used experts: each expert tensor (`*_exps`) counts
//!   `expert_used_count / expert_count` of its size; the router and shared experts count whole.
//! - the KV cache: for each layer, K and V of every cached token. The per-token width of K and V
//!   comes from the `attn_k`/`attn_v` weight shapes (their output dimension is `head_count_kv ×
//!   head dim`), which also covers models whose head dim is not `embedding / heads`; models without
//!   those tensors fall back to `head_count_kv × embedding / head_count`. Bytes per element are the
//!   cache type's bits / 8 (q8_0: 8.5 bits). This is an estimate: sliding-window layers read at most
//!   their window and MLA caches are compressed, so deep contexts on such models read less.
//!
//! Generation is measured from an empty cache (and again after `depth` cached tokens), so the mean
//! number of cached tokens while it is measured is `depth + (n_gen + 1) / 2`.
//!
//! With layers offloaded (`-ngl N`), llama.cpp puts the last N of the model's layers on the device
//! (and the output layer when N exceeds the layer count); the token-embedding lookup stays on the
//! CPU. What remains is the CPU's share, the bytes its memory bandwidth has to deliver.

use profiles::{Roofline, Workload};
use search_space::gguf::{GgufInfo, TensorInfo};
use search_space::Candidate;

/// What one generated token reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenReads {
    pub weight_bytes: u64,
    pub kv_bytes: u64,
    pub kv_tokens: u32,
    pub kv_bytes_per_cached_token: u64,
    /// Of `weight_bytes + kv_bytes`, what stays on the CPU with the candidate's placement.
    pub cpu_bytes: u64,
    pub parameters: u64,
    pub active_parameters: u64,
}

/// Where a tensor belongs: a layer, the output layer, or the embedding lookup.
enum Part {
    Layer(u32),
    Output,
    Lookup,
}

fn part_of(name: &str) -> Part {
    if let Some(rest) = name.strip_prefix("blk.") {
        if let Some(n) = rest.split('.').next().and_then(|n| n.parse().ok()) {
            return Part::Layer(n);
        }
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Part::Lookup
    } else {
        Part::Output
    }
}

fn elements(t: &TensorInfo) -> u64 {
    t.dims.iter().product()
}

/// Bytes and parameters of one tensor read for one token (before placement).
fn per_token(t: &TensorInfo, info: &GgufInfo, tied_output: bool) -> (u64, u64) {
    match part_of(&t.name) {
        Part::Lookup if !(tied_output && t.name == "token_embd.weight") => {
            let rows = t.dims.last().copied().unwrap_or(1).max(1);
            (t.bytes / rows, elements(t) / rows)
        }
        _ if t.name.contains("_exps") && info.is_moe() => {
            let used = u64::from(info.expert_used_count.unwrap_or(1).max(1));
            let count = u64::from(info.expert_count.unwrap_or(1).max(1));
            let used = used.min(count);
            (t.bytes * used / count, elements(t) * used / count)
        }
        _ => (t.bytes, elements(t)),
    }
}

/// Bytes of one tensor read per generated token when `np` sequences decode together: each step reads
/// a weight once for all of them (so each token gets `1/np` of it), and a mixture of experts the
/// experts any of the `np` tokens routes to (expected `1 - (1 - used/count)^np` of them, routing
/// taken as independent); a lookup reads one row per token.
fn per_token_shared(t: &TensorInfo, info: &GgufInfo, tied_output: bool, np: u32) -> u64 {
    let (bytes, _) = per_token(t, info, tied_output);
    if np <= 1 {
        return bytes;
    }
    match part_of(&t.name) {
        Part::Lookup if !(tied_output && t.name == "token_embd.weight") => bytes,
        _ if t.name.contains("_exps") && info.is_moe() => {
            let count = f64::from(info.expert_count.unwrap_or(1).max(1));
            let used = f64::from(info.expert_used_count.unwrap_or(1).max(1)).min(count);
            let step = 1.0 - (1.0 - used / count).powi(np as i32);
            (t.bytes as f64 * step / np as f64).round() as u64
        }
        _ => bytes / u64::from(np),
    }
}

/// K+V bytes of one cached token in each layer, for the candidate's cache types.
fn kv_per_layer(info: &GgufInfo, c: &Candidate, layers: u32) -> Vec<u64> {
    let (bk, bv) = (c.type_k.bits_per_element(), c.type_v.bits_per_element());
    let width = |suffix: &str, layer: u32| {
        info.tensors
            .iter()
            .find(|t| t.name == format!("blk.{layer}.{suffix}"))
            .and_then(|t| t.dims.get(1).copied())
    };
    let any_k = (0..layers).any(|l| width("attn_k.weight", l).is_some());
    let fallback = match (info.head_count_kv, info.embedding_length, info.head_count) {
        (Some(kv), Some(e), Some(h)) if h > 0 => kv * (e / h),
        _ => 0,
    };
    (0..layers)
        .map(|l| {
            let (k, v) = if any_k {
                (
                    width("attn_k.weight", l).unwrap_or(0),
                    width("attn_v.weight", l)
                        .or(width("attn_k.weight", l))
                        .unwrap_or(0),
                )
            } else {
                (fallback, fallback)
            };
            ((k as f64 * bk + v as f64 * bv) / 8.0).round() as u64
        })
        .collect()
}

/// What one token generated with candidate `c` reads, for the workload's measured generation (with
/// `--parallel N`, one of N sequences' tokens: its share of the step's weights, its own KV cache).
/// `offload`: whether the machine has a non-CPU device that `c.n_gpu_layers` puts layers on.
pub fn token_reads(info: &GgufInfo, c: &Candidate, w: &Workload, offload: bool) -> TokenReads {
    let layers = info.block_count.unwrap_or(0);
    let ngl = if offload { c.n_gpu_layers } else { 0 };
    let first_offloaded = layers - ngl.min(layers);
    let output_offloaded = ngl > layers;
    let tied_output = !info.tensors.iter().any(|t| t.name == "output.weight");
    let on_cpu = |part: &Part| match part {
        Part::Layer(n) => *n < first_offloaded,
        Part::Output => !output_offloaded,
        // The lookup is on the CPU; a tied output projection is placed with the output layer.
        Part::Lookup => !(tied_output && output_offloaded),
    };
    let mut r = TokenReads {
        kv_tokens: w.depth + w.n_gen.div_ceil(2),
        ..Default::default()
    };
    for t in &info.tensors {
        let (_, params) = per_token(t, info, tied_output);
        let bytes = per_token_shared(t, info, tied_output, w.n_parallel);
        r.parameters += elements(t);
        r.active_parameters += params;
        r.weight_bytes += bytes;
        if on_cpu(&part_of(&t.name)) {
            r.cpu_bytes += bytes;
        }
    }
    let tokens = u64::from(r.kv_tokens);
    for (layer, bytes) in kv_per_layer(info, c, layers).into_iter().enumerate() {
        r.kv_bytes_per_cached_token += bytes;
        r.kv_bytes += bytes * tokens;
        if (layer as u32) < first_offloaded {
            r.cpu_bytes += bytes * tokens;
        }
    }
    r
}

/// The parameters one token multiplies, by ggml type (id and name), largest first: every weight
/// matrix's active parameters (a mixture of experts' used share of its experts), not the embedding
/// lookup's row nor any one-dimensional tensor (norms, biases). What a prompt's matrix products
/// compute: two operations a parameter a token.
pub fn multiplied_by_type(info: &GgufInfo) -> Vec<(u32, String, u64)> {
    let tied_output = !info.tensors.iter().any(|t| t.name == "output.weight");
    let mut out: Vec<(u32, String, u64)> = Vec::new();
    for t in info
        .tensors
        .iter()
        .filter(|t| t.dims.iter().filter(|&&d| d > 1).count() >= 2)
    {
        if matches!(part_of(&t.name), Part::Lookup)
            && !(tied_output && t.name == "token_embd.weight")
        {
            continue;
        }
        let (_, params) = per_token(t, info, tied_output);
        match out.iter_mut().find(|(id, _, _)| *id == t.ggml_type) {
            Some(row) => row.2 += params,
            None => out.push((t.ggml_type, t.type_name.clone(), params)),
        }
    }
    out.sort_by_key(|row| std::cmp::Reverse(row.2));
    out
}

/// Whether every layer reads K and V of every cached token: each layer has its `attn_k` and
/// `attn_v` weights (no recurrent or attention-free layers), and the model has no sliding window
/// and no compressed (MLA) cache. Then the KV cache a token reads grows with the context.
pub fn kv_grows(info: &GgufInfo) -> bool {
    let layers = info.block_count.unwrap_or(0);
    let has = |i: u32, t: &str| {
        let name = format!("blk.{i}.{t}.weight");
        info.tensors.iter().any(|x| x.name == name)
    };
    layers > 0
        && info.sliding_window.is_none()
        && info.kv_lora_rank.is_none()
        && (0..layers).all(|i| has(i, "attn_k") && has(i, "attn_v"))
}

/// The roofline record a profile keeps: the token's reads and the measured bandwidth (if any).
pub fn roofline(
    info: &GgufInfo,
    c: &Candidate,
    w: &Workload,
    offload: bool,
    bandwidth: Option<&super::bandwidth::Bandwidth>,
) -> Roofline {
    let r = token_reads(info, c, w, offload);
    Roofline {
        layers: info.block_count.unwrap_or(0),
        parameters: r.parameters,
        active_parameters: r.active_parameters,
        expert_count: info.expert_count,
        expert_used_count: info.expert_used_count,
        weight_bytes: r.weight_bytes,
        kv_bytes: r.kv_bytes,
        kv_tokens: r.kv_tokens,
        kv_bytes_per_cached_token: r.kv_bytes_per_cached_token,
        kv_grows: kv_grows(info),
        cpu_bytes: r.cpu_bytes,
        cpu_bandwidth: bandwidth.map(|b| b.bytes_per_s),
        bandwidth_method: bandwidth.map_or_else(
            || "not measured".to_string(),
            |b| format!("CPU: {}", b.method),
        ),
        device_bandwidth: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use search_space::testfiles::{ggml, GgufBuilder};
    use search_space::CacheType;

    fn info_of(b: GgufBuilder) -> GgufInfo {
        let bytes = b.build();
        GgufInfo::from_reader(
            &bytes[..],
            bytes.len() as u64,
            std::path::Path::new("fixture.gguf"),
        )
        .unwrap()
    }

    fn workload(n_gen: u32, depth: u32) -> Workload {
        Workload {
            n_ctx: 4096,
            n_prompt: 512,
            n_parallel: 1,
            n_gen,
            depth,
            name: "custom".into(),
        }
    }

    /// Two layers of a dense llama-shaped model: embedding 256, 4 heads, 2 KV heads (K/V width 128),
    /// a separate output matrix, vocabulary 1024.
    fn dense(output: bool) -> GgufBuilder {
        let mut b = GgufBuilder::new("llama")
            .kv_u32("llama.block_count", 2)
            .kv_u32("llama.embedding_length", 256)
            .kv_u32("llama.attention.head_count", 4)
            .kv_u32("llama.attention.head_count_kv", 2)
            .tensor("token_embd.weight", ggml::Q8_0, &[256, 1024]);
        for l in 0..2 {
            b = b
                .tensor(&format!("blk.{l}.attn_norm.weight"), ggml::F32, &[256])
                .tensor(&format!("blk.{l}.attn_q.weight"), ggml::Q4_K, &[256, 256])
                .tensor(&format!("blk.{l}.attn_k.weight"), ggml::Q4_K, &[256, 128])
                .tensor(&format!("blk.{l}.attn_v.weight"), ggml::Q8_0, &[256, 128])
                .tensor(&format!("blk.{l}.ffn_up.weight"), ggml::Q4_K, &[256, 512]);
        }
        b = b.tensor("output_norm.weight", ggml::F32, &[256]);
        if output {
            b = b.tensor("output.weight", ggml::Q6_K, &[256, 1024]);
        }
        b
    }

    #[test]
    fn the_kv_cache_grows_with_the_context_only_where_every_layer_attends_to_all_of_it() {
        assert!(kv_grows(&info_of(dense(true))));
        // Sliding-window layers (Gemma 3, gpt-oss) and MLA caches (DeepSeek) read less.
        assert!(!kv_grows(&info_of(
            dense(true).kv_u32("llama.attention.sliding_window", 512)
        )));
        assert!(!kv_grows(&info_of(
            dense(true).kv_u32("llama.attention.kv_lora_rank", 512)
        )));
        // A layer without attention (a recurrent or hybrid model's) caches no K and V.
        let hybrid = GgufBuilder::new("llama")
            .kv_u32("llama.block_count", 2)
            .tensor("blk.0.attn_k.weight", ggml::Q4_K, &[256, 128])
            .tensor("blk.0.attn_v.weight", ggml::Q4_K, &[256, 128])
            .tensor("blk.1.ssm_in.weight", ggml::Q4_K, &[256, 512]);
        assert!(!kv_grows(&info_of(hybrid)));
    }

    fn bytes_of(info: &GgufInfo, name: &str) -> u64 {
        info.tensors.iter().find(|t| t.name == name).unwrap().bytes
    }

    #[test]
    fn a_dense_token_reads_every_weight_but_one_embedding_row() {
        let info = info_of(dense(true));
        let all: u64 = info.tensors.iter().map(|t| t.bytes).sum();
        let embd = bytes_of(&info, "token_embd.weight");
        assert_eq!(embd, 1024 * 272); // q8_0: 34 bytes per 32 elements
        let c = Candidate::llama_default(2, 0);
        let r = token_reads(&info, &c, &workload(128, 0), false);
        assert_eq!(r.weight_bytes, all - embd + embd / 1024);
        assert_eq!(r.parameters, info.parameter_count);
        assert_eq!(r.active_parameters, info.parameter_count - 256 * 1024 + 256);
        // f16 K and V of width 128 in two layers: 2 × (128 + 128) × 2 bytes per cached token.
        assert_eq!(r.kv_bytes_per_cached_token, 1024);
        assert_eq!(r.kv_tokens, 64);
        assert_eq!(r.kv_bytes, 1024 * 64);
        assert_eq!(r.cpu_bytes, r.weight_bytes + r.kv_bytes);
    }

    #[test]
    fn parallel_sequences_share_each_steps_weights_but_not_their_kv() {
        let info = info_of(dense(true));
        let c = Candidate::llama_default(2, 0);
        let one = token_reads(&info, &c, &workload(128, 0), false);
        let w4 = Workload {
            n_parallel: 4,
            ..workload(128, 0)
        };
        let four = token_reads(&info, &c, &w4, false);
        let embd = bytes_of(&info, "token_embd.weight");
        let row = embd / 1024;
        // Every weight but the lookup is read once per step for 4 tokens; the lookup a row each.
        let shared: u64 = info
            .tensors
            .iter()
            .filter(|t| t.name != "token_embd.weight")
            .map(|t| t.bytes / 4)
            .sum();
        assert_eq!(four.weight_bytes, shared + row);
        assert!(four.weight_bytes * 3 < one.weight_bytes, "{four:?} {one:?}");
        assert_eq!(four.kv_bytes, one.kv_bytes);
        assert_eq!(four.active_parameters, one.active_parameters);
    }

    #[test]
    fn a_token_multiplies_every_matrix_but_the_lookup_by_type() {
        let info = info_of(dense(true));
        let by = multiplied_by_type(&info);
        let names: Vec<&str> = by.iter().map(|(_, n, _)| n.as_str()).collect();
        // q4_K: 2 × (q 256×256 + k 256×128 + up 256×512); q6_K: the output; q8_0: v (the lookup's
        // q8_0 table is not multiplied); the f32 norms are one-dimensional.
        assert_eq!(by[0].2, 2 * (256 * 256 + 256 * 128 + 256 * 512));
        assert_eq!(names, ["q4_K", "q6_K", "q8_0"]);
        assert_eq!(by[1].2, 256 * 1024);
        assert_eq!(by[2].2, 2 * 256 * 128);
        // Tied: the table is the output projection, multiplied whole.
        let tied = multiplied_by_type(&info_of(dense(false)));
        assert!(tied
            .iter()
            .any(|(_, n, p)| n == "q8_0" && *p == 2 * 256 * 128 + 256 * 1024));
    }

    #[test]
    fn a_tied_output_reads_the_whole_embedding_table() {
        let info = info_of(dense(false));
        let all: u64 = info.tensors.iter().map(|t| t.bytes).sum();
        let r = token_reads(
            &info,
            &Candidate::llama_default(2, 0),
            &workload(128, 0),
            false,
        );
        assert_eq!(r.weight_bytes, all);
    }

    #[test]
    fn kv_reads_follow_the_depth_and_the_cache_type() {
        let info = info_of(dense(true));
        let mut c = Candidate::llama_default(2, 0);
        c.type_k = CacheType::Q8_0;
        c.type_v = CacheType::Q4_0;
        let r = token_reads(&info, &c, &workload(8, 1000), false);
        assert_eq!(r.kv_tokens, 1004);
        // Per layer: 128 × 8.5 / 8 + 128 × 4.5 / 8 = 136 + 72 bytes.
        assert_eq!(r.kv_bytes_per_cached_token, 2 * 208);
        assert_eq!(r.kv_bytes, 2 * 208 * 1004);
    }

    #[test]
    fn without_attention_tensors_the_kv_width_comes_from_the_head_counts() {
        let info = info_of(
            GgufBuilder::new("llama")
                .kv_u32("llama.block_count", 3)
                .kv_u32("llama.embedding_length", 512)
                .kv_u32("llama.attention.head_count", 8)
                .kv_u32("llama.attention.head_count_kv", 2)
                .tensor("blk.0.ffn_up.weight", ggml::F16, &[512, 64]),
        );
        let r = token_reads(
            &info,
            &Candidate::llama_default(1, 0),
            &workload(1, 0),
            false,
        );
        // 3 layers × (K + V) × 2 KV heads × 64 dims × 2 bytes.
        assert_eq!(r.kv_bytes_per_cached_token, 3 * 2 * 128 * 2);
    }

    #[test]
    fn a_mixture_of_experts_reads_only_the_used_experts() {
        let moe = GgufBuilder::new("qwen3moe")
            .kv_u32("qwen3moe.block_count", 1)
            .kv_u32("qwen3moe.expert_count", 8)
            .kv_u32("qwen3moe.expert_used_count", 2)
            .tensor("token_embd.weight", ggml::F16, &[64, 32])
            .tensor("blk.0.attn_k.weight", ggml::F16, &[64, 32])
            .tensor("blk.0.attn_v.weight", ggml::F16, &[64, 32])
            .tensor("blk.0.ffn_gate_inp.weight", ggml::F32, &[64, 8])
            .tensor("blk.0.ffn_up_exps.weight", ggml::Q8_0, &[64, 128, 8])
            .tensor("blk.0.ffn_down_exps.weight", ggml::Q8_0, &[128, 64, 8])
            .tensor("output.weight", ggml::F16, &[64, 32]);
        let info = info_of(moe);
        let r = token_reads(
            &info,
            &Candidate::llama_default(2, 0),
            &workload(2, 0),
            false,
        );
        let exps = bytes_of(&info, "blk.0.ffn_up_exps.weight")
            + bytes_of(&info, "blk.0.ffn_down_exps.weight");
        let dense_part = 2 * 64 * 32 * 2 + 64 * 8 * 4 + 64 * 32 * 2;
        assert_eq!(r.weight_bytes, dense_part + exps / 4 + 64 * 2);
        // 4 sequences at once route to 1 - (3/4)^4 = 68% of the experts per step, each token
        // reading a quarter of that: 17% of the experts (4% of the dense part).
        let w4 = Workload {
            n_parallel: 4,
            ..workload(2, 0)
        };
        let four = token_reads(&info, &Candidate::llama_default(2, 0), &w4, false);
        let expected = (exps as f64 * (1.0 - 0.75f64.powi(4)) / 4.0) as u64;
        let got_exps = four.weight_bytes - (dense_part / 4 + 64 * 2);
        assert!(got_exps.abs_diff(expected) <= 2, "{got_exps} vs {expected}");
        assert_eq!(
            r.active_parameters,
            2 * 64 * 32 + 64 * 8 + 64 * 32 + 2 * 64 * 128 * 8 / 4 + 64
        );
    }

    #[test]
    fn offloaded_layers_leave_the_cpu_its_share() {
        let info = info_of(dense(true));
        let w = workload(2, 0);
        let layer: u64 = info
            .tensors
            .iter()
            .filter(|t| t.name.starts_with("blk.1."))
            .map(|t| t.bytes)
            .sum();
        let row = bytes_of(&info, "token_embd.weight") / 1024;
        let output = bytes_of(&info, "output.weight") + bytes_of(&info, "output_norm.weight");
        let cpu_only = token_reads(&info, &Candidate::llama_default(2, 0), &w, true);
        // -ngl 1: the last layer (and its KV) moves to the device.
        let one = token_reads(&info, &Candidate::llama_default(2, 1), &w, true);
        assert_eq!(one.cpu_bytes, cpu_only.cpu_bytes - layer - 512);
        // -ngl 3 (layers + 1): everything but the embedding lookup.
        let all = token_reads(&info, &Candidate::llama_default(2, 3), &w, true);
        assert_eq!(all.cpu_bytes, row);
        // Without an offload device, -ngl means nothing.
        let none = token_reads(&info, &Candidate::llama_default(2, 3), &w, false);
        assert_eq!(none.cpu_bytes, none.weight_bytes + none.kv_bytes);
        assert_eq!(cpu_only.weight_bytes - output - row, 2 * layer);
    }
}
