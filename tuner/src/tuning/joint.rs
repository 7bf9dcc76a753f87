//! `autotune tune MODEL --quants …` (or `--ladder`, `--max-kld`, `--reference`): choose the
//! quantization together with its configuration.
//!
//! 1. The ladder: MODEL and its other quantizations (named, or found beside it).
//! 2. Quality first, since it decides what is worth tuning: every rung's KL divergence from the
//!    most precise file at the workload's depth (cached; its time counts in `--budget`). Rungs over
//!    `--max-kld` are not tuned.
//! 3. Each remaining rung is tuned like `tune` tunes a model ([`tuning::tune`], one file at a time,
//!    what the budget has left shared among them, every other setting the same), which reuses and appends to each
//!    file's measurement log, so an interrupted choice resumes like an interrupted tune. Its KV
//!    cache is held to the tune's own gate (`--max-kv-kld`), measured as what will run: the rung's
//!    weights with the pair, against the most precise file with f16 caches, at the workload's
//!    depth; the pair may add at most the gate to what the weights alone drift.
//! 4. [`choice::choose`] picks; the winner's profile is saved with notes on the choice. When no rung
//!    passes the gate nothing is tuned and no profile is written (exit 4).

use crate::engine::{Plan, QualityGate, SCORED_POSITIONS};
use crate::exit::{self, Exit};
use crate::measuring::TrialFailure;
use crate::quant::choice::{self, JointReport, QuantRow};
use crate::quant::ladder::{self, Ladder};
use crate::quant::quality::{self, fmt_kld, EvalSettings, Evaluator, QualityRow};
use crate::session;
use crate::tuning::{self, After, Tuned};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A choice among quantizations, validated (built from `tune`'s flags in `commands/`).
#[derive(Debug, Clone)]
pub struct Joint {
    pub model: PathBuf,
    /// Other quantizations named (files or folders); empty: the model's folder with `ladder`,
    /// else the model alone (then only its KV-cache types are gated).
    pub quants: Vec<PathBuf>,
    pub ladder: bool,
    /// The quality gate, nats per token.
    pub max_kld: f64,
    pub reference: Option<PathBuf>,
    pub eval: EvalSettings,
    /// Time of the whole choice, the quality table's included: what is left after it is shared
    /// among the rungs that pass the gate.
    pub budget: Duration,
    pub json: bool,
}

/// The ladder the settings ask for.
fn ladder_for(j: &Joint) -> anyhow::Result<Ladder> {
    let sources = if !j.quants.is_empty() {
        j.quants.clone()
    } else if j.ladder {
        Vec::new()
    } else {
        vec![j.model.clone()]
    };
    ladder::discover(&j.model, &sources).map_err(|e| Exit::new(exit::BAD_MODEL, e.to_string()))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Chooses among the quantizations of `j.model`, each tuned with `plan`; the chosen one's profile
/// goes where `after` says.
pub fn run(j: &Joint, plan: &Plan, after: &After, stop: &AtomicBool) -> anyhow::Result<i32> {
    let started = Instant::now();
    let ladder = ladder_for(j)?;
    let reference = quality::choose_reference(&ladder, j.reference.as_deref())
        .map_err(|e| Exit::new(exit::USAGE, e))?;
    if !j.json && !plan.quiet {
        eprint!("ladder of {}\n{}", j.model.display(), ladder.describe());
    }
    let mut report = gate(j, plan, &ladder, &reference, stop)?;
    report.kv_gate = kv_gate_line(plan);
    if let Some(why) = nothing_passes(&report) {
        emit(&report, j.json)?;
        return Err(Exit::new(
            exit::NOTHING_MEASURED,
            format!("{why}; nothing was tuned and no profile was written"),
        ));
    }
    let store = session::open_store()?;
    let _lock = session::lock_store(&store, stop)?;
    let Some(mut tuned) = tune_rungs(&mut report, j, plan, &reference.path, started, stop) else {
        emit(&report, j.json)?;
        return Err(Exit::new(
            exit::INTERRUPTED,
            "interrupted; measurements are kept, run the same command again to resume",
        ));
    };
    report.chosen = choice::choose(&report.quants, plan.noise);
    let Some(chosen) = report.chosen else {
        emit(&report, j.json)?;
        return Err(Exit::new(exit::NOTHING_MEASURED, "no quantization that passes the quality gate could be measured (see the statuses above)"));
    };
    conclude(&mut report, chosen, plan.noise);
    if let Some(t) = &tuned[chosen] {
        let line = t
            .run
            .quality
            .winner_line(t.run.winner.as_ref().expect("a chosen rung won"));
        report.notes.push(format!("its quality: {line}"));
    }
    // The chosen rung's explanation goes to stderr: stdout is the choice's report.
    let after = After {
        explain: crate::explain::outputs::Asked {
            json: true,
            ..after.explain.clone()
        },
        ..after.clone()
    };
    let t = tuned[chosen].take().expect("a chosen rung was tuned");
    let profile = finish(&t, &report, &after, &store, stop)?;
    report.profile_path = profile.as_ref().and_then(|(_, p)| p.clone());
    emit(&report, j.json)?;
    if let Some((profile, path)) = &profile {
        crate::explain::outputs::after_tune(&after.explain, profile, path.as_deref());
    }
    Ok(exit::OK)
}

/// How the rungs' KV caches are held to quality, in one line of the report.
fn kv_gate_line(plan: &Plan) -> String {
    match &plan.kv_gate {
        crate::engine::GateChoice::On(max) => format!(
            "held to --max-kv-kld {}: each quantization's weights with a quantized cache, against the reference with f16 caches at the workload's depth, may drift at most that more than the weights alone",
            fmt_kld(*max)
        ),
        crate::engine::GateChoice::Off(why) => format!("not held to quality ({why})"),
    }
}

/// The quality table of the ladder's weights, at the workload's depth, and a row per rung saying
/// whether it passes.
fn gate(
    j: &Joint,
    plan: &Plan,
    ladder: &Ladder,
    reference: &quality::Subject,
    stop: &AtomicBool,
) -> anyhow::Result<JointReport> {
    let stopped = || stop.load(Ordering::Relaxed);
    // The windows the KV gate judges at: a request's context, its last positions scored.
    let at_depth = QualityGate::on(0.0, &plan.workload, 1);
    let eval = EvalSettings {
        chunk: at_depth.window,
        scored: Some(SCORED_POSITIONS),
        max_tokens: j.eval.max_tokens.or(Some(at_depth.max_tokens)),
        ..j.eval.clone()
    };
    let mut evaluator = Evaluator::new(eval, &stopped);
    let table = evaluator.table(ladder, reference, &[]);
    evaluator.shutdown();
    let table = match table {
        Ok(t) => t,
        Err(TrialFailure::Interrupted) => {
            return Err(Exit::new(
                exit::INTERRUPTED,
                "interrupted; finished quality evaluations are cached",
            ))
        }
        Err(f) => return Err(anyhow::anyhow!("quality evaluation: {f}")),
    };
    let mut report = JointReport::new(ladder, table, j.max_kld);
    report.quants = ladder
        .rungs
        .iter()
        .map(|r| {
            let q: Option<&QualityRow> = report
                .quality
                .weights
                .iter()
                .find(|q| same_file(&q.model, &r.path));
            quant_row(r, q, j.max_kld)
        })
        .collect();
    Ok(report)
}

fn quant_row(r: &ladder::Rung, q: Option<&QualityRow>, max_kld: f64) -> QuantRow {
    let passes = q.is_some_and(|q| q.passes(max_kld));
    let status = match q {
        None => "quality not measured".to_string(),
        Some(q) if q.figures.is_none() => format!(
            "quality not measured: {}",
            q.error.clone().unwrap_or_default()
        ),
        Some(q) if !passes => format!(
            "over the quality gate ({} > {})",
            fmt_kld(q.kld().unwrap_or(0.0)),
            max_kld
        ),
        Some(_) => "to tune".to_string(),
    };
    QuantRow {
        file_type: r.file_type.clone(),
        path: r.path.clone(),
        size_bytes: r.size_bytes,
        bpw: r.bpw,
        kld: q.and_then(|q| q.kld()),
        top1: q.and_then(|q| q.figures.as_ref().map(|f| f.top1)),
        total_kld: None,
        passes_gate: passes,
        winner: None,
        figures: None,
        placement: None,
        status,
        rates: Vec::new(),
    }
}

/// Tunes every rung that passes, each with an equal share of the budget left when it begins (the
/// quality table's time and the rungs' before it spent, counted from `started`; a rung's tune still measures llama.cpp's
/// defaults on a share of nothing); `None` when interrupted. Each row gets its winner, figures and
/// placement, or why it was not measured.
fn tune_rungs(
    report: &mut JointReport,
    j: &Joint,
    plan: &Plan,
    reference: &Path,
    started: Instant,
    stop: &AtomicBool,
) -> Option<Vec<Option<Tuned>>> {
    let to_tune: Vec<usize> = (0..report.quants.len())
        .filter(|&i| report.quants[i].passes_gate)
        .collect();
    let mut rung_plan = Plan {
        // The rungs share the joint budget: none grows its share.
        time_budget_grows: false,
        // The tune's gate, measured as what will run: the rung's weights with the pair, against
        // the most precise file.
        quality_reference: Some(reference.to_path_buf()),
        ..plan.clone()
    };
    let mut tuned: Vec<Option<Tuned>> = (0..report.quants.len()).map(|_| None).collect();
    for (k, &i) in to_tune.iter().enumerate() {
        let row = &mut report.quants[i];
        let left = j.budget.saturating_sub(started.elapsed());
        rung_plan.time_budget = (left / (to_tune.len() - k) as u32).max(Duration::from_secs(1));
        if !plan.quiet {
            eprintln!(
                "autotune: tuning {} ({}/{}, KLD {}), budget {} s of the {} s left",
                row.file_type,
                k + 1,
                to_tune.len(),
                row.kld.map_or("?".into(), fmt_kld),
                rung_plan.time_budget.as_secs(),
                left.as_secs()
            );
        }
        let outcome = tuning::tune(&rung_plan, &row.path, stop);
        let interrupted = match &outcome {
            Ok(t) => t.interrupted,
            Err(e) => e
                .downcast_ref::<Exit>()
                .is_some_and(|x| x.code == exit::INTERRUPTED),
        };
        if interrupted || stop.load(Ordering::Relaxed) {
            row.status = "interrupted".into();
            return None;
        }
        match outcome {
            Ok(t) if t.run.winner.is_some() => {
                fill_from_run(row, &t);
                tuned[i] = Some(t);
            }
            Ok(t) => row.status = not_measured(&t),
            Err(e) => row.status = format!("not measured: {}", crate::term::error_line(&e)),
        }
    }
    Some(tuned)
}

/// A row from its rung's run: the winner, its figures and where its layers live.
fn fill_from_run(row: &mut QuantRow, t: &Tuned) {
    let board = tuning::report_of(t);
    row.winner = board.winner.clone();
    row.figures = board.winner_figures.clone();
    let w = &t.run.settings.plan.workload;
    row.rates = (t.run.results.iter())
        .find(|r| Some(&r.candidate) == row.winner.as_ref() && r.ok())
        .and_then(|r| r.timed_whole().rate_sample(w))
        .map_or(Vec::new(), |s| s.values().to_vec());
    // The gate measured a quantized pair with these weights against the reference: what runs.
    row.total_kld = (row.winner.as_ref())
        .and_then(|w| board.quality.check(w))
        .and_then(|c| c.figures.as_ref())
        .map(|f| f.kld_mean)
        .or(row.kld);
    let offload: Vec<String> = t
        .probe
        .machine
        .devices
        .iter()
        .filter(|d| d.takes_layers())
        .map(|d| d.name.clone())
        .collect();
    row.placement = row
        .winner
        .as_ref()
        .map(|w| choice::placement(w, t.info.block_count, &offload));
    row.status = if row.figures.is_some() {
        "measured".into()
    } else {
        "not measured: no figures in the report".into()
    };
}

/// A one-line reason for a rung whose run has no winner.
fn not_measured(t: &Tuned) -> String {
    let why = tuning::report_of(t)
        .leaderboard
        .iter()
        .map(|e| e.status.clone())
        .find(|s| s != "ok")
        .unwrap_or_else(|| format!("{:#}", tuning::nothing_measured(t)));
    if why.starts_with("not measured") {
        why
    } else {
        format!("not measured: {why}")
    }
}

/// The statuses of the rows against the chosen one, and the notes on the choice.
fn conclude(report: &mut JointReport, chosen: usize, noise: f64) {
    let best = report.quants[chosen].clone();
    let best_score = best.score().unwrap_or(f64::NAN);
    for (i, r) in report.quants.iter_mut().enumerate() {
        if i == chosen {
            r.status = "chosen".into();
        } else if let Some(s) = r.score() {
            r.status = if r.ties_with(&best, noise) {
                "tie, more drift".into()
            } else {
                format!("{:.0}% slower", (s / best_score - 1.0) * 100.0)
            };
        }
    }
    let c = &report.quants[chosen];
    report.notes.push(format!(
        "chose {} among {} quantizations under --max-kld {}: KLD {} from {}, top-1 agreement {}",
        c.file_type,
        report.quants.len(),
        report.max_kld,
        c.kld.map_or("?".into(), fmt_kld),
        report.reference_type,
        c.top1.map_or("?".into(), |t| format!("{:.1}%", t * 100.0)),
    ));
    report
        .notes
        .extend(choice::spill_notes(&report.quants, chosen));
    let unmeasured: Vec<&str> = report
        .quants
        .iter()
        .filter(|r| r.passes_gate && r.figures.is_none())
        .map(|r| r.file_type.as_str())
        .collect();
    if !unmeasured.is_empty() {
        report.notes.push(format!(
            "{} passed the gate but could not be measured (see the status); with a time budget spent, raise --budget",
            unmeasured.join(", ")
        ));
    }
    let over: Vec<&str> = report
        .quants
        .iter()
        .filter(|r| !r.passes_gate && r.kld.is_some())
        .map(|r| r.file_type.as_str())
        .collect();
    if !over.is_empty() {
        report.notes.push(format!(
            "{} over the quality gate, not tuned; raise --max-kld to consider them",
            over.join(", ")
        ));
    }
}

/// The chosen rung's profile, completed like `tune`'s, with notes on the choice; saved.
fn finish(
    t: &Tuned,
    report: &JointReport,
    after: &After,
    store: &profiles::Store,
    stop: &AtomicBool,
) -> anyhow::Result<Option<(profiles::Profile, Option<PathBuf>)>> {
    let Some(mut profile) = tuning::profile_from_run(t) else {
        return Ok(None);
    };
    tuning::complete(&mut profile, t, after, stop)?;
    profile
        .notes
        .extend(report.notes.iter().map(|n| crate::term::one_line(n)));
    let path = tuning::save(store, &profile, after)?;
    Ok(Some((profile, path)))
}

/// Why nothing can be chosen before anything is tuned, if so.
fn nothing_passes(report: &JointReport) -> Option<String> {
    let g = report.max_kld;
    if !report.quants.iter().any(|r| r.passes_gate) {
        let best = report
            .quants
            .iter()
            .filter(|r| r.kld.is_some())
            .min_by(|a, b| a.kld.unwrap().total_cmp(&b.kld.unwrap()));
        return Some(match best {
            Some(b) => format!(
                "no quantization passes the quality gate --max-kld {g}: the closest to the reference ({}) is {} with a KL \
                 divergence of {} nats/token; raise --max-kld above that, or add a more precise quantization",
                report.reference_type,
                b.file_type,
                fmt_kld(b.kld.unwrap_or(0.0))
            ),
            None => "the quality of no quantization could be measured (see the table), so none passes the quality gate".into(),
        });
    }
    None
}

fn emit(report: &JointReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}
