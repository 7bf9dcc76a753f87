//! The `presets` format: an INI file for llama-server's router (`llama-server --models-preset
//! FILE`), a section per profile. Keys are llama-server's long option names without dashes; the
//! file has no quoting, and `;` or `#` start a comment anywhere in a value.
//!
//! A section cannot set environment variables: llama-server reads only its own options from it
//! (`common/preset.cpp` refuses any other key), and its model instances inherit the router's
//! environment (tools/server's README). So the variables the profiles' knobs need go on the
//! router's command line in the `use with:` comment, and where the profiles disagree about them,
//! each section that needs some says so in an `; autotune:` comment.

use super::exporter::{about, env_assignments, section_names, Exporter};
use crate::error::Result;
use crate::profile::Profile;
use std::collections::BTreeMap;
use std::fmt::Write as _;

pub struct Presets;

impl Exporter for Presets {
    fn takes_several(&self) -> bool {
        true
    }

    /// Several models get `--models-max 1` in the advice: each profile was measured with the
    /// machine to itself, and the router keeps up to 4 models loaded at once unless told otherwise.
    fn export(&self, ps: &[&Profile]) -> Result<String> {
        let shared = shared_env(ps);
        let mut out = header(ps, shared);
        let several = ps.len() > 1;
        for (p, name) in ps.iter().zip(section_names(ps)) {
            let _ = writeln!(out);
            if several {
                out.push_str(&about(p, "; "));
            }
            if shared.is_none() && !p.server_env.is_empty() {
                let _ = writeln!(
                    out,
                    "; autotune: this model was measured with {} in llama-server's environment, which a preset \
                     cannot set: every model the router starts inherits the router's environment, and the \
                     models here were not all measured with it (give this one a server of its own, `--format args`)",
                    env_assignments(&p.server_env)
                );
            }
            section(p, &name, &mut out);
        }
        Ok(out)
    }
}

/// The environment every profile needs, where they all need the same (none at all included):
/// the router can be started with it.
fn shared_env<'p>(ps: &[&'p Profile]) -> Option<&'p BTreeMap<String, String>> {
    let first = &ps.first()?.server_env;
    ps.iter().all(|p| &p.server_env == first).then_some(first)
}

/// The comments that say how to start the router, and `version = 1`.
fn header(ps: &[&Profile], shared: Option<&BTreeMap<String, String>>) -> String {
    let mut out = String::new();
    let several = ps.len() > 1;
    if !several {
        out.push_str(&about(ps[0], "; "));
    }
    let env = shared.map(env_assignments).unwrap_or_default();
    let env = if env.is_empty() { env } else { env + " " };
    if several {
        let _ = writeln!(
            out,
            "; use with: {env}llama-server --models-preset FILE --models-max 1\n\
             ; (each profile was measured with the machine to itself: one model loaded at a time)"
        );
    } else {
        let _ = writeln!(out, "; use with: {env}llama-server --models-preset FILE");
    }
    if !env.is_empty() {
        let _ = writeln!(
            out,
            "; autotune: a preset cannot set environment variables, and the models the router starts \
             inherit its environment: start it with the variables above"
        );
    }
    let _ = writeln!(out, "version = 1");
    out
}

/// One profile's `[name]` section: its llama-server options by long name.
fn section(p: &Profile, name: &str, out: &mut String) {
    let model = p.model.path.to_string_lossy();
    if model.contains([';', '#']) {
        let _ = writeln!(
            out,
            "; autotune: the model path contains ';' or '#', which this file format reads as a comment: \
             rename the file or pass -m on the command line"
        );
    }
    let _ = writeln!(out, "[{name}]");
    for o in p.server_options() {
        let _ = writeln!(out, "{} = {}", o.long, o.value.as_deref().unwrap_or("true"));
    }
}
