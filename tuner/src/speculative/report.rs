//! The speculative-decoding report: what `autotune draft` prints (a table, or the same report as
//! `--json`), and the sentence a profile keeps when no draft pays.

use super::prompts::Prompt;
use super::search::{DraftEntry, Outcome, Trial, Winner};
use super::serve::Fault;
use super::verify::{SameOutput, NEAR_TIE_NATS};
use super::Grid;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Table};
use search_space::size::format_size;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize)]
pub struct PromptRef {
    pub name: String,
    pub kind: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpeculationReport {
    pub target: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_type: Option<String>,
    /// The target's memory (dry run), which the draft's adds to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_mem_bytes: Option<u64>,
    pub threads: u32,
    pub n_ctx: u32,
    /// Requests generated at once (`-np`): the prompts in groups of this many, rates of all together.
    #[serde(
        default = "profiles::serde_one::one",
        skip_serializing_if = "profiles::serde_one::is_one"
    )]
    pub n_parallel: u32,
    /// Tokens generated per prompt.
    pub n_gen: u32,
    pub prompts: Vec<PromptRef>,
    pub grid: Grid,
    pub seed: u64,
    pub noise: f64,
    /// The target alone: its passes during the search.
    pub baseline: Option<Trial>,
    /// The target alone in the final, interleaved comparison.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub confirm_baseline_tg_tps: Vec<f64>,
    pub drafts: Vec<DraftEntry>,
    pub winner: Option<Winner>,
    /// One sentence: which draft pays and by how much, or why none does.
    pub conclusion: String,
    pub budget_spent: bool,
    pub interrupted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm_error: Option<String>,
    pub elapsed_s: f64,
    pub llama_version: String,
    /// A flip between two tokens whose logits are closer than this (nats) is rounding, not a
    /// different output ([`super::verify`]).
    pub near_tie_nats: f32,
    /// Whether the target has MTP heads (`draft-mtp`), and what was done about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<super::mtp::MtpStatus>,
    /// Set only by the tests: the draft loop ran with a deliberate bug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
}

impl SpeculationReport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        target: &Path,
        target_type: Option<String>,
        target_mem_bytes: Option<u64>,
        context: &crate::llama::ContextSettings,
        n_gen: u32,
        prompts: &[Prompt],
        grid: &Grid,
        seed: u64,
        noise: f64,
        drafts: Vec<DraftEntry>,
        outcome: Option<Outcome>,
        elapsed_s: f64,
        llama_version: String,
    ) -> SpeculationReport {
        let (baseline, confirm, winner, budget_spent, interrupted, confirm_error) = match outcome {
            Some(o) => (
                Some(o.baseline),
                o.confirm_baseline,
                o.winner,
                o.budget_spent,
                o.interrupted,
                o.confirm_error,
            ),
            None => (None, Vec::new(), None, false, false, None),
        };
        let mut r = SpeculationReport {
            target: target.to_path_buf(),
            target_type,
            target_mem_bytes,
            threads: context.threads,
            n_ctx: context.n_ctx,
            n_parallel: context.sequences.max(1),
            n_gen,
            prompts: prompts
                .iter()
                .map(|p| PromptRef {
                    name: p.name.clone(),
                    kind: p.kind.clone(),
                })
                .collect(),
            grid: grid.clone(),
            seed,
            noise,
            baseline,
            confirm_baseline_tg_tps: confirm,
            drafts,
            winner,
            conclusion: String::new(),
            budget_spent,
            interrupted,
            confirm_error,
            elapsed_s,
            llama_version,
            near_tie_nats: NEAR_TIE_NATS,
            mtp: None,
            fault: None,
        };
        r.conclusion = r.conclude();
        r
    }

    /// A kind's generation speed over the target alone's on the same prompts (first passes).
    pub fn kind_speedup(&self, kind: &str, tg_tps: f64) -> Option<f64> {
        let base = self
            .baseline
            .as_ref()?
            .per_kind
            .iter()
            .find(|k| k.kind == kind)?;
        (base.tg_tps > 0.0).then(|| tg_tps / base.tg_tps)
    }

    fn baseline_tg(&self) -> Option<f64> {
        self.baseline.as_ref().and_then(Trial::median_tg)
    }

    /// The best measured draft setting: (draft, trial). The finalists of the interleaved comparison
    /// come first (the best paired ratio): their figures are the repeated ones, where another
    /// setting's median may rest on one pass.
    pub fn best_trial(&self) -> Option<(&DraftEntry, &Trial)> {
        let measured = || {
            self.drafts
                .iter()
                .flat_map(|d| d.trials.iter().filter(|t| t.ok()).map(move |t| (d, t)))
        };
        measured()
            .filter_map(|(d, t)| t.versus_baseline.as_ref().map(|c| (c.ratio, d, t)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, d, t)| (d, t))
            .or_else(|| {
                measured().max_by(|a, b| {
                    a.1.median_tg()
                        .unwrap_or(0.0)
                        .total_cmp(&b.1.median_tg().unwrap_or(0.0))
                })
            })
    }

    /// The report's one-sentence conclusion: which draft pays, or why none does.
    fn conclude(&self) -> String {
        if let Some(w) = &self.winner {
            return format!(
                "speculative decoding pays: {} ({}) generates {:.1} t/s against {:.1} t/s for the target alone \
                 ({:+.0}%, 95% CI [{:+.0}%, {:+.0}%]), acceptance {:.0}%, {:.2} tokens per target decode",
                name(&w.draft),
                w.label(),
                w.tg.median,
                w.baseline_tg.median,
                w.comparison.ratio * 100.0,
                w.comparison.ci_low * 100.0,
                w.comparison.ci_high * 100.0,
                w.acceptance * 100.0,
                w.tokens_per_round
            );
        }
        if self.drafts.is_empty() {
            return "no draft model to try: pass --draft FILE (a smaller model of the same family), or put one beside the target".into();
        }
        let Some(base) = self.baseline_tg() else {
            return format!("no draft could be measured ({})", self.draft_statuses());
        };
        match self.best_trial() {
            Some((d, t)) => self.why_none_pays(d, t, base),
            None => format!(
                "no draft was measured ({}); the target alone runs {base:.1} t/s",
                self.draft_statuses()
            ),
        }
    }

    /// Each draft's status, "name: status; ...".
    fn draft_statuses(&self) -> String {
        let reasons: Vec<String> = self
            .drafts
            .iter()
            .map(|d| format!("{}: {}", name(&d.path), d.status))
            .collect();
        reasons.join("; ")
    }

    /// The conclusion when no draft won: the best trial against the target alone (`base` t/s), and
    /// why it was not chosen.
    fn why_none_pays(&self, d: &DraftEntry, t: &Trial, base: f64) -> String {
        let tg = t.median_tg().unwrap_or(0.0);
        let why = self.shortfall(t, tg, base);
        let best = if t.versus_baseline.is_some() {
            "the best in the interleaved comparison"
        } else {
            "the best"
        };
        format!(
            "no draft pays: {best}, {} ({}{}), generated {:.1} t/s against {:.1} t/s for the target alone ({why}); \
             acceptance {:.0}%, {:.2} tokens per target decode",
            name(&d.path),
            t.label(),
            t.placement
                .map(|p| format!(", {}", p.label()))
                .unwrap_or_default(),
            tg,
            base,
            t.acceptance * 100.0,
            t.tokens_per_round
        )
    }

    /// Why the best trial (`tg` t/s against `base`) is not the winner: its output differed, it is
    /// within the noise, it is slower, or it was measured in one pass only.
    fn shortfall(&self, t: &Trial, tg: f64, base: f64) -> String {
        match &t.versus_baseline {
            Some(c) if c.verdict == crate::stats::Verdict::Faster => format!(
                "{:+.1}%, 95% CI [{:+.1}%, {:+.1}%], but its output differed from the target alone's{}",
                c.ratio * 100.0,
                c.ci_low * 100.0,
                c.ci_high * 100.0,
                t.output
                    .divergence
                    .as_ref()
                    .map(|d| format!(" ({} token {}: {})", d.prompt, d.token, d.reason))
                    .unwrap_or_default()
            ),
            Some(c) if c.ratio > 0.0 => format!(
                "not faster beyond the noise threshold ({:+.1}%, 95% CI [{:+.1}%, {:+.1}%])",
                c.ratio * 100.0,
                c.ci_low * 100.0,
                c.ci_high * 100.0
            ),
            Some(c) => format!(
                "{:+.1}%, 95% CI [{:+.1}%, {:+.1}%] in interleaved rounds",
                c.ratio * 100.0,
                c.ci_low * 100.0,
                c.ci_high * 100.0
            ),
            None => match &self.confirm_error {
                Some(e) => format!("{:+.0}% in one pass; {e}", (tg / base - 1.0) * 100.0),
                None => format!("{:+.0}% in one pass", (tg / base - 1.0) * 100.0),
            },
        }
    }

    /// The table `autotune draft` prints: what was run, the drafts, one row per trial, what the
    /// best trial does per prompt kind, notes, and the conclusion.
    pub fn render(&self) -> String {
        let mut out = String::new();
        self.render_setup(&mut out);
        self.render_drafts(&mut out);
        self.render_trials(&mut out);
        self.render_kinds(&mut out);
        self.render_output_notes(&mut out);
        self.render_run_notes(&mut out);
        out.push_str(&format!("result  {}\n", self.conclusion));
        out
    }

    /// The target, the prompts and settings, and the target alone's speed.
    fn render_setup(&self, out: &mut String) {
        out.push_str(&format!(
            "target  {} ({}){}\n",
            self.target.display(),
            self.target_type.as_deref().unwrap_or("?"),
            self.target_mem_bytes
                .map(|b| format!(", {}", format_size(b)))
                .unwrap_or_default()
        ));
        let kinds: Vec<&str> = {
            let mut k: Vec<&str> = self.prompts.iter().map(|p| p.kind.as_str()).collect();
            k.dedup();
            k
        };
        let together = match self.n_parallel {
            1 => String::new(),
            n => format!("; {n} requests at once (t/s of all together)"),
        };
        out.push_str(&format!(
            "prompts {} ({}), {} tokens each, greedy; {} threads, context {}{together}; seed {}\n",
            self.prompts.len(),
            kinds.join(", "),
            self.n_gen,
            self.threads,
            self.n_ctx,
            self.seed
        ));
        if let Some(b) = self.baseline_tg() {
            out.push_str(&format!(
                "alone   {b:.1} t/s generation (the target without a draft, same prompts)\n"
            ));
        }
    }

    /// One line per draft model (or n-gram drafter) and what became of it.
    fn render_drafts(&self, out: &mut String) {
        for d in &self.drafts {
            if d.is_ngram() {
                out.push_str(&format!(
                    "ngram   {} (no draft model: drafts by looking up the text so far): {}\n",
                    d.spec_type, d.status
                ));
                continue;
            }
            if d.is_mtp() {
                out.push_str(&format!(
                    "mtp     {} (no draft model: the target's own MTP heads draft): {}\n",
                    d.spec_type, d.status
                ));
                continue;
            }
            out.push_str(&format!(
                "draft   {} ({}, {}{}): {}\n",
                name(&d.path),
                d.file_type.as_deref().unwrap_or("?"),
                format_size(d.size_bytes),
                d.mem_bytes
                    .map(|m| format!(", {} in memory", format_size(m)))
                    .unwrap_or_default(),
                d.status
            ));
        }
    }

    /// The table of trials, when any was run.
    fn render_trials(&self, out: &mut String) {
        let base = self.baseline_tg();
        let rows: Vec<(&DraftEntry, &Trial)> = self
            .drafts
            .iter()
            .flat_map(|d| d.trials.iter().map(move |t| (d, t)))
            .collect();
        if rows.is_empty() {
            return;
        }
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header([
            "draft",
            "n_max",
            "n_min",
            "p_min",
            "placement",
            "accepted",
            "tok/decode",
            "tg t/s",
            "passes",
            "vs alone",
            "same output",
            "status",
        ]);
        for (d, trial) in rows {
            t.add_row(self.trial_row(d, trial, base));
        }
        out.push_str(&format!("{t}\n"));
    }

    /// The best trial's acceptance and speed-up per prompt kind.
    fn render_kinds(&self, out: &mut String) {
        let Some((d, t)) = self.best_trial() else {
            return;
        };
        let kinds: Vec<String> = t
            .per_kind
            .iter()
            .map(|k| {
                format!("{} {:.0}%", k.kind, k.acceptance * 100.0)
                    + &self
                        .kind_speedup(&k.kind, k.tg_tps)
                        .map(|x| format!(" x{x:.2}"))
                        .unwrap_or_default()
            })
            .collect();
        if !kinds.is_empty() && self.n_parallel > 1 {
            out.push_str(&format!(
                "acceptance by kind ({} {}; speed is of the {} requests together, not by kind): {}\n",
                name(&d.path),
                t.label(),
                self.n_parallel,
                kinds.join(", ")
            ));
        } else if !kinds.is_empty() {
            out.push_str(&format!(
                "acceptance and speed-up against the target alone by kind ({} {}, median of the final rounds where measured there): {}\n",
                name(&d.path),
                t.label(),
                kinds.join(", ")
            ));
        }
    }

    /// What the "same output" column means where it is not a plain "yes".
    fn render_output_notes(&self, out: &mut String) {
        let checked = || {
            self.drafts
                .iter()
                .flat_map(|d| &d.trials)
                .filter(|t| t.ok())
        };
        let near_ties: Vec<&Trial> = checked()
            .filter(|t| t.output.same_output == SameOutput::NearTies)
            .collect();
        if !near_ties.is_empty() {
            let margin = near_ties
                .iter()
                .map(|t| t.output.max_near_tie_margin())
                .fold(0.0, f32::max);
            out.push_str(&format!(
                "note    'yes, N near-ties': the same output up to N tokens where the target, checking the draft in one \
                 batch, picked another of its nearly tied best tokens than it picks alone: the gap between the two \
                 tokens' logits moved by less than {NEAR_TIE_NATS} nats between the paths (here at most {margin:.2}), \
                 as llama.cpp's batched and one-token kernels round differently. Every other token is the target \
                 alone's choice after the same text\n"
            ));
        }
        if let Some((d, t)) = self
            .drafts
            .iter()
            .flat_map(|d| d.trials.iter().map(move |t| (d, t)))
            .find(|(_, t)| t.ok() && t.output.differs())
        {
            let at = t
                .output
                .divergence
                .as_ref()
                .map(|v| {
                    format!(
                        " (first: {}, prompt {} token {}: {})",
                        name(&d.path),
                        v.prompt,
                        v.token,
                        v.reason
                    )
                })
                .unwrap_or_default();
            out.push_str(&format!(
                "note    'same output: NO': with the draft the target chose a token it does not choose alone after the \
                 same text, beyond a near tie{at}: the draft loop is wrong (rollback, positions, KV cache), so the \
                 setting is never chosen\n"
            ));
        }
    }

    /// Notes on the run itself: MTP heads, an injected fault, the budget, a failed confirmation.
    fn render_run_notes(&self, out: &mut String) {
        if let Some(m) = &self.mtp {
            out.push_str(&format!("mtp     {}\n", m.note));
        }
        if let Some(f) = self.fault {
            out.push_str(&format!(
                "note    test fault {} injected (AUTOTUNE_SPECULATIVE_FAULT): the draft loop is broken on purpose\n",
                f.name()
            ));
        }
        if self.budget_spent {
            out.push_str("note    the time budget ran out before every setting was measured; raise --draft-budget\n");
        }
        if let Some(e) = &self.confirm_error {
            out.push_str(&format!("note    {e}\n"));
        }
    }

    /// One row of the table: a trial's settings and figures against the target alone.
    fn trial_row(&self, d: &DraftEntry, trial: &Trial, base: Option<f64>) -> Vec<Cell> {
        let tg = trial.median_tg();
        let vs = match (&trial.versus_baseline, tg, base) {
            (Some(c), _, _) => format!(
                "{:+.0}% [{:+.0}, {:+.0}]",
                c.ratio * 100.0,
                c.ci_low * 100.0,
                c.ci_high * 100.0
            ),
            (None, Some(tg), Some(b)) if b > 0.0 => {
                format!("{:+.0}%", (tg / b - 1.0) * 100.0)
            }
            _ => "-".into(),
        };
        let status = match (&trial.failure, &trial.skipped) {
            (Some(f), _) => format!("failed: {f}"),
            (None, Some(s)) => format!("skipped: {s}"),
            _ if self.winner.as_ref().is_some_and(|w| w.is(d, trial)) => "winner".into(),
            _ => "ok".into(),
        };
        let measured = trial.ok();
        let row: Vec<Cell> = vec![Cell::new(name(&d.path))]
            .into_iter()
            .chain(settings_cells(trial))
            .chain([
                Cell::new(if measured {
                    format!("{:.0}%", trial.acceptance * 100.0)
                } else {
                    "-".into()
                }),
                Cell::new(if measured {
                    format!("{:.2}", trial.tokens_per_round)
                } else {
                    "-".into()
                }),
                Cell::new(tg.map_or("-".into(), |v| format!("{v:.1}"))),
                // One pass for most settings; the finalists' count includes the final rounds.
                Cell::new(if measured {
                    trial.tg_tps.len().to_string()
                } else {
                    "-".into()
                }),
                Cell::new(vs),
                Cell::new(if !measured {
                    "-".to_string()
                } else {
                    match trial.output.same_output {
                        SameOutput::Identical => "yes".into(),
                        SameOutput::NearTies => {
                            format!("yes, {} near-tie", trial.output.near_ties.len())
                                + if trial.output.near_ties.len() == 1 {
                                    ""
                                } else {
                                    "s"
                                }
                        }
                        SameOutput::Differs => "NO".into(),
                    }
                }),
                Cell::new(status),
            ])
            .collect();
        row
    }
}

/// The settings columns: n_max, n_min, p_min, placement (n-gram: its draft length m in n_max and
/// its lookup length as the placement; MTP: its draft length, drafted by the target's own heads).
fn settings_cells(t: &Trial) -> Vec<Cell> {
    if let Some(m) = t.mtp {
        return vec![
            Cell::new(m.n_max),
            Cell::new(0),
            Cell::new("0.00"),
            Cell::new("target's heads"),
        ];
    }
    match (t.ngram, t.params) {
        (Some(n), _) => vec![
            Cell::new(n.size_m),
            Cell::new("-"),
            Cell::new("-"),
            Cell::new(format!("lookup n {}", n.size_n)),
        ],
        (None, Some(p)) => vec![
            Cell::new(p.n_max),
            Cell::new(p.n_min),
            Cell::new(format!("{:.2}", p.p_min)),
            Cell::new(t.placement.map_or("-".into(), |x| x.label())),
        ],
        (None, None) => vec![Cell::new("-"); 4],
    }
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}
