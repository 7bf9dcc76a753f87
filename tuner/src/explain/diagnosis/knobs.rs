//! "Which setting mattered": for each knob, the best measured rate with each of its values, the
//! other knobs held at the winner's, and how much the best value gained over the worst.

use super::finding::measured;
use profiles::Profile;
use search_space::knob::{self, Knob, KNOBS};
use search_space::Candidate;
use serde::Serialize;

/// What one knob changed: among candidates that differ only in it, the best and worst value.
#[derive(Debug, Clone, Serialize)]
pub struct KnobEffect {
    pub knob: &'static str,
    /// What the knob does, in one line (the knob table's [`Knob::explain`]).
    pub what: &'static str,
    pub best: String,
    pub best_s: f64,
    pub worst: String,
    pub worst_s: f64,
    /// `worst_s / best_s - 1`: how much slower a request is with the worst value.
    pub slower: f64,
    /// Values of the knob compared.
    pub values: usize,
    /// Whether the compared candidates are the winner and its neighbours along this knob (else
    /// candidates around an earlier best of the search).
    pub around_winner: bool,
    /// The winner's value, when it is not the best one (a tie broken toward less memory or the
    /// simpler configuration).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winner_value: Option<String>,
}

/// A knob's value as explain shows it: `t=2`, `kv=q8_0/q8_0`, `repack` (the knob table's key and
/// value; "default" where the value is llama.cpp's unset one, like no `--device`).
fn shown(knob: &dyn Knob, c: &Candidate) -> String {
    let value = knob.value(c);
    let value = if value.is_empty() {
        "default".into()
    } else {
        value
    };
    match knob.key() {
        "" => value,
        key => format!("{key}={value}"),
    }
}

/// `c` with `knob` at a fixed value: candidates equal after clearing differ only in it.
fn cleared(knob: &dyn Knob, c: &Candidate) -> Candidate {
    let mut c = c.clone();
    knob.reset(&mut c);
    c
}

/// For each knob varied in the run, its best and worst value among candidates that differ only in
/// it: around the winner when the run measured such neighbours, else around the base with the most
/// values measured (coordinate descent varies each knob from the best found so far, so a knob tried
/// before a later change has neighbours of an earlier best, not of the winner). Most effect first.
pub fn knob_effects(profile: &Profile) -> Vec<KnobEffect> {
    let mut out: Vec<KnobEffect> = KNOBS
        .iter()
        .copied()
        // On one node llama.cpp runs every NUMA strategy as off: what differs is noise.
        .filter(|knob| knob.name() != knob::NumaKnob.name() || profile.machine.numa_nodes > 1)
        .filter_map(|knob| {
            let value = |c: &Candidate| shown(knob, c);
            knob_effect(profile, knob, |c| cleared(knob, c), value)
                .or_else(|| match knob.name() {
                    // A grid (or an earlier profile) varies both thread counts together.
                    "threads" => {
                        let key = |c: &Candidate| Candidate {
                            threads: 0,
                            threads_batch: None,
                            ..c.clone()
                        };
                        knob_effect(profile, knob, key, value)
                    }
                    _ => None,
                })
                .map(|(effect, _)| effect)
        })
        .collect();
    out.extend(
        FIT_LEVERS
            .into_iter()
            .filter_map(|(knob, name)| lever_effect(profile, knob, name)),
    );
    out.sort_by(|a, b| b.slower.total_cmp(&a.slower));
    out
}

/// The settings that shrink what a device must hold, so that more layers fit: each is also compared
/// with the GPU layers it lets fit, since the search measures a lever at its most layers. On an H200
/// with half the memory full offload needs, `kv=q4_0/q4_0` at ngl=17 against `kv=f16/f16` at its 15
/// was a 24% faster request; no two candidates there differed in the KV cache alone.
const FIT_LEVERS: [(&dyn Knob, &str); 3] = [
    (&knob::KvCache, "KV cache with the layers it fits"),
    (&knob::Ubatch, "micro-batch with the layers it fits"),
    (&knob::KvOffloadKnob, "KV offload with the layers it fits"),
];

/// A fit lever's effect: candidates that differ in `knob` and the GPU layers, each of the knob's
/// values at its best measured layer count. Only where those counts differ (else the knob alone
/// says the same).
fn lever_effect(profile: &Profile, knob: &dyn Knob, name: &'static str) -> Option<KnobEffect> {
    let key = |c: &Candidate| Candidate {
        n_gpu_layers: 0,
        ..cleared(knob, c)
    };
    let label = |c: &Candidate| format!("{} ngl={}", shown(knob, c), c.n_gpu_layers);
    let (mut effect, [best, worst]) = knob_effect(profile, knob, key, label)?;
    if best == worst {
        return None;
    }
    effect.knob = name;
    Some(effect)
}

/// One measured value of a knob in a group: its value, how it is shown (with the GPU layers when the
/// group varies them too), and the best request time measured with it, at `layers`.
struct Value {
    value: String,
    label: String,
    score_s: f64,
    layers: u32,
}

/// `knob`'s effect among candidates equal under `key` (which clears the knob, and may clear the GPU
/// layers too: each value then counts at its best layer count), each value shown by `label`; with
/// the GPU layers of the best and the worst value.
fn knob_effect(
    profile: &Profile,
    knob: &dyn Knob,
    key: impl Fn(&Candidate) -> Candidate,
    label: impl Fn(&Candidate) -> String,
) -> Option<(KnobEffect, [u32; 2])> {
    let mut groups: Vec<(Candidate, Vec<Value>)> = Vec::new();
    for (e, f) in measured(profile) {
        let key = key(&e.candidate);
        let v = Value {
            value: shown(knob, &e.candidate),
            label: label(&e.candidate),
            score_s: f.score_s,
            layers: e.candidate.n_gpu_layers,
        };
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, vs)) => match vs.iter_mut().find(|x| x.value == v.value) {
                Some(x) if v.score_s < x.score_s => *x = v,
                Some(_) => {}
                None => vs.push(v),
            },
            None => groups.push((key, vec![v])),
        }
    }
    let winner_key = key(&profile.winner);
    let chosen = groups
        .iter()
        .find(|(k, v)| *k == winner_key && v.len() > 1)
        .map(|g| (g, true))
        .or_else(|| {
            groups
                .iter()
                .filter(|(_, v)| v.len() > 1)
                .max_by(|a, b| {
                    a.1.len()
                        .cmp(&b.1.len())
                        .then(best_of(&b.1).total_cmp(&best_of(&a.1)))
                })
                .map(|g| (g, false))
        });
    let ((_, values), around_winner) = chosen?;
    let best = values
        .iter()
        .min_by(|a, b| a.score_s.total_cmp(&b.score_s))
        .expect("two values");
    let worst = values
        .iter()
        .max_by(|a, b| a.score_s.total_cmp(&b.score_s))
        .expect("two values");
    let winner_value = shown(knob, &profile.winner);
    let effect = KnobEffect {
        knob: knob.name(),
        what: knob.explain(),
        best: best.label.clone(),
        best_s: best.score_s,
        worst: worst.label.clone(),
        worst_s: worst.score_s,
        slower: worst.score_s / best.score_s.max(1e-12) - 1.0,
        values: values.len(),
        around_winner,
        winner_value: (around_winner && winner_value != best.value).then_some(winner_value),
    };
    Some((effect, [best.layers, worst.layers]))
}

fn best_of(values: &[Value]) -> f64 {
    values
        .iter()
        .map(|v| v.score_s)
        .fold(f64::INFINITY, f64::min)
}

#[cfg(test)]
mod tests {
    use super::super::{Topic, NOTE};
    use crate::explain::tests::cpu_profile;
    use crate::explain::Explanation;

    /// Every knob the settings finding names says what it does, from the knob table, once: in the
    /// text under its line and in the JSON beside its figures.
    #[test]
    fn each_knob_named_says_what_it_does_once() {
        let e = Explanation::of(&cpu_profile());
        assert!(!e.knob_effects.is_empty());
        let json = serde_json::to_value(&e).unwrap();
        let settings = e.findings.iter().find(|f| f.topic == Topic::Settings);
        let details = &settings.unwrap().details;
        for (i, k) in e.knob_effects.iter().enumerate() {
            let row = search_space::knob::by_name(k.knob).unwrap();
            assert_eq!(k.what, row.explain());
            assert_eq!(json["knob_effects"][i]["what"], row.explain());
            let note = format!("{NOTE}{}", row.explain());
            assert_eq!(
                details.iter().filter(|d| **d == note).count(),
                1,
                "{details:?}"
            );
            let line = details.iter().position(|d| d.starts_with(k.knob)).unwrap();
            assert_eq!(details[line + 1], note, "{details:?}");
        }
    }
}
