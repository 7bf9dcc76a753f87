//! The `llama-swap` format: llama-swap's `models:` map, an entry per profile, each with its
//! llama-server command and the environment its knobs need (the entry's `env:` list).

use super::exporter::{about, section_names, Exporter};
use crate::error::Result;
use crate::profile::Profile;
use crate::server_args::shell_quote;
use std::fmt::Write as _;

pub struct LlamaSwap;

impl Exporter for LlamaSwap {
    fn takes_several(&self) -> bool {
        true
    }

    /// llama-swap runs one model at a time unless its config groups them, which is how the
    /// profiles were measured.
    fn export(&self, ps: &[&Profile]) -> Result<String> {
        let mut out = String::new();
        let several = ps.len() > 1;
        if !several {
            out.push_str(&about(ps[0], "# "));
        }
        let _ = writeln!(out, "models:");
        for (p, name) in ps.iter().zip(section_names(ps)) {
            if several {
                out.push_str(&about(p, "  # "));
            }
            entry(p, &name, &mut out);
        }
        Ok(out)
    }
}

/// One model's entry. llama-swap fills in `${PORT}` and splits `cmd` like a shell, so `${PORT}`
/// stays unquoted and the rest is quoted where needed; `env:` is the list of `NAME=VALUE`
/// strings llama-swap sets for that command alone.
fn entry(p: &Profile, name: &str, out: &mut String) {
    let _ = writeln!(
        out,
        "  \"{name}\":\n    cmd: |\n      llama-server --port ${{PORT}} {}",
        shell_quote(&p.server_args)
    );
    if p.server_env.is_empty() {
        return;
    }
    let _ = writeln!(out, "    env:");
    for (k, v) in &p.server_env {
        let _ = writeln!(out, "      - \"{}\"", yaml_escape(&format!("{k}={v}")));
    }
}

/// `s` inside a YAML double-quoted string. The knobs' values are numbers and names, but the
/// file must stay YAML whatever a profile holds.
fn yaml_escape(s: &str) -> String {
    s.replace('\\', r"\\").replace('"', "\\\"")
}
