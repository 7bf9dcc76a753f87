//! `autotune verify MODEL`: a profile's long-context retrieval. Facts placed at 90% of the server's
//! context (a slot's), asked for at its end, answered greedily by the model as the profile runs it
//! (its devices, its K/V cache pair, flash attention, batch sizes); for a quantized cache the same
//! facts with f16 caches too, so a lost fact is pinned on the cache. Exit code 8 when the
//! quantized cache loses a fact the f16 cache retrieves.

use crate::cli::{Cli, VerifyArgs};
use crate::exit::{self, Exit};
use crate::llama::{ContextSettings, ModelSettings};
use crate::quant::retrieval::{self, Retrieved};
use crate::stored;
use search_space::knob;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

/// What `verify` found.
#[derive(Debug, Serialize)]
struct Verification {
    profile: PathBuf,
    /// Tokens of the context each fact was asked in (a slot of the server's).
    context: u32,
    /// Where each fact was placed, as a share of the context.
    depth: f64,
    /// With the profile's caches.
    profile_kv: Retrieved,
    /// With f16 caches, where the profile's are quantized.
    #[serde(skip_serializing_if = "Option::is_none")]
    f16: Option<Retrieved>,
    /// Facts the f16 cache retrieved and the profile's did not.
    lost: usize,
}

pub fn run(cli: &Cli, a: &VerifyArgs) -> anyhow::Result<i32> {
    let stored = stored::resolve(&a.target, a.force, cli.verbose)?;
    let p = &stored.profile;
    let slot = profiles::slot_ctx(p.workload.n_ctx, p.workload.n_parallel);
    let settings = ModelSettings::for_candidate(&p.winner, &p.rpc);
    let context = ContextSettings::for_candidate(&p.winner, slot);
    let stop = crate::term::interrupt_flag()?;
    let stopped = || stop.load(Ordering::Relaxed);
    if !cli.quiet {
        eprintln!(
            "autotune: verify: {} facts, each at {:.0}% of a {slot}-token context, asked for at its end",
            retrieval::facts().len(),
            100.0 * retrieval::DEPTH
        );
    }
    let run = |context: &ContextSettings| {
        retrieval::retrieve(&p.model.path, &settings, context, &stopped).map_err(|e| {
            if stopped() {
                Exit::new(exit::INTERRUPTED, "interrupted")
            } else {
                Exit::new(exit::ERROR, format!("the retrieval check failed: {e}"))
            }
        })
    };
    let profile_kv = run(&context)?;
    let f16 = if p.winner.kv_lossy() {
        // The lossless twin's caches, its environment made anew: no variable the profile's
        // quantized cache set (the rotation turned off) reaches the f16 reference.
        Some(run(&context.with_knobs(|c| *c = knob::lossless_twin(c)))?)
    } else {
        None
    };
    let lost = f16.as_ref().map_or(0, |f| lost(&profile_kv, f));
    let v = Verification {
        profile: stored.path.clone(),
        context: slot,
        depth: retrieval::DEPTH,
        profile_kv,
        f16,
        lost,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{}", render(&v));
    }
    Ok(if v.lost > 0 {
        exit::RETRIEVAL_LOST
    } else {
        exit::OK
    })
}

/// Facts `with` retrieved that `mine` did not.
fn lost(mine: &Retrieved, with: &Retrieved) -> usize {
    let facts = retrieval::facts();
    (facts.iter().enumerate())
        .filter(|(i, f)| {
            let gave = |r: &Retrieved| {
                r.answers
                    .get(*i)
                    .is_some_and(|a| retrieval::gives(a, &f.answer))
            };
            gave(with) && !gave(mine)
        })
        .count()
}

fn render(v: &Verification) -> String {
    let mut s = format!(
        "profile    {}\nretrieval  {} facts, each at {:.0}% of a {}-token context\n",
        v.profile.display(),
        v.profile_kv.asked,
        100.0 * v.depth,
        v.context
    );
    s.push_str(&format!("profile's  {}\n", v.profile_kv.describe()));
    match &v.f16 {
        Some(f) => {
            s.push_str(&format!("f16 cache  {}\n", f.describe()));
            s.push_str(&if v.lost > 0 {
                format!(
                    "verdict    the quantized cache lost {} fact{} the f16 cache retrieves: tune again with a tighter --max-kv-kld, or -ctk f16 for long chats\n",
                    v.lost,
                    if v.lost == 1 { "" } else { "s" }
                )
            } else {
                "verdict    the quantized cache retrieves what the f16 cache retrieves\n".into()
            });
        }
        None if v.profile_kv.found < v.profile_kv.asked => s.push_str(
            "verdict    the cache is f16: what is missed, the model misses at this depth\n",
        ),
        None => s.push_str("verdict    every fact retrieved\n"),
    }
    s
}
