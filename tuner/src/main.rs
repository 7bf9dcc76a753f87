//! `autotune`: finds the fastest way to run a GGUF model with llama.cpp on this machine.

mod cli;
mod commands;
mod engine;
mod exit;
mod fault;
mod llama;
mod machine;
mod placement;
mod pool;
mod report;
mod stats;
mod trial;
mod worker;

use clap::Parser;

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
            // One line: clap's own first line ("error: ..."), without the usage block.
            let text = e.render().to_string();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("error: bad usage");
            eprintln!("autotune: {} (see autotune --help)", first.trim());
            std::process::exit(exit::USAGE);
        }
    };
    let result = match &cli.command {
        cli::Command::Worker => worker::serve().map(|_| exit::OK),
        cli::Command::Doctor(a) => commands::doctor::run(&cli, a),
        cli::Command::Show(a) => commands::show::run(&cli, a),
        cli::Command::Tune(a) => commands::tune::run(&cli, a),
        cli::Command::Measure(a) => commands::measure::run(&cli, a),
        cli::Command::Apply(a) => commands::apply::run(&cli, a),
        cli::Command::Export(a) => commands::export::run(&cli, a),
        cli::Command::RpcServe(a) => commands::rpc_serve::run(&cli, a),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            let code = e.downcast_ref::<exit::Exit>().map_or(exit::ERROR, |x| x.code);
            eprintln!("autotune: error: {e:#}");
            std::process::exit(code);
        }
    }
}
