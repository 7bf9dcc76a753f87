//! `autotune explain [PROFILE|MODEL]`: the roofline and the diagnosis of a profile, with charts
//! (`--plot DIR`) and a Markdown report (`--export-markdown FILE`). Also [`after_tune`], which shows
//! the same right after a tuning run.

use crate::cli::{Cli, ExplainArgs, TuneArgs};
use crate::exit::{self, Exit};
use crate::explain::{bandwidth, charts, markdown, offload_devices, roofline, Explanation};
use anyhow::Context as _;
use profiles::{Profile, Roofline, Store, StoredProfile};
use search_space::gguf::GgufInfo;
use search_space::identity::ModelIdentity;
use std::path::{Path, PathBuf};

pub fn run(cli: &Cli, args: &ExplainArgs) -> anyhow::Result<i32> {
    let stored = find(args.target.as_deref(), cli.verbose)?;
    for w in &stored.warnings {
        eprintln!("autotune: warning: {}: {w}", stored.path.display());
    }
    let mut profile = stored.profile;
    if profile.roofline.is_none() {
        let model = args.target.as_deref().filter(|t| !is_profile_file(t));
        profile.roofline = recompute_roofline(&profile, model);
    }
    let explanation = Explanation::of(&profile);
    let stem = stored
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| profile.model_stem());
    let written = write_outputs(
        &profile,
        &explanation,
        args.plot.as_deref(),
        args.export_markdown.as_deref(),
        &stem,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&explanation)?);
        for line in written {
            eprintln!("{line}");
        }
    } else {
        println!("profile     {}\n", stored.path.display());
        print!("{}", explanation.render(&profile));
        for line in written {
            println!("{line}");
        }
    }
    Ok(exit::OK)
}

/// After `autotune tune` saved `profile`: the roofline and diagnosis after the table (on stderr with
/// `--json`, whose stdout is the report), then the charts (`--plot`, beside the profile) and the
/// Markdown report (`--export-markdown`).
/// The profile is saved by then, so a chart or report that cannot be written is a warning.
pub fn after_tune(args: &TuneArgs, profile: &Profile, profile_path: Option<&Path>) {
    if let Err(e) = show_after_tune(args, profile, profile_path) {
        eprintln!(
            "autotune: warning: {}",
            crate::report::one_line(&format!("{e:#}"))
        );
    }
}

fn show_after_tune(
    args: &TuneArgs,
    profile: &Profile,
    profile_path: Option<&Path>,
) -> anyhow::Result<()> {
    let explanation = Explanation::of(profile);
    let stem = profile_path
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| profile.model_stem());
    let dir = profile_path
        .and_then(|p| p.parent())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let written = write_outputs(
        profile,
        &explanation,
        args.plot.then_some(dir.as_path()),
        args.export_markdown.as_deref(),
        &stem,
    )?;
    let mut text = format!("\n{}", explanation.render(profile));
    for line in written {
        text.push_str(&line);
        text.push('\n');
    }
    if args.json {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    Ok(())
}

/// Charts into `plot_dir`, the Markdown report to `markdown` (with charts beside it when no
/// `plot_dir` is given); returns one line per file written.
fn write_outputs(
    profile: &Profile,
    explanation: &Explanation,
    plot_dir: Option<&Path>,
    markdown: Option<&Path>,
    stem: &str,
) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::new();
    let md_dir = markdown.map(|m| {
        m.parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    });
    let chart_dir = plot_dir.map(Path::to_path_buf).or_else(|| md_dir.clone());
    let written = match &chart_dir {
        Some(dir) => charts::write(profile, explanation, dir, stem)?,
        None => Vec::new(),
    };
    for c in &written {
        lines.push(format!("chart       {} ({})", c.path.display(), c.title));
    }
    if let (Some(file), Some(dir)) = (markdown, md_dir) {
        let text = markdown::render(profile, explanation, &written, &dir);
        profiles::write_atomic(file, &text)
            .with_context(|| format!("cannot write {}", file.display()))?;
        lines.push(format!("report      {}", file.display()));
    }
    Ok(lines)
}

fn is_profile_file(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
}

/// The profile `target` names: a profile file, or this machine's stored profile for a model file;
/// without a target, this machine's newest stored profile. Staleness does not matter here: any
/// profile can be explained.
fn find(target: Option<&Path>, verbose: bool) -> anyhow::Result<StoredProfile> {
    let bad = |e: profiles::ProfileError| {
        Exit::new(
            exit::BAD_PROFILE,
            e.to_string()
                .lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join("; "),
        )
    };
    if let Some(t) = target.filter(|t| is_profile_file(t)) {
        let stored = StoredProfile::read(t).map_err(bad)?;
        stored
            .profile
            .validate(false)
            .map_err(|e| bad(e.with_path(&stored.path)))?;
        return Ok(stored);
    }
    if let Some(model) = target {
        crate::commands::tune::inspect_model(model)?;
    }
    let store = Store::open(Store::default_dir().map_err(bad)?).map_err(bad)?;
    let here = crate::commands::doctor::probe(verbose, &[])?;
    let found = match target {
        Some(model) => {
            let id = ModelIdentity::of_file(model)
                .with_context(|| format!("{}: cannot read", model.display()))?;
            store
                .find(&here.machine.fingerprint, &id.fingerprint)
                .map_err(bad)?
        }
        None => {
            let newest = store
                .list()
                .map_err(bad)?
                .into_iter()
                .filter_map(|e| e.result.ok().map(|s| (e.path, s)))
                .filter(|(_, s)| s.machine_fingerprint == here.machine.fingerprint)
                .max_by_key(|(_, s)| s.created_unix);
            newest
                .map(|(path, _)| StoredProfile::read(&path))
                .transpose()
                .map_err(bad)?
        }
    };
    let Some(stored) = found else {
        let what = match target {
            Some(m) => format!(
                "{}: no profile for this model on this machine; run `autotune {}` first",
                m.display(),
                m.display()
            ),
            None => format!(
                "no profile for this machine in {}; run `autotune MODEL.gguf` first",
                store.dir().display()
            ),
        };
        return Err(Exit::new(exit::BAD_PROFILE, what));
    };
    stored
        .profile
        .validate(false)
        .map_err(|e| bad(e.with_path(&stored.path)))?;
    Ok(stored)
}

/// For a profile written before the roofline was recorded: the token's reads from the model file
/// (`model`, else the profile's model path) when it is the same file, and the bandwidth measured now
/// when this is the machine the profile was measured on (same host name and CPU).
fn recompute_roofline(profile: &Profile, model: Option<&Path>) -> Option<Roofline> {
    let path = model.unwrap_or(&profile.model.path);
    let info = GgufInfo::inspect(path).ok()?;
    let id = ModelIdentity::of_file(path).ok()?;
    if id.fingerprint != profile.model.fingerprint {
        return None;
    }
    let here = crate::machine::Machine::probe(Vec::new());
    let same_machine = here.hostname == profile.machine.hostname && here.cpu == profile.machine.cpu;
    let bw = if same_machine {
        bandwidth::measure_cpu()
    } else {
        None
    };
    eprintln!(
        "autotune: the profile has no roofline record; computed it from {}{}",
        path.display(),
        if bw.is_some() {
            " and a bandwidth probe run now"
        } else {
            " (bandwidth not measured: another machine)"
        }
    );
    let offload = !offload_devices(profile).is_empty();
    Some(roofline::roofline(
        &info,
        &profile.winner,
        &profile.workload,
        offload,
        bw.as_ref(),
    ))
}

/// The roofline of a run's winner, for the profile: the token's reads from the model header, the
/// CPU's bandwidth and each non-CPU device's (through `rpc`'s servers where those are the devices),
/// measured now (call it after the workers have stopped, on a quiet machine).
pub fn roofline_for_run(info: &GgufInfo, profile: &Profile, rpc: &[String]) -> Roofline {
    let bw = bandwidth::measure_cpu();
    let devices = offload_devices(profile);
    let mut r = roofline::roofline(
        info,
        &profile.winner,
        &profile.workload,
        !devices.is_empty(),
        bw.as_ref(),
    );
    r.device_bandwidth = bandwidth::measure_devices(&devices, rpc);
    r
}
