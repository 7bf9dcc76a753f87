//! `autotune export`: a profile in another runner's format (a shell line, a llama-server preset, a
//! llama-swap entry, an Ollama Modelfile or JSON), on stdout or written atomically to a file.

use crate::cli::{Cli, ExportArgs};
use crate::exit::{self, Exit};
use anyhow::Context as _;
use profiles::ExportFormat;

pub fn run(cli: &Cli, args: &ExportArgs) -> anyhow::Result<i32> {
    // The format first: a typo is a usage error, whatever state the profile is in.
    let format: ExportFormat = args
        .format
        .parse()
        .map_err(|e: profiles::UnknownExportFormat| Exit::new(exit::USAGE, e.to_string()))?;
    let stored = super::apply::resolve(&args.target, args.force, cli.verbose)?;
    let text = profiles::export(&stored.profile, format)
        .map_err(|e| Exit::new(exit::BAD_PROFILE, e.to_string()))?;
    match &args.out {
        Some(out) => {
            profiles::write_atomic(out, &text)
                .with_context(|| format!("cannot write {}", out.display()))?;
            if !cli.quiet {
                eprintln!(
                    "autotune: wrote {} ({format}) from {}",
                    out.display(),
                    stored.path.display()
                );
            }
        }
        None => print!("{text}"),
    }
    Ok(exit::OK)
}
