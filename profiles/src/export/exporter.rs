//! What every format's exporter is ([`Exporter`]) and the pieces several formats write alike: where
//! a profile came from, the environment as shell assignments, the names of several profiles' sections.

use crate::error::Result;
use crate::profile::Profile;
use crate::server_args::shell_quote;
use std::collections::BTreeMap;

/// One format: profiles in, the file's text out.
pub trait Exporter {
    /// Whether one file of this format can hold several profiles (a runner serving several models).
    fn takes_several(&self) -> bool;

    /// `profiles` in this format, ending in a newline. [`export_many`](super::export_many) hands it
    /// at least one profile, and only one unless [`Exporter::takes_several`]; each one validated.
    fn export(&self, profiles: &[&Profile]) -> Result<String>;
}

/// The comment line that says where a profile came from and what it measured.
fn origin(p: &Profile) -> String {
    format!(
        "autotune profile for {} on {} (llama.cpp {}): {:.1} t/s prompt, {:.1} t/s generation",
        p.model.file_name, p.machine.hostname, p.llama.version, p.figures.pp_tps, p.figures.tg_tps
    )
}

/// The comment lines that say where a profile came from and what its cache costs in quality (the
/// line `show` and `apply` print: its figures within the gate, lossless, or not checked and why),
/// each after `prefix`.
pub(super) fn about(p: &Profile, prefix: &str) -> String {
    let model = shell_quote(&[p.model.path.to_string_lossy()]);
    let quality = crate::quality::quality_line(p.quality.as_ref(), &p.winner, &model);
    format!("{prefix}{}\n{prefix}quality {quality}\n", origin(p))
}

/// `env` as a POSIX shell's assignments before a command (`A=1 B=2`), each value quoted where it
/// needs to be; the name is left bare, since a quoted name makes the shell read a command instead.
pub(super) fn env_assignments(env: &BTreeMap<String, String>) -> String {
    (env.iter())
        .map(|(name, v)| format!("{name}={}", shell_quote(&[v])))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The profiles' names in a file of several: each model's stem, with `-2`, `-3`, … after a stem that
/// came before (the same file name in two folders).
pub(super) fn section_names(ps: &[&Profile]) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(ps.len());
    for p in ps {
        let stem = p.model_stem();
        let mut name = stem.clone();
        let mut n = 1;
        while names.contains(&name) {
            n += 1;
            name = format!("{stem}-{n}");
        }
        names.push(name);
    }
    names
}
