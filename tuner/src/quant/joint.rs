//! `autotune tune MODEL --quants …` (or `--ladder`, `--max-kld`, `--reference`): choose the
//! quantization together with its configuration.
//!
//! 1. The ladder: MODEL and its other quantizations (named, or found beside it).
//! 2. Quality first, because it is cheap next to tuning and decides what is worth tuning: every
//!    rung's KL divergence from the most precise file, and every KV-cache type's on that file's
//!    weights (cached). Rungs over `--max-kld` are not tuned; KV types over it are not tried.
//! 3. Each remaining rung is tuned by the ordinary `tune` (the same binary as a child process, one
//!    file at a time, `--budget` shared among them, `--cache-types` cut to the allowed types, every
//!    other flag passed on), which reuses and appends to each file's measurement log, so an
//!    interrupted choice resumes like an interrupted tune.
//! 4. [`choice::choose`] picks; the winner's profile is saved with notes on the choice. When no rung
//!    passes the gate nothing is tuned and no profile is written (exit 4).

use super::choice::{self, JointReport, QuantRow};
use super::ladder::{self, Ladder};
use super::quality::{self, fmt_kld, Evaluator, QualityRow};
use crate::cli::{parse_duration, Cli, TuneArgs};
use crate::commands::tune::inspect_model;
use crate::exit::{self, Exit};
use crate::trial::TrialFailure;
use anyhow::Context as _;
use profiles::{Figures, Profile, Store};
use search_space::{CacheType, Candidate};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The least tuning time a rung gets, whatever `--budget` divided by the rungs comes to.
const MIN_BUDGET_PER_RUNG: Duration = Duration::from_secs(30);

/// Whether `tune` was asked to choose among quantizations.
pub fn wants_joint(a: &TuneArgs) -> bool {
    !a.quants.is_empty() || a.ladder || a.max_kld.is_some() || a.reference.is_some()
}

/// The ladder the flags ask for: `--quants`, the model's folder (`--ladder`), or the model alone
/// (then only its KV-cache types are gated).
fn ladder_for(a: &TuneArgs) -> anyhow::Result<Ladder> {
    let sources = if !a.quants.is_empty() {
        a.quants.clone()
    } else if a.ladder {
        Vec::new()
    } else {
        vec![a.model.clone()]
    };
    ladder::discover(&a.model, &sources).map_err(|e| Exit::new(exit::BAD_MODEL, e.to_string()))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

pub fn run(cli: &Cli, args: &TuneArgs) -> anyhow::Result<i32> {
    let usage = |m: String| Exit::new(exit::USAGE, m);
    inspect_model(&args.model)?;
    let max_kld = args.max_kld.unwrap_or(super::DEFAULT_MAX_KLD);
    if !(max_kld.is_finite() && max_kld >= 0.0) {
        return Err(usage(format!(
            "--max-kld {max_kld}: give a divergence in nats per token, at least 0 (e.g. 0.05)"
        )));
    }
    let kv_types = args
        .cache_types
        .iter()
        .map(|s| s.parse::<CacheType>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| usage(format!("--cache-types: {e}")))?;
    let budget = parse_duration(&args.budget).map_err(|e| usage(format!("--budget: {e}")))?;
    let ladder = ladder_for(args)?;
    let reference = quality::choose_reference(&ladder, args.reference.as_deref()).map_err(usage)?;
    if !args.json && !cli.quiet {
        eprint!("ladder of {}\n{}", args.model.display(), ladder.describe());
    }

    let stop = super::interrupt_flag()?;
    let settings = crate::commands::quality::eval_settings(
        None,
        args.quality_tokens,
        512,
        None,
        false,
        cli.quiet,
    )?;
    let mut evaluator = Evaluator::new(settings, &stop);
    let table = evaluator.table(&ladder, &reference, &kv_types);
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
    let mut report = JointReport::new(&ladder, table, max_kld);
    report.quants = ladder
        .rungs
        .iter()
        .map(|r| {
            let q: Option<&QualityRow> = report
                .quality
                .weights
                .iter()
                .find(|q| same_file(&q.model, &r.path));
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
                passes_gate: passes,
                winner: None,
                figures: None,
                placement: None,
                status,
            }
        })
        .collect();
    // The user's order of KV types, cut to those the gate allows.
    let kv_allowed: Vec<CacheType> = kv_types
        .iter()
        .copied()
        .filter(|t| report.kv.iter().any(|k| k.kv == *t && k.allowed))
        .collect();

    if let Some(why) = nothing_passes(&report, &kv_allowed) {
        emit(&report, args)?;
        return Err(Exit::new(
            exit::NOTHING_MEASURED,
            format!("{why}; nothing was tuned and no profile was written"),
        ));
    }

    // Tune every rung that passes, the budget shared among them.
    let to_tune: Vec<usize> = (0..report.quants.len())
        .filter(|&i| report.quants[i].passes_gate)
        .collect();
    // A floor, so a short budget shared by a long ladder still measures llama.cpp's defaults.
    let per_rung = (budget / to_tune.len() as u32).max(MIN_BUDGET_PER_RUNG);
    let work = std::env::temp_dir().join(format!("autotune-joint-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let raw = crate::cli::with_default_subcommand(std::env::args_os().collect());
    let mut profiles_of: Vec<Option<PathBuf>> = vec![None; report.quants.len()];
    let mut interrupted = false;
    for (k, &i) in to_tune.iter().enumerate() {
        let row = &report.quants[i];
        if !cli.quiet {
            eprintln!(
                "autotune: tuning {} ({}/{}, KLD {}), budget {} s",
                row.file_type,
                k + 1,
                to_tune.len(),
                row.kld.map_or("?".into(), fmt_kld),
                per_rung.as_secs()
            );
        }
        let out = work.join(format!("{i}.toml"));
        let child = child_args(&raw, &args.model, &row.path, &kv_allowed, per_rung, &out);
        let outcome = run_child(child, &stop).context("cannot run the tuning of a quantization")?;
        let row = &mut report.quants[i];
        match outcome.code {
            Some(0) => {
                if let Some(v) = &outcome.report {
                    fill_from_report(row, v);
                }
                row.status = if row.figures.is_some() {
                    "measured".into()
                } else {
                    "not measured: no figures in the report".into()
                };
                profiles_of[i] = out.exists().then_some(out);
            }
            Some(exit::INTERRUPTED) => {
                row.status = "interrupted".into();
                interrupted = true;
            }
            code => {
                let why = failure_reason(outcome.report.as_ref(), code);
                row.status = if why.starts_with("not measured") {
                    why
                } else {
                    format!("not measured: {why}")
                };
            }
        }
        if interrupted || stop.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
    }
    if interrupted {
        let _ = std::fs::remove_dir_all(&work);
        emit(&report, args)?;
        return Err(Exit::new(
            exit::INTERRUPTED,
            "interrupted; measurements are kept, run the same command again to resume",
        ));
    }

    let noise = args.noise;
    report.chosen = choice::choose(&report.quants, noise);
    let Some(chosen) = report.chosen else {
        let _ = std::fs::remove_dir_all(&work);
        emit(&report, args)?;
        return Err(Exit::new(exit::NOTHING_MEASURED, "no quantization that passes the quality gate could be measured (see the statuses above)"));
    };
    let best_score = report.quants[chosen].score().unwrap_or(f64::NAN);
    for (i, r) in report.quants.iter_mut().enumerate() {
        if i == chosen {
            r.status = "chosen".into();
        } else if let Some(s) = r.score() {
            r.status = if s <= best_score * (1.0 + noise) {
                "tie, higher KLD".into()
            } else {
                format!("{:.0}% slower", (s / best_score - 1.0) * 100.0)
            };
        }
    }
    let c = &report.quants[chosen];
    report.notes.push(format!(
        "chose {} among {} quantizations under --max-kld {}: KLD {} from {}, top-1 agreement {}; KV types allowed: {}",
        c.file_type,
        report.quants.len(),
        max_kld,
        c.kld.map_or("?".into(), fmt_kld),
        report.reference_type,
        c.top1.map_or("?".into(), |t| format!("{:.1}%", t * 100.0)),
        kv_allowed.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")
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

    let saved = profiles_of[chosen]
        .as_ref()
        .map(|p| save_profile(p, &report, args))
        .transpose();
    let _ = std::fs::remove_dir_all(&work);
    report.profile_path = saved?.flatten();
    emit(&report, args)?;
    Ok(exit::OK)
}

/// Why nothing can be chosen before anything is tuned, if so.
fn nothing_passes(report: &JointReport, kv_allowed: &[CacheType]) -> Option<String> {
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
    if kv_allowed.is_empty() {
        let tried: Vec<String> = report
            .kv
            .iter()
            .map(|k| format!("{} {}", k.kv, k.kld.map_or("failed".into(), fmt_kld)))
            .collect();
        return Some(format!(
            "no KV-cache type in --cache-types passes the quality gate --max-kld {g} ({}); add f16 to --cache-types",
            tried.join(", ")
        ));
    }
    None
}

/// The child `tune` for one rung: the user's own arguments, minus the joint ones and those the
/// parent sets (`--budget`, `--cache-types`, `--out`, `--json`, `--no-save`), for the rung's file.
pub fn child_args(
    raw: &[OsString],
    model: &Path,
    rung: &Path,
    kv: &[CacheType],
    budget: Duration,
    out: &Path,
) -> Vec<OsString> {
    const MULTI: &[&str] = &["--quants"];
    const ONE: &[&str] = &[
        "--max-kld",
        "--reference",
        "--quality-tokens",
        "--out",
        "-o",
        "--budget",
        "--cache-types",
    ];
    const FLAGS: &[&str] = &["--ladder", "--json", "--no-save"];
    let mut out_args: Vec<OsString> = vec!["tune".into(), rung.as_os_str().to_owned()];
    let mut it = raw.iter().skip(1).peekable();
    let (mut saw_tune, mut saw_model) = (false, false);
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        let name = s.split('=').next().unwrap_or("");
        if !saw_tune && s == "tune" {
            saw_tune = true;
            continue;
        }
        if !saw_model && Path::new(a) == model {
            saw_model = true;
            continue;
        }
        if FLAGS.contains(&s.as_ref()) {
            continue;
        }
        if ONE.contains(&name) {
            if !s.contains('=') {
                it.next();
            }
            continue;
        }
        if MULTI.contains(&name) {
            if !s.contains('=') {
                while it
                    .peek()
                    .is_some_and(|n| !n.to_string_lossy().starts_with('-'))
                {
                    it.next();
                }
            }
            continue;
        }
        out_args.push(a.clone());
    }
    let kv: Vec<&str> = kv.iter().map(|t| t.as_str()).collect();
    for a in ["--no-save", "--json", "--out"] {
        out_args.push(a.into());
    }
    out_args.push(out.as_os_str().to_owned());
    out_args.extend([
        "--budget".into(),
        format!("{}s", budget.as_secs().max(1)).into(),
        "--cache-types".into(),
        kv.join(",").into(),
    ]);
    out_args
}

struct ChildOutcome {
    /// The exit code; `None` when a signal ended it.
    code: Option<i32>,
    report: Option<serde_json::Value>,
}

/// Runs `autotune <args>`: stdout (its JSON report) captured, stderr passed through so its
/// progress and warnings show. An interrupt reaches it too (same process group); a SIGTERM sent to
/// this process alone is forwarded after a grace period.
fn run_child(args: Vec<OsString>, stop: &AtomicBool) -> std::io::Result<ChildOutcome> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let mut stop_seen: Option<Instant> = None;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if stop.load(Ordering::Relaxed) {
            let since = *stop_seen.get_or_insert_with(Instant::now);
            if since.elapsed() > Duration::from_secs(5) {
                // SAFETY: signals our own child by its pid.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                stop_seen = Some(Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = reader.join().unwrap_or_default();
    Ok(ChildOutcome {
        code: status.code(),
        report: serde_json::from_str(&text).ok(),
    })
}

/// Fills a row from the child's JSON report (the `tune` report: winner, figures, model, machine).
fn fill_from_report(row: &mut QuantRow, v: &serde_json::Value) {
    row.winner = serde_json::from_value::<Candidate>(v["winner"].clone()).ok();
    row.figures = serde_json::from_value::<Figures>(v["winner_figures"].clone()).ok();
    let layers = v["model"]["layers"].as_u64().map(|l| l as u32);
    let offload: Vec<String> = v["machine"]["devices"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter(|d| d["kind"] != "cpu")
                .filter_map(|d| d["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    row.placement = row
        .winner
        .as_ref()
        .map(|w| choice::placement(w, layers, &offload));
}

/// A one-line reason for a child that did not succeed.
fn failure_reason(report: Option<&serde_json::Value>, code: Option<i32>) -> String {
    let from_board = report.and_then(|v| {
        v["leaderboard"]
            .as_array()?
            .iter()
            .filter_map(|e| e["status"].as_str())
            .find(|s| *s != "ok")
            .map(str::to_string)
    });
    match (from_board, code) {
        (Some(s), _) => s,
        (None, Some(c)) => format!("tune exited with code {c}"),
        (None, None) => "tune was killed by a signal".into(),
    }
}

/// Saves the chosen rung's profile (written by its child) with notes on the choice.
fn save_profile(
    path: &Path,
    report: &JointReport,
    args: &TuneArgs,
) -> anyhow::Result<Option<PathBuf>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (mut profile, _) = Profile::from_toml(&text)
        .map_err(|e| anyhow::anyhow!("internal error: the chosen profile does not parse: {e}"))?;
    profile
        .notes
        .extend(report.notes.iter().map(|n| crate::report::one_line(n)));
    profile.validate(false).map_err(|e| {
        anyhow::anyhow!("internal error: the chosen profile does not validate: {e}")
    })?;
    let mut saved = None;
    if !args.no_save {
        let store = Store::open(Store::default_dir()?).context("cannot open the profile store")?;
        let _lock = store.lock().context("cannot lock the profile store")?;
        saved = Some(store.save(&profile).context("cannot save the profile")?);
    }
    if let Some(out) = &args.out {
        profiles::write_atomic(out, &profile.to_toml()?)
            .with_context(|| format!("cannot write {}", out.display()))?;
        saved = saved.or_else(|| Some(out.clone()));
    }
    Ok(saved)
}

fn emit(report: &JointReport, args: &TuneArgs) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_arguments_keep_the_users_flags_and_replace_the_joint_ones() {
        let raw: Vec<OsString> = [
            "autotune",
            "tune",
            "m.gguf",
            "--quants",
            "a.gguf",
            "b.gguf",
            "--ctx",
            "256",
            "--max-kld=0.1",
            "--json",
            "--budget",
            "5m",
            "-t",
            "1,2",
            "--ladder",
            "--out",
            "p.toml",
            "--cache-types",
            "f16,q4_0",
            "--quick",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let a = child_args(
            &raw,
            Path::new("m.gguf"),
            Path::new("/l/m-Q8_0.gguf"),
            &[CacheType::F16, CacheType::Q8_0],
            Duration::from_secs(60),
            Path::new("/t/0.toml"),
        );
        let a: Vec<String> = a.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        assert_eq!(
            a,
            [
                "tune",
                "/l/m-Q8_0.gguf",
                "--ctx",
                "256",
                "-t",
                "1,2",
                "--quick",
                "--no-save",
                "--json",
                "--out",
                "/t/0.toml",
                "--budget",
                "60s",
                "--cache-types",
                "f16,q8_0"
            ]
        );
    }
}
