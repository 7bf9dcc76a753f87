//! The run's report: one `Serialize` value rendered either as a table (stdout) or as JSON (`--json`),
//! and the leaderboard that goes into the profile.

use crate::engine::baseline::BaselinePlacement;
use crate::engine::CandidateResult;
use crate::measuring::Workload;
use crate::stats::{Comparison, Verdict};
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use profiles::{Figures, LeaderboardEntry};
use search_space::size::format_size;
use search_space::Candidate;
use serde::Serialize;
use std::path::PathBuf;

pub mod quality;
pub mod time;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: ModelSummary,
    pub machine: crate::machine::Machine,
    /// GPUs the operating system shows, and the warnings for those no loaded backend drives.
    pub gpus: Vec<crate::gpus::Gpu>,
    pub gpu_warnings: Vec<String>,
    /// The devices the winner runs on (its layers' devices and the CPU).
    pub winner_devices: Vec<String>,
    pub llama: profiles::LlamaBuild,
    pub workload: Workload,
    /// How `--ctx max` chose the workload's context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<crate::engine::context::ContextChoice>,
    pub seed: u64,
    pub noise: f64,
    pub elapsed_s: f64,
    pub budget_s: f64,
    pub interrupted: bool,
    pub budget_spent: bool,
    /// The search's axes the time budget ran out before (each had candidates to measure).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub axes_not_reached: Vec<String>,
    /// The run's time as said once llama.cpp's defaults were measured, before anything else.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_plan: Option<crate::measuring::TimePlan>,
    /// The most each phase could reach here, as probed (what the plan and the skips are judged by).
    pub ceilings: crate::measuring::Ceilings,
    /// The axes not measured: their best case could not beat the best so far beyond the noise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub axes_skipped: Vec<crate::measuring::SkippedAxis>,
    pub measured: usize,
    pub failed: usize,
    /// Candidates whose first repetition was stopped as several times slower than the best.
    pub stopped_early: usize,
    pub reused_repetitions: usize,
    pub leaderboard: Vec<LeaderboardEntry>,
    pub winner: Option<Candidate>,
    pub winner_figures: Option<Figures>,
    /// The quality gate, and every quantized K/V pair held to it.
    pub quality: profiles::QualityRecord,
    pub baseline: Option<Candidate>,
    pub baseline_figures: Option<Figures>,
    /// Where the baseline's placement came from: llama.cpp's defaults, or with a device to offload to
    /// llama.cpp's --fit placement (what llama-server does unasked), or the dry runs' fallback and why.
    pub baseline_placement: BaselinePlacement,
    /// The winner against llama.cpp's defaults by the tuner's decision rule.
    pub versus_defaults: Option<VersusDefaults>,
    /// The winner and runner-up re-measured at the end: relative change of their medians.
    pub confirm_drift: Vec<(String, f64)>,
    /// The finalists measured again at the end on the workload's request (the search's winner
    /// first, its runner-up, llama.cpp's defaults, a lossy winner's lossless twin).
    pub confirmed: Vec<Candidate>,
    /// A lossy finalist beside its lossless twin (every other knob equal), as the confirmation
    /// measured them: the lossy one wins only by being faster beyond the noise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lossless_twin: Option<crate::engine::TwinVerdict>,
    pub profile_path: Option<PathBuf>,
    pub measurement_log: Option<PathBuf>,
    pub notes: Vec<String>,
    /// Other programs' share of the CPUs' time while the run measured (0 to 1; absent where `/proc`
    /// cannot say). Above 15% the notes say the machine was busy.
    pub others_cpu_share: Option<f64>,
    /// Memory per device of every candidate: predicted by the dry run, reported by llama.cpp after
    /// the real load, and measured (device free-memory drop; on the host the worker's private memory
    /// grown plus the model file's pages inference read).
    pub memory: Vec<MemoryRow>,
    /// Where a GPU is driven by several backends: the best placement measured through each.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub backends: Vec<profiles::BackendTrial>,
}

/// The headline's claim: the winner's request rate against llama.cpp's defaults, judged by the same
/// rule that chose it, so the headline never calls a tie a gain.
#[derive(Debug, Clone, Serialize)]
pub struct VersusDefaults {
    /// The winner is llama.cpp's defaults (nothing beat them beyond the noise threshold).
    pub same_configuration: bool,
    /// Winner relative to the defaults (request rate), its 95% interval and the verdict.
    pub comparison: Option<Comparison>,
    /// Why the winner was chosen when it ties with the defaults.
    pub chosen_for: Option<String>,
}

/// The devices a candidate runs on: the CPU, and with GPU layers its pinned devices or every
/// non-CPU device (llama.cpp splits layers over all of them by default).
pub fn devices_of(c: &Candidate, machine: &crate::machine::Machine) -> Vec<String> {
    let mut out = vec!["CPU".to_string()];
    if c.n_gpu_layers > 0 {
        if c.devices.is_empty() {
            out.extend(machine.offload_devices().iter().map(|d| d.name.clone()));
        } else {
            out.extend(c.devices.iter().filter(|d| *d != "CPU").cloned());
        }
    }
    out
}

/// The winner against the defaults (`None` when either was not measured).
pub fn versus_defaults(
    results: &[CandidateResult],
    winner: &Candidate,
    baseline: &Candidate,
    w: &Workload,
    noise: f64,
    seed: u64,
) -> Option<VersusDefaults> {
    let find = |c: &Candidate| results.iter().find(|r| &r.candidate == c && r.ok());
    let (win, base) = (find(winner)?, find(baseline)?);
    if winner == baseline {
        return Some(VersusDefaults {
            same_configuration: true,
            comparison: None,
            chosen_for: None,
        });
    }
    let comparison = win.compare_with(base, w, noise, seed)?;
    let chosen_for = (comparison.verdict == Verdict::Tie).then(|| {
        if win.mem_bytes() < base.mem_bytes() {
            format!(
                "chosen for {} less memory",
                format_size(base.mem_bytes() - win.mem_bytes())
            )
        } else if winner.kv_bytes_factor() < baseline.kv_bytes_factor() {
            "chosen for its smaller KV cache".to_string()
        } else {
            "chosen for its higher median, a difference within the noise".to_string()
        }
    });
    Some(VersusDefaults {
        same_configuration: false,
        comparison: Some(comparison),
        chosen_for,
    })
}

/// The headline's first line: what the decision rule says of the winner against the baseline
/// (`against`: "llama.cpp's defaults", "llama.cpp's --fit placement").
fn versus_line(v: &VersusDefaults, noise: f64, against: &str) -> String {
    let pct = |x: f64| format!("{:+.1}%", 100.0 * x);
    // "llama.cpp's defaults are", "llama.cpp's --fit placement is".
    let plural = against.contains("defaults");
    let Some(c) = &v.comparison else {
        return format!(
            "{against} {} the best measured: nothing beat {} beyond ±{:.0}%",
            if plural { "are" } else { "is" },
            if plural { "them" } else { "it" },
            100.0 * noise
        );
    };
    let interval = format!("95% CI [{}, {}]", pct(c.ci_low), pct(c.ci_high));
    match c.verdict {
        Verdict::Tie => format!(
            "ties with {against} within ±{:.0}% (requests/s {}, {interval}); {}",
            100.0 * noise,
            pct(c.ratio),
            v.chosen_for.as_deref().unwrap_or("chosen by the tie-break")
        ),
        Verdict::Faster => format!(
            "{} requests/s over {against} ({interval}, beyond the ±{:.0}% noise threshold)",
            pct(c.ratio),
            100.0 * noise
        ),
        Verdict::Slower => format!(
            "{} requests/s against {against} ({interval}): slower, chosen among configurations {against} {} not compared with",
            pct(c.ratio),
            if plural { "were" } else { "was" },
        ),
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    pub candidate: Candidate,
    pub loaded: bool,
    pub predicted: Vec<profiles::measurements::DeviceBytes>,
    pub reported: Vec<profiles::measurements::DeviceBytes>,
    pub actual: Vec<profiles::measurements::DeviceBytes>,
}

/// The memory rows of a run's results.
pub fn memory_rows(results: &[CandidateResult]) -> Vec<MemoryRow> {
    results
        .iter()
        .map(|r| MemoryRow {
            candidate: r.candidate.clone(),
            loaded: r.load.is_some() || !r.reps.is_empty(),
            predicted: r
                .predicted
                .as_ref()
                .map(|p| p.per_device.clone())
                .unwrap_or_default(),
            reported: r
                .load
                .as_ref()
                .map(|l| l.per_device.clone())
                .unwrap_or_default(),
            actual: r
                .load
                .as_ref()
                .map(|l| l.actual.clone())
                .unwrap_or_default(),
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    pub path: PathBuf,
    pub architecture: String,
    pub file_type: Option<String>,
    pub layers: Option<u32>,
    pub parameters: u64,
    pub size_bytes: u64,
    pub trained_context: Option<u64>,
    pub experts: Option<u32>,
    pub fingerprint: String,
}

fn ci(v: Option<[f64; 2]>, median: f64) -> String {
    match v {
        Some([lo, hi]) if median > 0.0 => format!("±{:.0}%", 50.0 * (hi - lo) / median),
        _ => String::new(),
    }
}

impl Report {
    /// The human rendering: a header, the leaderboard table and a verdict.
    pub fn render(&self, top: usize) -> String {
        let mut s = self.header();
        s.push_str(&self.table(top).to_string());
        s.push('\n');
        let shown = self.leaderboard.iter().take(top.max(1));
        if shown
            .filter_map(|e| e.figures.as_ref())
            .any(|f| !f.estimated.is_empty())
        {
            s.push_str(
                "(~: not timed for that row, whose group moved only the other phase: the figure of \
                 the configurations it was compared with)\n",
            );
        }
        if self.leaderboard.len() > top {
            s.push_str(&format!(
                "({} more rows in --json and in the profile)\n",
                self.leaderboard.len() - top
            ));
        }
        s.push_str(&self.verdict());
        s
    }

    /// Model, machine and workload, one line each.
    fn header(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "model   {} ({}, {}, {} layers, {})\n",
            self.model.path.display(),
            self.model.architecture,
            self.model.file_type.as_deref().unwrap_or("?"),
            self.model.layers.map_or("?".into(), |l| l.to_string()),
            format_size(self.model.size_bytes)
        ));
        s.push_str(&format!(
            "machine {} ({} cores / {} CPUs, {} RAM), llama.cpp {} [{}{}]\n",
            self.machine.cpu,
            self.machine.physical_cores,
            self.machine.logical_cpus,
            format_size(self.machine.ram_bytes),
            self.llama.version,
            self.llama.backends.join(", "),
            self.llama
                .cpu_variant
                .as_ref()
                .map(|v| format!(", CPU variant {v}"))
                .unwrap_or_default()
        ));
        s.push_str(&format!(
            "workload ctx {} · prompt {} · gen {}{}{} · noise ±{:.0}% · seed {} · {:.0} s\n\n",
            self.workload.n_ctx,
            self.workload.n_prompt,
            self.workload.n_gen,
            if self.workload.depth > 0 {
                format!(" · depth {}", self.workload.depth)
            } else {
                String::new()
            },
            match self.workload.n_parallel {
                0 | 1 => String::new(),
                n => format!(" · {n} requests at once (t/s of all together)"),
            },
            self.noise * 100.0,
            self.seed,
            self.elapsed_s
        ));
        if let Some(c) = &self.context {
            let offload = !self.machine.offload_devices().is_empty();
            s.insert_str(
                s.len() - 1,
                &format!("context --ctx max: {}\n", c.describe(offload)),
            );
        }
        s
    }

    /// The leaderboard's first `top` rows.
    fn table(&self, top: usize) -> Table {
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        let depth = self.workload.depth > 0;
        let mut header = vec!["#", "configuration", "pp t/s", "tg t/s"];
        if depth {
            header.extend(["pp@depth", "tg@depth"]);
        }
        header.extend(["s/request", "memory", "n", "status"]);
        t.set_header(header);
        for e in self.leaderboard.iter().take(top.max(1)) {
            t.add_row(self.row(e, depth));
        }
        t
    }

    /// One leaderboard row: rank, configuration, figures (or blanks and why not).
    fn row(&self, e: &LeaderboardEntry, depth: bool) -> Vec<Cell> {
        let baseline = self.baseline.as_ref();
        let rank = if e.rank == 0 {
            "-".to_string()
        } else if e.tie_with_previous {
            format!("={}", e.rank)
        } else {
            e.rank.to_string()
        };
        let mut label = e.candidate.label();
        if Some(&e.candidate) == baseline {
            label.push_str(&format!("  ({})", self.baseline_placement.tag()));
        }
        let mut row = vec![Cell::new(rank), Cell::new(label)];
        match &e.figures {
            Some(f) => {
                // A phase no repetition of this row timed shows its borrowed figure with a `~`.
                let mark = |phase: &str| match f.estimated.iter().any(|p| p == phase) {
                    true => "~",
                    false => "",
                };
                let (pp, tg) = (mark("prompt"), mark("generation"));
                row.push(
                    Cell::new(format!("{pp}{:.1} {}", f.pp_tps, ci(f.pp_ci, f.pp_tps)))
                        .set_alignment(CellAlignment::Right),
                );
                row.push(
                    Cell::new(format!("{tg}{:.1} {}", f.tg_tps, ci(f.tg_ci, f.tg_tps)))
                        .set_alignment(CellAlignment::Right),
                );
                if depth {
                    for (v, m) in [(f.pp_depth_tps, pp), (f.tg_depth_tps, tg)] {
                        row.push(
                            Cell::new(v.map_or("-".into(), |v| format!("{m}{v:.1}")))
                                .set_alignment(CellAlignment::Right),
                        );
                    }
                }
                row.push(
                    Cell::new(format!("{:.3}", f.score_s)).set_alignment(CellAlignment::Right),
                );
                row.push(Cell::new(if f.mem_bytes > 0 {
                    format_size(f.mem_bytes)
                } else {
                    "-".into()
                }));
                row.push(Cell::new(f.repetitions));
                row.push(Cell::new(if e.status.starts_with("refused") {
                    truncate(&e.status, 70)
                } else if e.tie_with_previous {
                    "tie".into()
                } else {
                    "ok".into()
                }));
            }
            None => {
                let blanks = if depth { 7 } else { 5 };
                for _ in 0..blanks {
                    row.push(Cell::new("-"));
                }
                row.push(Cell::new(truncate(&e.status, 70)));
            }
        }
        row
    }

    /// With a depth, the winner's rates there (what the score counts), beside the defaults' when
    /// the verdict line compares them.
    fn at_depth_line(&self, wf: &Figures) -> String {
        let (Some(pp), Some(tg)) = (wf.pp_depth_tps, wf.tg_depth_tps) else {
            return String::new();
        };
        let d = self.workload.depth;
        let same = (self.versus_defaults.as_ref()).is_some_and(|v| v.same_configuration);
        match self.baseline_figures.as_ref().filter(|_| !same) {
            Some(Figures {
                pp_depth_tps: Some(bpp),
                tg_depth_tps: Some(btg),
                ..
            }) => format!(
                "        at depth {d}: tg {tg:.1} vs {btg:.1} t/s, pp {pp:.1} vs {bpp:.1} t/s\n"
            ),
            _ => format!("        at depth {d}: tg {tg:.1} t/s, pp {pp:.1} t/s\n"),
        }
    }

    /// The winner against the defaults, drift seen when confirming, notes, where the profile went.
    fn verdict(&self) -> String {
        let mut s = String::new();
        if let (Some(w), Some(wf)) = (&self.winner, &self.winner_figures) {
            s.push_str(&format!("\nwinner  {}\n", w.label()));
            if let Some(v) = &self.versus_defaults {
                let against = &self.baseline_placement.label;
                s.push_str(&format!(
                    "        {}\n",
                    versus_line(v, self.noise, against)
                ));
            }
            match &self.baseline_figures {
                Some(bf)
                    if !self
                        .versus_defaults
                        .as_ref()
                        .is_some_and(|v| v.same_configuration) =>
                {
                    s.push_str(&format!(
                        "        tg {:.1} vs {:.1} t/s, pp {:.1} vs {:.1} t/s, {:.3} vs {:.3} s per request (winner vs {}, medians)\n",
                        wf.tg_tps, bf.tg_tps, wf.pp_tps, bf.pp_tps, wf.score_s, bf.score_s,
                        self.baseline_placement.short()
                    ));
                }
                _ => s.push_str(&format!(
                    "        tg {:.1} t/s, pp {:.1} t/s, {:.3} s per request (medians)\n",
                    wf.tg_tps, wf.pp_tps, wf.score_s
                )),
            }
            s.push_str(&self.at_depth_line(wf));
            if let Some(b) = profiles::BackendTrial::summary(&self.backends) {
                s.push_str(&format!("backend {b}\n"));
            }
            for line in quality::lines(&self.quality, w, &self.leaderboard) {
                s.push_str(&format!("quality {line}\n"));
            }
        }
        if let Some(t) = &self.lossless_twin {
            s.push_str(&format!("lossless {}\n", twin_line(t, self.noise)));
        }
        for (label, drift) in &self.confirm_drift {
            if drift.abs() > self.noise {
                s.push_str(&format!("drift   {label} re-measured at the end: {:+.1}% (beyond the ±{:.0}% noise threshold)\n", drift * 100.0, self.noise * 100.0));
            }
        }
        for n in &self.notes {
            s.push_str(&format!("note    {n}\n"));
        }
        if let Some(p) = &self.profile_path {
            s.push_str(&format!("profile {}\n", p.display()));
        }
        s
    }
}

/// A lossy finalist against its lossless twin: by how much it was faster, and which one the run
/// chose.
fn twin_line(t: &crate::engine::TwinVerdict, noise: f64) -> String {
    let by = match t.ratio {
        Some(r) => format!("{:+.1}% requests/s", r * 100.0),
        None => "not compared (too few repetitions)".into(),
    };
    let chose = match t.chose_lossy {
        true => format!(
            "{} won: faster beyond the ±{:.0}% noise",
            t.lossy,
            noise * 100.0
        ),
        false => format!("{} won: a lossy setting no faster loses", t.twin),
    };
    format!("{} vs its lossless twin {}: {by}; {chose}", t.lossy, t.twin)
}

/// `s` cut to `n` characters, with an ellipsis when it was longer (table cells).
pub(crate) fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// Profiles hold one-line strings: llama.cpp's multi-line messages are joined.
pub use crate::term::one_line;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ranking::leaderboard;
    use crate::measuring::{LoadReport, Repetition};

    const W: Workload = Workload {
        n_ctx: 512,
        n_prompt: 64,
        n_gen: 16,
        depth: 0,
        n_parallel: 1,
        name: String::new(),
    };

    /// A measured candidate: one repetition per round at `tg` t/s (pp 10× faster), times `drift[k]`
    /// in round k (the machine's drift, the same for every candidate of that round).
    fn measured(c: Candidate, tg: f64, drift: &[f64], mem: u64) -> CandidateResult {
        let mut r = CandidateResult::new(c);
        for (k, d) in drift.iter().enumerate() {
            r.reps.push(Repetition {
                pp_tps: 10.0 * tg * d,
                tg_tps: tg * d,
                pp_depth_tps: None,
                tg_depth_tps: None,
                load: None,
                timed: search_space::Phases::BOTH,
                screen: None,
            });
            r.rounds.push(Some(k as u64 + 1));
        }
        r.load = Some(LoadReport {
            reported_bytes: mem,
            ..Default::default()
        });
        r
    }

    const DRIFT: [f64; 8] = [1.0, 0.93, 1.06, 0.97, 1.02, 0.9, 1.08, 0.99];

    fn candidates() -> (Candidate, Candidate) {
        let defaults = Candidate::llama_default(2, 0);
        let q8 = Candidate {
            type_k: search_space::CacheType::Q8_0,
            type_v: search_space::CacheType::Q8_0,
            ..defaults.clone()
        };
        (defaults, q8)
    }

    #[test]
    fn a_tie_with_the_defaults_is_called_a_tie_with_its_reason() {
        let (defaults, q8) = candidates();
        // 1% apart, under the 2% threshold; the winner uses 12 MiB less.
        let results = vec![
            measured(defaults.clone(), 43.7, &DRIFT, 100 << 20),
            measured(q8.clone(), 43.7 * 1.01, &DRIFT, 88 << 20),
        ];
        let v = versus_defaults(&results, &q8, &defaults, &W, 0.02, 7).unwrap();
        assert_eq!(v.comparison.unwrap().verdict, Verdict::Tie);
        let line = versus_line(&v, 0.02, "llama.cpp's defaults");
        assert!(
            line.starts_with("ties with llama.cpp's defaults within ±2%"),
            "{line}"
        );
        assert!(line.contains("chosen for 12.0 MiB less memory"), "{line}");
    }

    #[test]
    fn a_gain_over_the_defaults_comes_with_its_interval() {
        let (defaults, q8) = candidates();
        // 10% apart under ±10% drift that hits both alike: the paired rule sees it.
        let results = vec![
            measured(defaults.clone(), 40.0, &DRIFT, 100 << 20),
            measured(q8.clone(), 44.0, &DRIFT, 100 << 20),
        ];
        let v = versus_defaults(&results, &q8, &defaults, &W, 0.02, 7).unwrap();
        let c = v.comparison.unwrap();
        assert_eq!(c.verdict, Verdict::Faster, "{c:?}");
        assert!(v.chosen_for.is_none());
        let line = versus_line(&v, 0.02, "llama.cpp's defaults");
        assert!(
            line.starts_with("+10.0% requests/s over llama.cpp's defaults (95% CI ["),
            "{line}"
        );
        // With a device to offload to the baseline is llama.cpp's fit placement, and says so.
        let line = versus_line(&v, 0.02, "llama.cpp's --fit placement");
        assert!(
            line.starts_with("+10.0% requests/s over llama.cpp's --fit placement (95% CI ["),
            "{line}"
        );
    }

    #[test]
    fn the_defaults_winning_is_said_plainly() {
        let (defaults, _) = candidates();
        let results = vec![measured(defaults.clone(), 40.0, &DRIFT, 1)];
        let v = versus_defaults(&results, &defaults, &defaults, &W, 0.02, 7).unwrap();
        assert!(v.same_configuration);
        assert!(versus_line(&v, 0.02, "llama.cpp's defaults")
            .starts_with("llama.cpp's defaults are the best measured"));
    }

    #[test]
    fn leaderboard_ties_follow_the_paired_rule() {
        let (defaults, q8) = candidates();
        let results = vec![
            measured(defaults, 40.0, &DRIFT, 1),
            measured(q8, 44.0, &DRIFT, 1),
        ];
        let board = leaderboard(&results, &W, 0.02, 7);
        assert_eq!(board[0].candidate.type_k, search_space::CacheType::Q8_0);
        assert!(
            !board[1].tie_with_previous,
            "10% apart with shared drift is not a tie"
        );
    }
}
