//! `autotune`: finds the fastest way to run a GGUF model with llama.cpp on this machine.

mod busy;
mod child;
mod cli;
mod commands;
mod engine;
mod exit;
mod explain;
mod gpus;
mod hosts;
mod inputs;
mod llama;
mod machine;
mod measuring;
mod probe;
mod quant;
mod ram;
mod report;
mod session;
mod speculative;
mod stats;
mod stored;
mod term;
mod tuning;
mod worker;
mod workload;

use clap::Parser;

/// Clap's error message on one line: its first paragraph (up to the blank line before "Usage:").
fn usage_error_line(text: &str) -> String {
    let line = text
        .trim_start()
        .split("\n\n")
        .next()
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if line.is_empty() {
        "error: bad usage".into()
    } else {
        line
    }
}

fn main() {
    let args = cli::with_default_subcommand(std::env::args_os().collect());
    let cli = match cli::Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            if !e.use_stderr() {
                // --help and --version
                let _ = e.print();
                std::process::exit(exit::OK);
            }
            // One line: clap's message ("error: ..." and, for a missing argument, the lines naming
            // it), without the usage block.
            let text = e.render().to_string();
            eprintln!(
                "autotune: {} (see autotune --help)",
                usage_error_line(&text)
            );
            std::process::exit(exit::USAGE);
        }
    };
    if matches!(
        cli.command,
        cli::Command::Doctor(_) | cli::Command::Show(_) | cli::Command::Export(_)
    ) {
        // Commands that only print: `autotune doctor | head` ends quietly like other CLI tools. (Not for
        // commands that talk to workers or servers through pipes: a dead worker must not kill the tuner.)
        // SAFETY: restoring the default disposition of a signal.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match &cli.command {
        cli::Command::Worker => child::serve().map(|_| exit::OK),
        cli::Command::Doctor(a) => commands::doctor::run(&cli, a),
        cli::Command::Show(a) => commands::show::run(&cli, a),
        cli::Command::Tune(a) => commands::tune::run(&cli, a),
        cli::Command::Measure(a) => commands::measure::run(&cli, a),
        cli::Command::Apply(a) => commands::apply::run(&cli, a),
        cli::Command::Export(a) => commands::export::run(&cli, a),
        cli::Command::Verify(a) => commands::verify::run(&cli, a),
        cli::Command::RpcServe(a) => commands::rpc_serve::run(&cli, a),
        cli::Command::Quantize(a) => commands::quantize::run(&cli, a),
        cli::Command::Quality(a) => commands::quality::run(&cli, a),
        cli::Command::Explain(a) => commands::explain::run(&cli, a),
        cli::Command::Draft(a) => commands::draft::run(&cli, a),
        cli::Command::Fit(a) => commands::fit::run(&cli, a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let code = e
                .downcast_ref::<exit::Exit>()
                .map_or(exit::ERROR, |x| x.code);
            // One line, whatever the error carries (a quoted line of a bad file, a source chain).
            eprintln!("autotune: error: {}", term::error_line(&e));
            std::process::exit(code);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage_error(args: &[&str]) -> String {
        let e = cli::Cli::try_parse_from(args).expect_err("a usage error");
        usage_error_line(&e.render().to_string())
    }

    #[test]
    fn a_usage_error_is_one_line_that_names_what_is_missing() {
        assert_eq!(
            usage_error(&["autotune", "export"]),
            "error: the following required arguments were not provided: <TARGETS>..."
        );
        let bogus = usage_error(&["autotune", "tune", "m.gguf", "--bogus"]);
        assert_eq!(bogus, "error: unexpected argument '--bogus' found");
    }

    /// `--format` takes `ExportFormat`'s names and aliases, in any case, and a typo's message
    /// lists the names.
    #[test]
    fn export_formats_come_from_export_format() {
        use profiles::ExportFormat;
        let format = |f: &str| {
            let cli = cli::Cli::try_parse_from(["autotune", "export", "m.gguf", "-f", f]);
            match cli.map(|c| c.command) {
                Ok(cli::Command::Export(a)) => Some(a.format),
                _ => None,
            }
        };
        for &f in ExportFormat::all() {
            assert_eq!(format(&f.to_string()), Some(f));
        }
        assert_eq!(format("Modelfile"), Some(ExportFormat::Ollama));
        assert_eq!(format("ini"), Some(ExportFormat::Presets));
        assert_eq!(format("JSON"), Some(ExportFormat::Json));
        let names: Vec<String> = ExportFormat::all().iter().map(|f| f.to_string()).collect();
        let typo = usage_error(&["autotune", "export", "m.gguf", "--format", "yaml"]);
        assert!(
            typo.contains(&format!("[possible values: {}]", names.join(", "))),
            "{typo}"
        );
    }
}
