//! The context finding: what a token reads once the context is full. Every cached token adds its K
//! and V to what each generated token reads, so a long chat generates slower than the empty cache
//! it was measured at; the same roofline, with a full slot's KV cache in place of the measured one,
//! says by how much at least (a bound: on the 1B test model on 2 CPU cores the ceiling fell 31% at
//! 8000 cached tokens while generation, its attention compute-bound, fell 77%).

use super::finding::{finding, Finding, Topic};
use crate::explain::{decimal_bytes, RooflineScope, RooflineView};
use profiles::Profile;
use search_space::CacheType;

/// Below this share of a full context's reads the KV cache is not worth a line.
const NEGLIGIBLE: f64 = 0.05;

/// The roofline with a full slot's KV cache: (bytes a token then reads, its ceiling); `None` where
/// the KV cache's growth is not known (sliding windows, compressed caches, recurrent layers) or the
/// ceiling spans two memories.
pub fn at_full_context(profile: &Profile, r: &RooflineView) -> Option<(u64, u64, f64)> {
    let rec = profile.roofline.as_ref()?;
    let ceiling = r.ceiling_tps?;
    if !rec.kv_grows || !matches!(r.scope, RooflineScope::Whole | RooflineScope::Device) {
        return None;
    }
    let w = &profile.workload;
    let full_kv =
        rec.kv_bytes_per_cached_token * u64::from(profiles::slot_ctx(w.n_ctx, w.n_parallel));
    let full = r.bytes_per_token.saturating_sub(r.kv_bytes) + full_kv;
    Some((
        full_kv,
        full,
        ceiling * r.bytes_per_token as f64 / full as f64,
    ))
}

/// The context finding, where the full context's KV cache is known and matters.
pub fn context(profile: &Profile, roofline: Option<&RooflineView>) -> Option<Finding> {
    let r = roofline?;
    let (full_kv, full, at_full) = at_full_context(profile, r)?;
    if (full_kv as f64) < NEGLIGIBLE * full as f64 {
        return None;
    }
    let ceiling = r.ceiling_tps?;
    let w = &profile.workload;
    let slot = profiles::slot_ctx(w.n_ctx, w.n_parallel);
    let per_slot = if w.n_parallel > 1 {
        format!(" (one of {} slots)", w.n_parallel)
    } else {
        String::new()
    };
    let f16 = profile.winner.type_k == CacheType::F16 && profile.winner.type_v == CacheType::F16;
    let lever = if f16 {
        "; a q8_0 KV cache (-ctk q8_0 -ctv q8_0) halves that part"
    } else {
        ""
    };
    Some(finding(
        Topic::Context,
        format!(
            "a full {slot}-token context{per_slot} adds {} of KV cache to the {} a token reads with \
             {} cached: the ceiling falls from {ceiling:.1} to {at_full:.1} t/s ({:+.0}%), so a long \
             chat's last tokens generate at least that much slower (attention's compute can cost \
             more: --depth N measures it){lever}",
            decimal_bytes(full_kv),
            decimal_bytes(r.bytes_per_token),
            r.kv_tokens,
            (at_full / ceiling - 1.0) * 100.0,
        ),
    ))
}
