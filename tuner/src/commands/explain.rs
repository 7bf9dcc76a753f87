//! `autotune explain [PROFILE|MODEL]`: the roofline and the diagnosis of a profile, with charts
//! (`--plot DIR`) and a Markdown report (`--export-markdown FILE`).

use crate::cli::{Cli, ExplainArgs};
use crate::exit::{self, Exit};
use crate::explain::{bandwidth, offload_devices, outputs, roofline, Explanation};
use crate::{probe, session};
use anyhow::Context as _;
use profiles::{Profile, Roofline, Store, StoredProfile};
use search_space::gguf::GgufInfo;
use search_space::identity::ModelIdentity;
use std::path::Path;

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
    let written = outputs::write(
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
        session::inspect_model(model)?;
    }
    let store = Store::open(Store::default_dir().map_err(bad)?).map_err(bad)?;
    let here = probe::probe(verbose, &[])?;
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
