//! Renders profiles for the tools people run llama.cpp with: a shell line, a llama-server
//! `--models-preset` INI file, a llama-swap `models:` map, an Ollama Modelfile, or JSON.
//!
//! hyperfine's shape (`src/export/mod.rs`): one [`Exporter`] per format, a file each, and
//! [`ExportFormat`] the one list of their names (the CLI's `--format` values come from it). Every
//! exporter is made from the profile's options (`Profile::server_options`, the list its
//! `server_args` are made from) and its `server_env`, so an export cannot say something the profile
//! does not; where a runner cannot take a setting, the export says so in a comment.

mod args;
mod exporter;
mod json;
mod llama_swap;
mod ollama;
mod presets;

pub use exporter::Exporter;

use crate::error::{ProfileError, Result};
use crate::profile::Profile;
use clap::ValueEnum;
use std::fmt;

/// The formats, by the names `--format` takes (clap's `ValueEnum`: kebab-case, with aliases
/// people reach for). Each variant's doc is its line in `autotune export --help`; a format whose
/// file holds several profiles says "several" there (a test holds the doc to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum ExportFormat {
    /// `llama-server` and its arguments on one shell line, the environment it needs in front
    #[value(alias = "shell", alias = "cmd")]
    Args,
    /// An INI file for llama-server's router (`llama-server --models-preset FILE`); several
    /// profiles make one section each
    #[value(alias = "preset", alias = "ini", alias = "models-preset")]
    Presets,
    /// llama-swap's `models:` map for its config.yaml; several profiles make one entry each
    #[value(alias = "llamaswap", alias = "llama_swap")]
    LlamaSwap,
    /// An Ollama Modelfile, with `# autotune:` comments for what Ollama sets server-wide or not at
    /// all
    #[value(alias = "modelfile")]
    Ollama,
    /// The whole profile as JSON; several profiles make an array
    Json,
}

impl ExportFormat {
    /// The exporter that writes this format.
    pub fn exporter(self) -> &'static dyn Exporter {
        match self {
            ExportFormat::Args => &args::Args,
            ExportFormat::Presets => &presets::Presets,
            ExportFormat::LlamaSwap => &llama_swap::LlamaSwap,
            ExportFormat::Ollama => &ollama::Ollama,
            ExportFormat::Json => &json::Json,
        }
    }

    /// Whether one file of this format can hold several profiles.
    pub fn takes_several(self) -> bool {
        self.exporter().takes_several()
    }

    /// Every format, in `--format`'s order.
    pub fn all() -> &'static [ExportFormat] {
        ExportFormat::value_variants()
    }

    /// The names of the formats that take several profiles, as a sentence lists them
    /// ("presets, llama-swap and json"), for messages that say which to use instead.
    pub fn several_names() -> String {
        let names: Vec<String> = (Self::all().iter())
            .filter(|f| f.takes_several())
            .map(ToString::to_string)
            .collect();
        match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

impl fmt::Display for ExportFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.to_possible_value().expect("no format is skipped");
        f.write_str(v.get_name())
    }
}

/// The profile in format `f`, ending in a newline. Expects a validated profile.
pub fn export(p: &Profile, f: ExportFormat) -> Result<String> {
    export_many(&[p], f)
}

/// Several profiles in one file of format `f`, for a runner that serves several models: llama-server's
/// router (presets), llama-swap, or a JSON array. One profile gives what [`export`] gives. Formats that
/// hold one profile refuse several.
pub fn export_many(ps: &[&Profile], f: ExportFormat) -> Result<String> {
    let exporter = f.exporter();
    match ps {
        [] => Err(ProfileError::invalid("export", "names no profile")),
        [_, _, ..] if !exporter.takes_several() => Err(ProfileError::OneProfileOnly {
            format: f,
            count: ps.len(),
        }),
        _ => exporter.export(ps),
    }
}

#[cfg(test)]
mod tests;
