//! `fit`'s flags: llama.cpp's own fit under the budgets `tune` would use.

use super::DeviceArgs;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(
    mut_arg("mem_budget", |a| a.help(
        "Memory a device may use, DEVICE=SIZE (e.g. RPC0=300M); repeatable. llama.cpp's fit is told \
         to leave free − SIZE free on that device. Default: its free memory minus --mem-margin"
    )),
    mut_arg("mem_margin", |a| a.help(
        "Memory kept free on every device without a --mem-budget (the same default as `tune`, so the \
         two choices are made under the same budgets)"
    ))
)]
pub struct FitArgs {
    /// The GGUF model file
    pub model: PathBuf,
    /// Context size (-c) the placement must hold; llama.cpp's fit keeps it and moves weights instead
    #[arg(short = 'c', long = "ctx", default_value_t = 4096)]
    pub ctx: u32,
    /// Requests served at once (llama-server's -np): N sequences, each with ctx/N of the context
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 1)]
    pub parallel: u32,
    #[command(flatten)]
    pub devices: DeviceArgs,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
}
