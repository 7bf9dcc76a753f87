//! `autotune export`: profiles in another runner's format (a shell line, llama-server presets for its
//! router, a llama-swap config, an Ollama Modelfile or JSON), on stdout or written atomically to a
//! file. Several profiles (several targets, or `--all` of this machine's) make one file for a runner
//! that serves several models.

use crate::cli::{Cli, ExportArgs};
use crate::exit::{self, Exit};
use crate::stored;
use anyhow::Context as _;
use profiles::{ExportFormat, ProfileError};

pub fn run(cli: &Cli, args: &ExportArgs) -> anyhow::Result<i32> {
    // clap has checked the format's name; several targets for a format of one are a usage error
    // too, whatever state the profiles are in.
    let format = args.format;
    if args.targets.len() > 1 && !format.takes_several() {
        let e = ProfileError::OneProfileOnly {
            format,
            count: args.targets.len(),
        };
        return Err(Exit::new(exit::USAGE, e.to_string()));
    }
    let found = if args.all {
        stored::this_machines(args.force, cli.verbose)?
    } else {
        stored::resolve_all(&args.targets, args.force, cli.verbose)?
    };
    let profiles: Vec<&profiles::Profile> = found.iter().map(|s| &s.profile).collect();
    let mut text = profiles::export_many(&profiles, format).map_err(|e| {
        // `--all` found several for a format of one.
        let code = match e {
            ProfileError::OneProfileOnly { .. } => exit::USAGE,
            _ => exit::BAD_PROFILE,
        };
        Exit::new(code, e.to_string())
    })?;
    if let (ExportFormat::Args, [p]) = (format, profiles.as_slice()) {
        // A comment line of the shell's: the command line's cache with what it costs in quality.
        text = format!("# quality {}\n{text}", stored::quality_line(p));
    }
    match &args.out {
        Some(out) => {
            profiles::write_atomic(out, &text)
                .with_context(|| format!("cannot write {}", out.display()))?;
            if !cli.quiet {
                let from: Vec<String> =
                    found.iter().map(|s| s.path.display().to_string()).collect();
                eprintln!(
                    "autotune: wrote {} ({format}) from {}",
                    out.display(),
                    from.join(", ")
                );
            }
        }
        None => print!("{text}"),
    }
    Ok(exit::OK)
}
