//! Profiles in use: the one a command names (a profile file, or a model file's profile for this
//! machine in the store), or every profile of this machine, each checked before anything uses it
//! (`apply`, `export`): valid, with its RPC servers up, and not stale.

use crate::exit::{self, Exit};
use crate::probe::{self, Probe};
use crate::session;
use crate::term::error_line;
use anyhow::Context as _;
use profiles::{Profile, Store, StoredProfile};
use search_space::identity::ModelIdentity;
use std::path::{Path, PathBuf};

/// Finds the profile `target` names and checks that it may be used: a `.toml` file is read as a profile;
/// anything else is a model file whose profile for this machine is looked up in the store.
///
/// The profile must validate with its model path (a hand-edited file cannot put more on llama-server's
/// command line than its winner), and must not be stale: measured on another machine, with other
/// devices, another llama.cpp build or another model file. A stale profile is refused unless `force`.
/// Errors carry exit code 5 (bad profile) and fit on one line.
pub fn resolve(target: &Path, force: bool, verbose: bool) -> anyhow::Result<StoredProfile> {
    let mut found = resolve_all(std::slice::from_ref(&target.to_path_buf()), force, verbose)?;
    Ok(found.remove(0))
}

/// [`resolve`] for each target, in order, with one look at this machine's devices. The first that
/// cannot be used is the error.
pub fn resolve_all(
    targets: &[PathBuf],
    force: bool,
    verbose: bool,
) -> anyhow::Result<Vec<StoredProfile>> {
    // A damaged model file is refused before llama.cpp is asked anything.
    for target in targets.iter().filter(|t| !is_profile_file(t)) {
        session::inspect_model(target)?;
    }
    let here = probe::probe(verbose, &[])?;
    targets
        .iter()
        .map(|target| vet(lookup(target, &here)?, &here, force, verbose))
        .collect()
}

/// The newest profile of every model tuned on this machine that may be used. One that cannot (stale,
/// invalid, its RPC servers down, unreadable) is left out with a warning naming it and why, unless
/// `force` takes a stale one anyway; none left is an error (exit 5).
pub fn this_machines(force: bool, verbose: bool) -> anyhow::Result<Vec<StoredProfile>> {
    let here = probe::probe(verbose, &[])?;
    let store = Store::open(Store::default_dir().map_err(bad_profile)?).map_err(bad_profile)?;
    let found = store
        .for_machine(&here.machine.fingerprint)
        .map_err(bad_profile)?;
    for (path, e) in &found.unreadable {
        eprintln!(
            "autotune: warning: left out {}: {}",
            path.display(),
            one_line(&e.to_string())
        );
    }
    let mut usable = Vec::new();
    for stored in found.profiles {
        let path = stored.path.clone();
        match vet(stored, &here, force, verbose) {
            Ok(stored) => usable.push(stored),
            Err(e) => eprintln!(
                "autotune: warning: left out {}: {}",
                path.display(),
                error_line(&e)
            ),
        }
    }
    if usable.is_empty() {
        return Err(Exit::new(
            exit::BAD_PROFILE,
            format!(
                "no usable profile of this machine in {}: run `autotune MODEL.gguf` for each model first",
                store.dir().display()
            ),
        ));
    }
    Ok(usable)
}

fn is_profile_file(target: &Path) -> bool {
    target
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
}

/// The profile file `target`, or the store's profile for model file `target` on this machine.
fn lookup(target: &Path, here: &Probe) -> anyhow::Result<StoredProfile> {
    if is_profile_file(target) {
        return StoredProfile::read(target).map_err(bad_profile);
    }
    let id = ModelIdentity::of_file(target)
        .with_context(|| format!("{}: cannot read", target.display()))?;
    let store = Store::open(Store::default_dir().map_err(bad_profile)?).map_err(bad_profile)?;
    let found = store
        .find(&here.machine.fingerprint, &id.fingerprint)
        .map_err(bad_profile)?
        .ok_or_else(|| {
            Exit::new(
                exit::BAD_PROFILE,
                format!(
                    "{}: no profile for this model on this machine; run `autotune {}` first",
                    target.display(),
                    profiles::shell_quote(&[target.to_string_lossy()])
                ),
            )
        })?;
    Ok(found)
}

/// Checks a profile before use: valid, its RPC servers (if any) connected, and not stale unless
/// `force` (then with a warning). `here` is this machine without RPC servers.
fn vet(
    stored: StoredProfile,
    here: &Probe,
    force: bool,
    verbose: bool,
) -> anyhow::Result<StoredProfile> {
    for w in &stored.warnings {
        eprintln!("autotune: warning: {}: {w}", stored.path.display());
    }
    stored
        .profile
        .validate(true)
        .map_err(|e| bad_profile(e.with_path(&stored.path)))?;

    let with_rpc;
    let here = if stored.profile.rpc.is_empty() {
        here
    } else {
        // The profile's layers live on RPC servers: connect them (a server that is down is an error
        // naming it) and see their devices as llama-server will.
        with_rpc = probe::probe(verbose, &stored.profile.rpc).map_err(|e| {
            Exit::new(
                exit::BAD_PROFILE,
                format!(
                    "profile {} runs layers on RPC servers ({}): {}",
                    stored.path.display(),
                    stored.profile.rpc.join(", "),
                    error_line(&e)
                ),
            )
        })?;
        &with_rpc
    };
    let changes = staleness(&stored.profile, here);
    if !changes.is_empty() {
        let reason = format!(
            "profile {} is stale: {}",
            stored.path.display(),
            changes.join("; ")
        );
        if !force {
            return Err(Exit::new(
                exit::BAD_PROFILE,
                format!(
                    "{reason}; tune again with `autotune {}`, or pass --force to use it anyway",
                    profiles::shell_quote(&[stored.profile.model.path.to_string_lossy()])
                ),
            ));
        }
        eprintln!("autotune: warning: {reason} (used anyway: --force)");
    }
    Ok(stored)
}

/// Why a profile is stale here, in one line, or `None` when it is not (for `show`, which shows it
/// either way). `here` is this machine with the profile's RPC servers connected, if it has any.
pub fn stale_note(p: &Profile, here: &Probe) -> Option<String> {
    let changes = staleness(p, here);
    (!changes.is_empty()).then(|| {
        format!(
            "stale: {}; apply and export refuse it without --force: tune again with `autotune {}`",
            changes.join("; "),
            profiles::shell_quote(&[p.model.path.to_string_lossy()])
        )
    })
}

/// The winner's quality in one line (`show`, `apply`, `export --format args`): its record's, or for
/// a profile written before the quality gate, a flag on a lossy cache nobody measured.
pub fn quality_line(p: &Profile) -> String {
    let model = profiles::shell_quote(&[p.model.path.to_string_lossy()]);
    profiles::quality_line(p.quality.as_ref(), &p.winner, &model)
}

/// The names of `(name, backend)` devices, RPC ones only when `uses_rpc`.
fn device_names<'a>(
    devices: impl Iterator<Item = (&'a str, &'a str)>,
    uses_rpc: bool,
) -> Vec<String> {
    devices
        .filter(|(_, backend)| uses_rpc || !backend.eq_ignore_ascii_case("RPC"))
        .map(|(name, _)| name.to_string())
        .collect()
}

fn staleness(p: &Profile, here: &Probe) -> Vec<String> {
    let mut changes = Vec::new();
    if p.machine.fingerprint != here.machine.fingerprint {
        changes.push(format!(
            "measured on another machine (fingerprint {}, this one {})",
            short(&p.machine.fingerprint),
            short(&here.machine.fingerprint)
        ));
    }
    // RPC devices count when the profile uses them (its `rpc` servers, connected by `resolve`); a run
    // that merely had them connected left no trace in the winner.
    let uses_rpc = !p.rpc.is_empty();
    // Of the run's RPC devices, those of the servers the profile keeps (a host after the last one the
    // winner used is left out of `rpc`, and so not connected now).
    let kept = |d: &&profiles::DeviceRef| {
        !d.backend.eq_ignore_ascii_case("RPC") || p.rpc.contains(&d.description)
    };
    let was = device_names(
        (p.machine.devices.iter())
            .filter(kept)
            .map(|d| (&*d.name, &*d.backend)),
        uses_rpc,
    );
    let now = device_names(
        here.machine.devices.iter().map(|d| (&*d.name, &*d.backend)),
        uses_rpc,
    );
    if was != now {
        changes.push(format!(
            "devices were [{}], now [{}]",
            was.join(", "),
            now.join(", ")
        ));
    }
    let offered: Vec<&str> = (here.machine.devices.iter())
        .chain(here.skipped_devices.iter().map(|s| &s.device))
        .map(|d| d.name.as_str())
        .collect();
    changes.extend(devices_not_offered(p, &offered));
    let build = |version: &str, variant: Option<&str>| match variant {
        Some(v) => format!("{version} ({v})"),
        None => version.to_string(),
    };
    let was = build(&p.llama.version, p.llama.cpu_variant.as_deref());
    let now = build(&here.llama_version, here.cpu_variant.as_deref());
    if was != now {
        changes.push(format!("llama.cpp was {was}, now {now}"));
    }
    if let Some(why) = &p.quality_unreadable {
        changes.push(format!(
            "its [quality] record does not parse ({why}): what its KV cache's quality was measured with is unknown"
        ));
    }
    match ModelIdentity::of_file(&p.model.path) {
        Ok(id) if id.fingerprint == p.model.fingerprint => {}
        Ok(id) => changes.push(format!(
            "model file {} changed (fingerprint {}, now {})",
            p.model.path.display(),
            short(&p.model.fingerprint),
            short(&id.fingerprint)
        )),
        Err(e) => changes.push(format!(
            "model file {} cannot be read: {e}",
            p.model.path.display()
        )),
    }
    changes
}

/// The winner's `--device` names that llama.cpp does not offer here (`offered`: the devices it
/// lists and those it skips, such as Vulkan0 beside CUDA0): a profile measured through a backend
/// whose module is gone, in one line.
fn devices_not_offered(p: &Profile, offered: &[&str]) -> Option<String> {
    let missing: Vec<&str> = (p.winner.devices.iter())
        .map(String::as_str)
        .filter(|d| !offered.contains(d))
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "the winner runs on {}, which llama.cpp does not offer here (`autotune doctor` says which backend modules are loaded)",
            missing.join(", ")
        )
    })
}

fn short(fingerprint: &str) -> &str {
    fingerprint.get(..12).unwrap_or(fingerprint)
}

/// A profile or store error as exit code 5, on one line (the profiles crate puts the offending line of
/// the file and the advice on lines of their own).
fn bad_profile(e: profiles::ProfileError) -> anyhow::Error {
    Exit::new(exit::BAD_PROFILE, one_line(&e.to_string()))
}

pub(crate) fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_winner_on_a_device_this_build_does_not_offer_is_stale() {
        let mut p = profiles::example_profile();
        p.winner.devices = vec!["Vulkan0".into()];
        assert_eq!(devices_not_offered(&p, &["CPU", "CUDA0", "Vulkan0"]), None);
        assert_eq!(
            devices_not_offered(&p, &["CPU", "CUDA0"]).as_deref(),
            Some("the winner runs on Vulkan0, which llama.cpp does not offer here (`autotune doctor` says which backend modules are loaded)")
        );
        p.winner.devices.clear();
        assert_eq!(devices_not_offered(&p, &["CPU"]), None);
    }

    #[test]
    fn profile_errors_become_one_line() {
        assert_eq!(
            one_line("cannot read profile p.toml: line 3, key `winner.threads`: bad\n  3 | threads = \"4\"\nfix it"),
            "cannot read profile p.toml: line 3, key `winner.threads`: bad; 3 | threads = \"4\"; fix it"
        );
    }
}
