//! The joint choice of a quantization and its configuration: per rung of the ladder its quality and
//! its tuned speed, the rule that picks one, and the report (`Serialize`, rendered as a table or
//! `--json`). Pure data and arithmetic, so the rule is unit-tested without llama.cpp.
//!
//! The rule: among rungs whose weights pass the gate (and tuned with only the KV types that pass
//! it), the lowest modelled seconds per request wins. Two rungs the decision rule calls tied (their
//! winners' repetitions, unpaired) are a tie, above or below the best's median, and a tie goes to
//! the lower KL divergence: the same speed for better quality.

use super::ladder::{Ladder, Rejected};
use super::quality::{fmt_kld, QualityTable};
use crate::report::truncate;
use crate::stats::{self, RoundRate, Verdict};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use profiles::Figures;
use search_space::size::format_size;
use search_space::Candidate;
use serde::Serialize;
use std::path::PathBuf;

/// Where a configuration keeps the model's layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    /// e.g. `CPU`, `CUDA0 (all 27 layers)`, `CUDA0 19/27 layers + CPU`.
    pub text: String,
    /// Part of the model runs on the CPU, part on another device: the model did not fit there whole.
    pub spills: bool,
}

/// Where `c` puts a model of `layers` layers, given the offload devices of the machine.
pub fn placement(c: &Candidate, layers: Option<u32>, offload_devices: &[String]) -> Placement {
    if offload_devices.is_empty() {
        return Placement {
            text: "CPU".into(),
            spills: false,
        };
    }
    let devs = if c.devices.is_empty() {
        offload_devices.join("+")
    } else {
        c.devices.join("+")
    };
    let total = layers.map(|l| l + 1);
    match total {
        // Chosen for speed, not forced by memory: running on the CPU is not spilling.
        _ if c.n_gpu_layers == 0 => Placement {
            text: "CPU (no layers offloaded)".into(),
            spills: false,
        },
        Some(t) if c.n_gpu_layers >= t => Placement {
            text: format!("{devs} (all {t} layers)"),
            spills: false,
        },
        Some(t) => Placement {
            text: format!("{devs} {}/{t} layers + CPU", c.n_gpu_layers),
            spills: true,
        },
        None => Placement {
            text: format!("{devs} ({} layers)", c.n_gpu_layers),
            spills: false,
        },
    }
}

/// One rung of the ladder in the joint choice.
#[derive(Debug, Clone, Serialize)]
pub struct QuantRow {
    pub file_type: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub bpw: f64,
    /// Mean KL divergence from the reference (weights, f16 KV cache) and top-1 agreement.
    pub kld: Option<f64>,
    pub top1: Option<f64>,
    /// The tuned winner's mean KL divergence from the reference as it will run: its weights with
    /// its quantized KV cache (the tune's gate measured the pair against the reference), else the
    /// weights' own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_kld: Option<f64>,
    pub passes_gate: bool,
    /// The tuned winner of this rung and its figures, when it was tuned and measured.
    pub winner: Option<Candidate>,
    pub figures: Option<Figures>,
    pub placement: Option<Placement>,
    /// `chosen`, `N% slower`, `tie, more drift`, `over the quality gate`, `not measured: …`.
    pub status: String,
    /// The winner's requests a second, one per repetition that timed the whole request: what the
    /// decision rule compares rungs on (unpaired: each rung was tuned in a run of its own).
    #[serde(skip)]
    pub rates: Vec<f64>,
}

impl QuantRow {
    pub fn score(&self) -> Option<f64> {
        self.figures.as_ref().map(|f| f.score_s)
    }

    /// What a tie between rungs is decided on: the drift of what will run, else the weights'.
    pub fn drift(&self) -> f64 {
        self.total_kld.or(self.kld).unwrap_or(f64::INFINITY)
    }

    /// Whether this rung ties with `best` (or beats it) by the decision rule ([`stats::decide`]:
    /// the interval of their difference within ±`noise`), above or below its median; where
    /// either has fewer than two repetitions, by their scores (within `noise` of the best's).
    pub fn ties_with(&self, best: &QuantRow, noise: f64) -> bool {
        let rates = |r: &QuantRow| -> Vec<RoundRate> {
            (r.rates.iter())
                .map(|&rate| RoundRate { round: None, rate })
                .collect()
        };
        match stats::decide(&rates(self), &rates(best), noise, 0) {
            Some(c) => c.verdict != Verdict::Slower,
            None => (self.score().zip(best.score())).is_some_and(|(s, b)| s <= b * (1.0 + noise)),
        }
    }
}

/// Index of the chosen rung: the fastest measured rung that passes the gate; a tie with it
/// ([`QuantRow::ties_with`]) goes to the lower KL divergence of what will run (the weights with
/// the winner's cache: a Q6_K with a q4_0 cache can drift more than a Q5_K_M with f16), then the
/// smaller file.
pub fn choose(rows: &[QuantRow], noise: f64) -> Option<usize> {
    let measured: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].passes_gate && rows[i].score().is_some())
        .collect();
    let best = measured.iter().copied().min_by(|&a, &b| {
        rows[a]
            .score()
            .unwrap()
            .total_cmp(&rows[b].score().unwrap())
    })?;
    measured
        .into_iter()
        .filter(|&i| i == best || rows[i].ties_with(&rows[best], noise))
        .min_by(|&a, &b| {
            let (ka, kb) = (rows[a].drift(), rows[b].drift());
            ka.total_cmp(&kb)
                .then(rows[a].size_bytes.cmp(&rows[b].size_bytes))
        })
}

/// "A smaller quant that fits beats a larger one that spills", for every such pair.
pub fn spill_notes(rows: &[QuantRow], chosen: usize) -> Vec<String> {
    let w = &rows[chosen];
    let (Some(wp), Some(ws)) = (&w.placement, w.score()) else {
        return Vec::new();
    };
    if wp.spills {
        return Vec::new();
    }
    rows.iter()
        .filter(|r| r.size_bytes > w.size_bytes && r.placement.as_ref().is_some_and(|p| p.spills))
        .filter_map(|r| {
            let s = r.score()?;
            (s > ws).then(|| {
                format!(
                    "{} ({}) fits ({}) and beats {} ({}), which spills ({}), {:.2}x faster per request: \
                     a smaller quant that fits beats a larger one that spills",
                    w.file_type,
                    format_size(w.size_bytes),
                    wp.text,
                    r.file_type,
                    format_size(r.size_bytes),
                    r.placement.as_ref().map(|p| p.text.as_str()).unwrap_or("?"),
                    s / ws
                )
            })
        })
        .collect()
}

/// The joint run's report.
#[derive(Debug, Clone, Serialize)]
pub struct JointReport {
    pub model: PathBuf,
    pub reference: PathBuf,
    pub reference_type: String,
    /// The gate, nats per token.
    pub max_kld: f64,
    pub considered: Vec<PathBuf>,
    pub left_out: Vec<Rejected>,
    pub quality: QualityTable,
    /// How each quantization's KV cache was held to quality: the tune's gate, with its own weights.
    pub kv_gate: String,
    pub quants: Vec<QuantRow>,
    /// Index into `quants` of the choice.
    pub chosen: Option<usize>,
    pub notes: Vec<String>,
    pub profile_path: Option<PathBuf>,
}

impl JointReport {
    pub fn new(ladder: &Ladder, quality: QualityTable, max_kld: f64) -> Self {
        JointReport {
            model: ladder.model.clone(),
            reference: quality.reference.clone(),
            reference_type: quality.reference_type.clone(),
            max_kld,
            considered: ladder.rungs.iter().map(|r| r.path.clone()).collect(),
            left_out: ladder.rejected.clone(),
            kv_gate: String::new(),
            quality,
            quants: Vec::new(),
            chosen: None,
            notes: Vec::new(),
            profile_path: None,
        }
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "model     {}\nreference {} ({}) · gate --max-kld {} nats/token (weights)\n",
            self.model.display(),
            self.reference.display(),
            self.reference_type,
            self.max_kld
        );
        for r in &self.left_out {
            s.push_str(&format!("left out  {}: {}\n", r.path.display(), r.reason));
        }
        s.push_str(&format!("KV cache  {}\n\n", self.kv_gate));
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header([
            "quant",
            "size",
            "fits where",
            "pp t/s",
            "tg t/s",
            "s/request",
            "KLD",
            "top-1",
            "status",
        ]);
        let right = |s: String| Cell::new(s).set_alignment(CellAlignment::Right);
        for (i, r) in self.quants.iter().enumerate() {
            let mark = if Some(i) == self.chosen { "▶ " } else { "" };
            let f = r.figures.as_ref();
            t.add_row(vec![
                Cell::new(format!("{mark}{}", r.file_type)),
                right(format_size(r.size_bytes)),
                Cell::new(r.placement.as_ref().map_or("-".into(), |p| p.text.clone())),
                right(f.map_or("-".into(), |f| format!("{:.1}", f.pp_tps))),
                right(f.map_or("-".into(), |f| format!("{:.1}", f.tg_tps))),
                right(f.map_or("-".into(), |f| format!("{:.3}", f.score_s))),
                right(r.kld.map_or("-".into(), fmt_kld)),
                right(r.top1.map_or("-".into(), |t| format!("{:.1}%", t * 100.0))),
                Cell::new(truncate(&r.status, 60)),
            ]);
        }
        s.push_str(&t.to_string());
        s.push('\n');
        if let Some(c) = self.chosen.map(|i| &self.quants[i]) {
            s.push_str(&format!(
                "\nchosen    {} ({}) {}\n",
                c.file_type,
                c.path.display(),
                c.winner.as_ref().map(|w| w.label()).unwrap_or_default()
            ));
        }
        for n in &self.notes {
            s.push_str(&format!("note      {n}\n"));
        }
        if let Some(p) = &self.profile_path {
            s.push_str(&format!("profile   {}\n", p.display()));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: &str, size: u64, kld: f64, score: Option<f64>, spills: bool) -> QuantRow {
        QuantRow {
            file_type: t.into(),
            path: PathBuf::from(format!("{t}.gguf")),
            size_bytes: size,
            bpw: 0.0,
            kld: Some(kld),
            top1: Some(0.9),
            total_kld: None,
            passes_gate: kld <= 0.05,
            winner: None,
            figures: score.map(|s| Figures {
                pp_tps: 1.0,
                tg_tps: 1.0,
                pp_depth_tps: None,
                tg_depth_tps: None,
                ttft_ms: None,
                score_s: s,
                mem_bytes: 0,
                pp_ci: None,
                tg_ci: None,
                repetitions: 3,
                estimated: Vec::new(),
            }),
            placement: Some(Placement {
                text: if spills {
                    "GPU0 10/27 layers + CPU".into()
                } else {
                    "GPU0 (all 27 layers)".into()
                },
                spills,
            }),
            status: String::new(),
            rates: Vec::new(),
        }
    }

    #[test]
    fn fastest_under_the_gate_wins_and_ties_go_to_quality() {
        let rows = vec![
            row("F16", 500, 0.0, Some(2.0), true),
            row("Q8_0", 260, 0.001, Some(1.0), false),
            row("Q4_0", 150, 0.2, Some(0.5), false),
        ];
        assert_eq!(
            choose(&rows, 0.02),
            Some(1),
            "Q4_0 is faster but over the gate"
        );
        let rows = vec![
            row("Q8_0", 260, 0.001, Some(1.01), false),
            row("Q4_K_M", 160, 0.03, Some(1.0), false),
        ];
        assert_eq!(
            choose(&rows, 0.02),
            Some(0),
            "within the noise: the better quality wins"
        );
        assert_eq!(
            choose(&[row("Q4_0", 1, 0.2, Some(1.0), false)], 0.02),
            None,
            "nothing passes"
        );
    }

    #[test]
    fn a_tie_goes_to_the_rung_that_drifts_less_as_it_will_run() {
        // The larger file's weights drift less, but its winner runs a q4_0 cache that drifts
        // more in all than the smaller file with f16.
        let mut q6 = row("Q6_K", 200, 0.004, Some(1.0), false);
        q6.total_kld = Some(0.03);
        let mut q5 = row("Q5_K_M", 170, 0.01, Some(1.01), false);
        q5.total_kld = Some(0.01);
        assert_eq!(choose(&[q6.clone(), q5.clone()], 0.02), Some(1));
        // Without the cache's figures, the weights' drift decides as before.
        q6.total_kld = None;
        assert_eq!(choose(&[q6, q5], 0.02), Some(0));
    }

    #[test]
    fn rungs_tie_by_the_decision_rule_on_their_repetitions_not_by_their_points() {
        // Q6_K's median is 3% faster, but its repetitions spread 10%: the interval of the
        // difference reaches inside the noise, a tie, which goes to the drift.
        let mut q6 = row("Q6_K", 200, 0.004, Some(1.0), false);
        q6.total_kld = Some(0.03);
        q6.rates = vec![1.0, 1.1, 0.95, 1.05, 0.97];
        let mut q5 = row("Q5_K_M", 170, 0.01, Some(1.03), false);
        q5.total_kld = Some(0.01);
        q5.rates = vec![0.97, 1.02, 0.93, 0.99, 0.96];
        assert_eq!(choose(&[q6.clone(), q5.clone()], 0.02), Some(1));
        // Tight repetitions 3% apart: Q6_K is faster beyond the noise, and wins.
        q6.rates = vec![1.0, 1.001, 0.999, 1.0005, 0.9995];
        q5.rates = vec![0.97, 0.971, 0.969, 0.9705, 0.9695];
        assert_eq!(choose(&[q6.clone(), q5.clone()], 0.02), Some(0));
        // Tight and 1% apart: a tie, to the less drift, though the points say Q6_K.
        q5.rates = vec![0.99, 0.991, 0.989, 0.9905, 0.9895];
        q5.figures.as_mut().unwrap().score_s = 1.01;
        assert_eq!(choose(&[q6, q5], 0.02), Some(1));
    }

    #[test]
    fn says_when_a_smaller_quant_that_fits_beats_a_larger_one_that_spills() {
        let rows = vec![
            row("F16", 500, 0.0, Some(2.0), true),
            row("Q8_0", 260, 0.001, Some(1.0), false),
        ];
        let notes = spill_notes(&rows, 1);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("a smaller quant that fits beats a larger one that spills"),
            "{}",
            notes[0]
        );
        assert!(spill_notes(&rows, 0).is_empty());
    }

    #[test]
    fn placements() {
        let mut c = Candidate::llama_default(4, 28);
        assert_eq!(placement(&c, Some(27), &[]).text, "CPU");
        assert!(!placement(&c, Some(27), &["CUDA0".into()]).spills);
        c.n_gpu_layers = 0;
        assert!(
            !placement(&c, Some(27), &["CUDA0".into()]).spills,
            "the CPU chosen for speed is not a spill"
        );
        c.n_gpu_layers = 10;
        let p = placement(&c, Some(27), &["CUDA0".into()]);
        assert!(p.spills && p.text.contains("10/28"), "{}", p.text);
    }
}
