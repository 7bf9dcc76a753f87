//! `autotune`: finds the fastest way to run a GGUF model with llama.cpp on this machine.

mod cli;
mod commands;
mod engine;
mod exit;
mod llama;
mod machine;
mod measurements;
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
            let code = if e.use_stderr() { exit::USAGE } else { exit::OK };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let result = match &cli.command {
        cli::Command::Worker => worker::serve().map(|_| exit::OK),
        cli::Command::Doctor(a) => commands::doctor::run(&cli, a),
        cli::Command::Show(a) => commands::show::run(&cli, a),
        cli::Command::Tune(a) => commands::tune::run(&cli, a),
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
