//! What a tuned model turns into: the run's [`Report`] (table or JSON) and the [`Profile`] of its
//! winner, completed (draft, roofline) and saved. Built from the [`Tuned`] alone, so a profile written from the same measurements is the
//! same file whoever asked for it (`tune`, or the quantization ladder).

use super::Tuned;
use crate::busy;
use crate::engine::baseline::BaselineSource;
use crate::exit::{self, Exit};
use crate::explain::outputs::{roofline_for_run, Asked};
use crate::measuring::TrialFailure;
use crate::report::{self, ModelSummary, Report};
use crate::speculative::attach::{self, DraftSearch};
use crate::stats::Verdict;
use anyhow::Context as _;
use profiles::{Figures, Profile, Store};
use search_space::Candidate;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

/// Why the default budget grew, where it did.
fn grown_budget_note(run: &crate::engine::Run) -> Option<String> {
    let visit = run.visit_seconds?;
    let budget = run.settings.time_budget;
    (budget > crate::tuning::DEFAULT_BUDGET).then(|| {
        format!(
            "the default budget grew to {:.0} min: one configuration of this model takes about {visit:.0} s to load, warm up and measure twice (llama.cpp's defaults), and the search needs about {:.0} of those; --budget sets it",
            budget.as_secs_f64() / 60.0,
            crate::engine::VISITS
        )
    })
}

/// Where the winner's host part is larger than the RAM the run had: it ran from the model file's
/// mapping, paging weights from disk, and so would a server.
fn paging_note(run: &crate::engine::Run) -> Option<String> {
    let w = run.winner.as_ref()?;
    let r = run.results.iter().find(|r| &r.candidate == w)?;
    let (need, budget) = crate::engine::placement::pages(&run.settings, r.predicted.as_ref()?)?;
    let (need, budget) = search_space::size::format_size_pair(need, budget);
    Some(format!(
        "the winner needs {need} of host memory and the run had {budget} of RAM: llama.cpp runs it from the model file's mapping, reading the weights the RAM cannot hold from disk again for every token, and it was measured so (faster storage or more RAM would be faster; repacked weights, a copy in RAM, were not an option)"
    ))
}

/// The notes of the run: GPU warnings, crashed candidates, a budget that ran out.
fn notes(t: &Tuned) -> Vec<String> {
    let results = &t.run.results;
    let mut notes = t.probe.gpu_warnings.clone();
    // Why the baseline is not llama.cpp's fit placement, or how that placement was measured.
    if let Some(n) = &t.run.baseline_placement.note {
        notes.push(report::one_line(n));
    }
    for r in results.iter().filter(|r| r.failure.is_some()) {
        if let Some(TrialFailure::Crashed { name, .. }) = &r.failure {
            notes.push(report::one_line(&format!(
                "{} crashed ({name}); recorded and skipped",
                r.candidate.label()
            )));
        }
    }
    for r in results.iter().filter(|r| r.failure.is_none()) {
        if let Some(TrialFailure::Crashed { name, .. }) = &r.crashed_once {
            notes.push(report::one_line(&format!(
                "{} crashed once ({name}) after it had measured; measured again on a fresh worker",
                r.candidate.label()
            )));
        }
        if let Some(why) = &r.halted {
            notes.push(report::one_line(&format!("{}: {why}", r.candidate.label())));
        }
    }
    if let Some(n) = grown_budget_note(&t.run) {
        notes.push(n);
    }
    notes.extend(paging_note(&t.run));
    if let Some(asked) = &t.shortened_from {
        let w = &t.run.settings.plan.workload;
        notes.push(format!(
            "--quick measured a shorter request than the workload's ({}-token prompt and {} generated, for {} and {}): one of those would have taken longer than its minute holds here; the rates stand for the workload's, the seconds per request are the shorter one's",
            w.n_prompt, w.n_gen, asked.n_prompt, asked.n_gen
        ));
    }
    notes.extend(
        (t.run.time_plan.as_ref())
            .map(|p| format!("said before the search: {}", report::time::plan_line(p))),
    );
    notes.extend(t.run.skipped_axes.iter().map(report::time::skipped_line));
    let cpus = t.probe.machine.logical_cpus;
    notes.extend(busy::note(t.others_cpu, cpus, "while autotune measured"));
    // Only the time budget's own skips: a candidate pruned on a memory budget ("needs 10.0 MiB on
    // Vulkan0, budget 8.0 MiB") would not be measured with more time either.
    let budget = t.run.settings.time_budget.as_secs();
    if !t.run.not_reached.is_empty() {
        notes.push(format!(
            "the time budget ({budget} s) ran out before the search reached {} (settings left at the best so far); raise --budget",
            axis_list(&t.run.not_reached)
        ));
    } else if results
        .iter()
        .any(|r| r.skipped.as_deref() == Some(crate::engine::BUDGET_SPENT))
    {
        notes.push(format!(
            "the time budget ({budget} s) ran out before every candidate was measured; raise --budget"
        ));
    }
    notes
}

/// "the kv cache axis", "the kv cache and batch axes", "the threads, kv cache and batch axes".
fn axis_list(axes: &[String]) -> String {
    match axes {
        [one] => format!("the {one} axis"),
        [rest @ .., last] => format!("the {} and {last} axes", rest.join(", ")),
        [] => String::new(),
    }
}

/// The run's notes, and how `--ctx max` chose the context the profile's server runs with (the
/// report says it in its header).
fn profile_notes(t: &Tuned) -> Vec<String> {
    let mut n = notes(t);
    if let Some(c) = &t.context {
        let offload = !t.probe.machine.offload_devices().is_empty();
        n.push(format!("--ctx max: {}", c.describe(offload)));
    }
    n
}

fn figures_of(t: &Tuned, c: &Candidate) -> Option<Figures> {
    t.run
        .results
        .iter()
        .find(|r| &r.candidate == c)
        .and_then(|r| crate::engine::ranking::figures(r, &t.run.settings.plan.workload))
}

/// The ranking, each row with its K/V pair's quality where the gate measured it.
fn leaderboard(t: &Tuned) -> Vec<profiles::LeaderboardEntry> {
    let s = &t.run.settings;
    let mut board = crate::engine::ranking::leaderboard(
        &t.run.results,
        &s.plan.workload,
        s.plan.noise,
        s.plan.seed,
    );
    report::quality::annotate(&mut board, &t.run.quality);
    board
}

/// What the backend axis measured, each through its backend with its figures or why it has none.
pub fn backend_trials(t: &Tuned) -> Vec<profiles::BackendTrial> {
    let board = leaderboard(t);
    (t.run.backends.iter())
        .map(|b| {
            let row = board.iter().find(|r| r.candidate == b.candidate);
            profiles::BackendTrial {
                backend: b.backend.clone(),
                candidate: b.candidate.clone(),
                figures: row.and_then(|r| r.figures.clone()),
                status: row.map_or_else(|| "not measured".into(), |r| r.status.clone()),
                chosen: b.chosen,
            }
        })
        .collect()
}

/// The run's report (no profile path yet).
pub fn report_of(t: &Tuned) -> Report {
    let (run, s, info) = (&t.run, &t.run.settings, &t.info);
    let machine = &t.probe.machine;
    Report {
        model: ModelSummary {
            path: t.model.clone(),
            architecture: info.architecture.clone(),
            file_type: info.file_type_name.clone(),
            layers: info.block_count,
            parameters: info.parameter_count,
            size_bytes: info.file_size,
            trained_context: info.context_length,
            experts: info.expert_count,
            fingerprint: t.identity.fingerprint.clone(),
        },
        machine: machine.clone(),
        gpus: t.probe.gpus.clone(),
        gpu_warnings: t.probe.gpu_warnings.clone(),
        winner_devices: run
            .winner
            .as_ref()
            .map(|w| report::devices_of(w, machine))
            .unwrap_or_default(),
        llama: t.llama.clone(),
        workload: s.plan.workload.clone(),
        context: t.context.clone(),
        seed: s.plan.seed,
        noise: s.plan.noise,
        elapsed_s: t.elapsed_s,
        budget_s: s.time_budget.as_secs_f64(),
        interrupted: t.interrupted,
        budget_spent: run.budget_spent,
        axes_not_reached: run.not_reached.clone(),
        time_plan: run.time_plan.clone(),
        ceilings: s.ceilings.clone(),
        axes_skipped: run.skipped_axes.clone(),
        measured: run.results.iter().filter(|r| r.ok()).count(),
        failed: (run.results.iter())
            .filter(|r| r.failure.as_ref().is_some_and(|f| !f.gave_up()))
            .count(),
        stopped_early: (run.results.iter())
            .filter(|r| r.failure.as_ref().is_some_and(TrialFailure::gave_up))
            .count(),
        reused_repetitions: t.reused,
        leaderboard: leaderboard(t),
        winner: run.winner.clone(),
        winner_figures: run.winner.as_ref().and_then(|w| figures_of(t, w)),
        quality: run.quality.clone(),
        baseline: Some(run.baseline.clone()),
        baseline_figures: figures_of(t, &run.baseline),
        baseline_placement: run.baseline_placement.clone(),
        versus_defaults: run.winner.as_ref().and_then(|w| {
            report::versus_defaults(
                &run.results,
                w,
                &run.baseline,
                &s.plan.workload,
                s.plan.noise,
                s.plan.seed,
            )
        }),
        confirm_drift: run.confirm_drift.clone(),
        confirmed: run.confirmed.clone(),
        lossless_twin: run.twin.clone(),
        profile_path: None,
        measurement_log: Some(t.log_path.clone()),
        notes: notes(t),
        others_cpu_share: t.others_cpu,
        memory: report::memory_rows(&run.results),
        backends: backend_trials(t),
    }
}

/// Why there is no winner: every candidate pruned by the memory budgets, or none measured (exit 4).
pub fn nothing_measured(t: &Tuned) -> anyhow::Error {
    let results = &t.run.results;
    if !results.is_empty()
        && results.iter().all(|r| {
            r.skipped
                .as_deref()
                .is_some_and(|s| s.starts_with("pruned"))
        })
    {
        let reason = results
            .iter()
            .find_map(|r| r.skipped.clone())
            .unwrap_or_default();
        // Short of RAM: what a user can do about it, as the host's figure is not a flag's.
        let hint = if reason.contains(" on CPU (host RAM)") {
            "; a smaller quantization (`autotune quantize`, `--ladder`), a smaller --ctx, or layers on a GPU would fit"
        } else {
            ""
        };
        return Exit::new(
            exit::NOTHING_MEASURED,
            format!(
                "{}: no configuration fits the memory budgets ({reason}); nothing was loaded{hint}",
                t.model.display()
            ),
        );
    }
    // What did measure has a quantized KV cache the gate refused: no lossless cache fitted.
    let q = &t.run.quality;
    if let Some(max) = q.max_kv_kld.filter(|_| q.checks.iter().any(|c| !c.passed)) {
        // A pair the gate could not measure (the budget ran out, the evaluation failed) is not
        // over it: say why it is out instead.
        let unmeasured = (q.checks.iter()).find(|c| !c.passed && c.figures.is_none());
        let why = match unmeasured {
            Some(c) => format!(
                "whose quality could not be measured (kv={}: {})",
                c.label(),
                c.describe()
            ),
            None => format!(
                "over the quality gate (mean KLD {})",
                profiles::fmt_kld(max)
            ),
        };
        return Exit::new(
            exit::NOTHING_MEASURED,
            format!(
                "{}: every configuration measured has a quantized KV cache {why}, and none with an f16 cache could be measured; raise --max-kv-kld or --budget, or --no-quality-gate to let speed alone decide",
                t.model.display(),
            ),
        );
    }
    Exit::new(
        exit::NOTHING_MEASURED,
        format!(
            "{}: no configuration could be measured (see the statuses above)",
            t.model.display()
        ),
    )
}

/// The winner's profile (`None` without a measured winner). The roofline, a draft and the server
/// arguments are added by the caller, after the workers are gone.
pub fn profile_from_run(t: &Tuned) -> Option<Profile> {
    let winner = t.run.winner.clone()?;
    let figures = figures_of(t, &winner)?;
    let w = &t.run.settings.plan.workload;
    let (machine, info, id) = (&t.probe.machine, &t.info, &t.identity);
    Some(Profile {
        schema_version: profiles::SCHEMA_VERSION,
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        autotune_version: env!("CARGO_PKG_VERSION").to_string(),
        server_args: Vec::new(),
        server_env: Default::default(),
        rpc: rpc_needed(t, &winner),
        notes: profile_notes(t),
        model: profiles::ModelRef {
            path: t.model.clone(),
            file_name: id.file_name.clone(),
            fingerprint: id.fingerprint.clone(),
            size_bytes: id.size_bytes,
            architecture: info.architecture.clone(),
            file_type: info.file_type_name.clone(),
        },
        machine: profiles::MachineRef {
            fingerprint: machine.fingerprint.clone(),
            hostname: machine.hostname.clone(),
            cpu: machine.cpu.clone(),
            physical_cores: machine.physical_cores,
            logical_cpus: machine.logical_cpus,
            ram_bytes: machine.ram_bytes,
            os: machine.os.clone(),
            numa_nodes: machine.numa_nodes,
            devices: machine
                .devices
                .iter()
                .map(|d| profiles::DeviceRef {
                    name: d.name.clone(),
                    description: d.description.clone(),
                    kind: d.kind.clone(),
                    backend: d.backend.clone(),
                    memory_total: d.memory_total,
                })
                .collect(),
            gpus: t.probe.gpus.iter().map(|g| g.name.clone()).collect(),
        },
        llama: t.llama.clone(),
        workload: w.clone(),
        winner,
        figures,
        baseline: figures_of(t, &t.run.baseline),
        // Named only when it is not llama.cpp's plain defaults (a CPU-only profile reads as before).
        baseline_placement: (t.run.baseline_placement.source != BaselineSource::Defaults)
            .then(|| t.run.baseline_placement.label.clone()),
        versus_defaults: versus_defaults(t),
        roofline: None,
        backends: backend_trials(t),
        leaderboard: leaderboard(t),
        draft: None,
        ngram: None,
        mtp: None,
        quality: Some(t.run.quality.clone()),
        quality_unreadable: None,
        budgets: t.run.settings.mem_budgets.clone(),
        hosts: crate::hosts::links::marked(
            &t.run.settings.links,
            t.run.winner.as_ref()?,
            &offload_devices(t),
        ),
    })
}

/// The RPC servers llama-server needs for the winner (`--rpc`): those its layers live on, and any
/// given before one of them, since llama.cpp numbers RPC devices in the order of `--rpc` (a host
/// given after the last one used is left out, so `apply` does not need it up).
fn rpc_needed(t: &Tuned, winner: &search_space::Candidate) -> Vec<String> {
    let offload = offload_devices(t);
    let at: Vec<Option<usize>> = (t.probe.machine.devices.iter())
        .filter(|d| d.is_rpc() && crate::hosts::links::runs_on(winner, &offload, &d.name))
        .map(|d| t.rpc.iter().position(|e| *e == d.description))
        .collect();
    match at.iter().copied().collect::<Option<Vec<usize>>>() {
        Some(v) => v
            .into_iter()
            .max()
            .map_or_else(Vec::new, |k| t.rpc[..=k].to_vec()),
        // A device that names no server of the run (not seen): all of them, as llama.cpp had.
        None => t.rpc.clone(),
    }
}

/// The run's offload devices in llama.cpp's order (what a tensor split without devices follows).
fn offload_devices(t: &Tuned) -> Vec<String> {
    (t.run.settings.mem_budgets.offload())
        .map(|b| b.device.clone())
        .collect()
}

/// The report's verdict on the winner against the baseline, as the profile keeps it.
fn versus_defaults(t: &Tuned) -> Option<profiles::VersusDefaults> {
    let (run, s) = (&t.run, &t.run.settings);
    let v = report::versus_defaults(
        &run.results,
        run.winner.as_ref()?,
        &run.baseline,
        &s.plan.workload,
        s.plan.noise,
        s.plan.seed,
    )?;
    let (verdict, ratio, ci) = match &v.comparison {
        None => (profiles::Judged::Same, 0.0, [0.0, 0.0]),
        Some(c) => (
            match c.verdict {
                Verdict::Faster => profiles::Judged::Faster,
                Verdict::Tie => profiles::Judged::Tie,
                Verdict::Slower => profiles::Judged::Slower,
            },
            c.ratio,
            [c.ci_low, c.ci_high],
        ),
    };
    Some(profiles::VersusDefaults {
        verdict,
        ratio,
        ci,
        noise: s.plan.noise,
    })
}

/// What is done with a winner's profile once it is built: a draft searched for it, where it is
/// saved, what is explained after the run.
#[derive(Debug, Clone, Default)]
pub struct After {
    /// `--draft`: speculative decoding measured with the winner's settings.
    pub draft: Option<DraftSearch>,
    /// Save in the profile store (not `--no-save`).
    pub save: bool,
    /// `--out FILE`.
    pub out: Option<PathBuf>,
    pub explain: Asked,
    pub quiet: bool,
}

/// Adds to a winner's profile what needs the workers gone: the draft search (when asked; its note
/// is returned and added to the profile's notes), the bandwidth roofline (a ~1 s probe, for
/// `explain`), and the server's arguments.
pub fn complete(
    profile: &mut Profile,
    t: &Tuned,
    after: &After,
    stop: &AtomicBool,
) -> anyhow::Result<Option<String>> {
    let show = !after.quiet && !after.explain.json;
    let note = match &after.draft {
        Some(d) => {
            let target = attach::Tuned {
                info: &t.info,
                rpc: &t.rpc,
                budgets: &t.run.settings.mem_budgets,
            };
            attach::attach(d, &target, profile, stop, after.quiet, show)?
        }
        None => None,
    };
    if let Some(n) = &note {
        profile.notes.push(n.clone());
    }
    profile.roofline = Some(roofline_for_run(&t.info, profile, &t.rpc));
    profile.refresh_server_args();
    Ok(note)
}

/// Validates and writes a finished profile: to the store (locked by the caller) and to `--out`;
/// returns where it went (the store's file first).
pub fn save(store: &Store, profile: &Profile, after: &After) -> anyhow::Result<Option<PathBuf>> {
    profile
        .validate(false)
        .map_err(|e| anyhow::anyhow!("internal error: the new profile does not validate: {e}"))?;
    let mut saved = None;
    if after.save {
        saved = Some(store.save(profile).context("cannot save the profile")?);
    }
    if let Some(out) = &after.out {
        profiles::write_atomic(out, &profile.to_toml()?)
            .with_context(|| format!("cannot write {}", out.display()))?;
        saved = saved.or_else(|| Some(out.clone()));
    }
    Ok(saved)
}
