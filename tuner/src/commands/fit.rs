//! `autotune fit MODEL`: what llama.cpp's own fit routine (`common_fit_params`, llama-server's
//! default `--fit`) chooses under the same budgets autotune uses, the llama-server flags that pin that
//! choice, and autotune's dry-run prediction of its bytes per device against the budgets — so the two
//! placements can be compared for memory safety and, with `autotune measure`, for speed.

use crate::cli::{Cli, FitArgs};
use crate::engine::baseline::FitPlacement;
use crate::exit::{self, Exit};
use crate::llama::{ContextSettings, ModelSettings};
use crate::measuring::{FitAnswer, FitRequest};
use crate::measuring::{MeasureRequest, Workload};
use crate::probe;
use crate::session;
use crate::worker::WorkerPool;
use crate::worker::{Request, Response};
use search_space::size::format_size;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Predicted bytes of the fit's placement on one device, against autotune's budget there.
#[derive(Debug, Serialize)]
pub struct DeviceFit {
    pub device: String,
    pub predicted_bytes: u64,
    pub budget_bytes: Option<u64>,
    pub within_budget: bool,
}

#[derive(Debug, Serialize)]
pub struct FitReport {
    pub model: PathBuf,
    pub n_ctx: u32,
    /// llama.cpp's answer: status, layers, tensor split, tensor-buffer overrides.
    pub fit: FitAnswer,
    pub status: &'static str,
    /// Layers offloaded to non-CPU devices (llama.cpp's -1, "all", resolved to a count).
    pub n_gpu_layers: u32,
    /// The overrides as `--n-cpu-moe N`, where they say exactly that.
    pub n_cpu_moe: Option<u32>,
    /// llama-server flags that pin this placement (also accepted by `autotune measure`).
    pub server_args: Vec<String>,
    /// autotune's dry-run prediction of this placement per device (llama.cpp's defaults otherwise).
    pub predicted: Vec<DeviceFit>,
    /// Why there is no prediction, when the dry run failed.
    pub prediction_error: Option<String>,
    /// Every predicted device within its budget (CPU included: llama.cpp's fit assumes host
    /// memory is unlimited, autotune does not).
    pub memory_safe: bool,
}

pub fn run(cli: &Cli, a: &FitArgs) -> anyhow::Result<i32> {
    let info = session::inspect_model(&a.model)?;
    let model = std::fs::canonicalize(&a.model)?;
    if a.ctx == 0 {
        return Err(Exit::new(exit::USAGE, "--ctx must be at least 1"));
    }
    super::settings::check_parallel(a.parallel)?;
    let rpc = &a.devices.rpc.servers;
    let d = probe::probe(cli.verbose, rpc)?;
    let budgets = session::budgets_of(&a.devices.mem_budget, a.devices.mem_margin, &d.machine)?;
    let default_margin = a.devices.mem_margin;

    let answer = llama_fit(FitRequest {
        model: model.clone(),
        rpc: rpc.clone(),
        n_ctx: a.ctx,
        sequences: a.parallel,
        budgets: budgets.clone(),
        default_margin,
    })?;
    let placement = FitPlacement::of(&answer, info.block_count.unwrap_or(0));
    let n_gpu_layers = placement.n_gpu_layers;
    let n_cpu_moe = placement.n_cpu_moe;
    let settings = ModelSettings {
        n_gpu_layers,
        no_alloc: true,
        rpc: rpc.clone(),
        n_cpu_moe: n_cpu_moe.unwrap_or(0),
        tensor_overrides: placement.tensor_overrides,
        tensor_split: placement.tensor_split,
        ..Default::default()
    };
    let server_args = server_args(&answer, &settings, rpc, a.parallel);

    let (predicted, prediction_error) = predict(
        &model,
        settings,
        (answer.n_ctx, a.parallel),
        d.machine.llama_default_threads(),
        &budgets,
    );
    let report = FitReport {
        model,
        n_ctx: answer.n_ctx,
        status: answer.status_name(),
        n_gpu_layers,
        n_cpu_moe,
        server_args,
        memory_safe: prediction_error.is_none() && predicted.iter().all(|p| p.within_budget),
        predicted,
        prediction_error,
        fit: answer,
    };
    // Every worker is gone: `autotune fit … | head` may end quietly like other CLI tools.
    // SAFETY: restoring the default disposition of a signal.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(exit::OK)
}

/// llama.cpp's fit, in a worker of its own (it aborts like any llama.cpp call, and a ggml RPC
/// server serves one client at a time: the worker lets go before the dry run connects).
fn llama_fit(request: FitRequest) -> anyhow::Result<FitAnswer> {
    let answer = crate::worker::pool::llama_fit(&request, Duration::from_secs(600), &|| false)
        .map_err(|f| {
            Exit::new(
                exit::NOTHING_MEASURED,
                format!("llama.cpp's fit failed: {f}"),
            )
        })?;
    if answer.status == 2 {
        return Err(Exit::new(
            exit::NOTHING_MEASURED,
            format!("llama.cpp's fit reported an error: {}", answer.log_tail),
        ));
    }
    Ok(answer)
}

/// autotune's dry-run prediction of the fit's placement per device, against the budgets, with
/// llama.cpp's default context settings; or why there is none.
fn predict(
    model: &std::path::Path,
    settings: ModelSettings,
    (n_ctx, sequences): (u32, u32),
    threads: u32,
    budgets: &profiles::Budgets,
) -> (Vec<DeviceFit>, Option<String>) {
    let dry = MeasureRequest {
        expect: Vec::new(),
        give_up: None,
        phases: search_space::Phases::BOTH,
        model: model.to_path_buf(),
        settings,
        context: ContextSettings::defaults(n_ctx, threads).with_sequences(sequences),
        workload: Workload {
            n_ctx,
            n_prompt: 1,
            n_gen: 1,
            depth: 0,
            n_parallel: sequences,
            name: String::new(),
        },
        seed: 1,
    };
    let mut pool = WorkerPool::new(1, Duration::from_secs(600));
    let outcome = match pool.call(&Request::Footprint(dry), &|| false) {
        Ok(Response::Footprint(r)) => (
            r.per_device
                .iter()
                .map(|p| {
                    let budget = budgets.of(&p.device);
                    DeviceFit {
                        device: p.device.clone(),
                        predicted_bytes: p.bytes,
                        budget_bytes: budget,
                        within_budget: budget.is_none_or(|b| p.bytes <= b),
                    }
                })
                .collect(),
            None,
        ),
        Ok(_) => (Vec::new(), Some("unexpected answer to a dry run".into())),
        Err(f) => (Vec::new(), Some(format!("dry run failed: {f}"))),
    };
    pool.shutdown();
    outcome
}

/// llama-server flags for the fit's placement: `-c`, `-ngl`, `--n-cpu-moe` or `-ot`, `-ts`, `--rpc`.
fn server_args(f: &FitAnswer, s: &ModelSettings, rpc: &[String], parallel: u32) -> Vec<String> {
    let mut v = vec!["-c".to_string(), f.n_ctx.to_string()];
    if parallel > 1 {
        v.extend(["-np".to_string(), parallel.to_string()]);
    }
    v.extend(["-ngl".to_string(), s.n_gpu_layers.to_string()]);
    if s.n_cpu_moe > 0 {
        v.extend(["--n-cpu-moe".to_string(), s.n_cpu_moe.to_string()]);
    }
    for (pattern, buft) in &s.tensor_overrides {
        v.extend(["-ot".to_string(), format!("{pattern}={buft}")]);
    }
    if !s.tensor_split.is_empty() {
        let split: Vec<String> = s.tensor_split.iter().map(|x| x.to_string()).collect();
        v.extend(["-ts".to_string(), split.join(",")]);
    }
    if !rpc.is_empty() {
        v.extend(["--rpc".to_string(), rpc.join(",")]);
    }
    v
}

fn print_report(r: &FitReport) {
    let f = &r.fit;
    println!("llama.cpp fit   {} (n_ctx {})", r.status, r.n_ctx);
    for d in &f.devices {
        println!(
            "  device {:<8} free {:>10}  budget {:>10}  margin given to the fit {:>10}",
            d.name,
            format_size(d.free),
            format_size(d.budget),
            format_size(d.margin)
        );
    }
    println!("  n_gpu_layers  {}", r.n_gpu_layers);
    if !f.tensor_split.is_empty() {
        println!("  tensor split  {:?}", f.tensor_split);
    }
    for o in &f.overrides {
        println!(
            "  override      {} -> {} ({})",
            o.pattern, o.buffer_type, o.device
        );
    }
    if let Some(n) = r.n_cpu_moe {
        println!("  as --n-cpu-moe {n}");
    }
    if r.status != "success" {
        println!("  fit log: {}", f.log_tail);
    }
    println!(
        "llama-server flags  {}",
        profiles::shell_quote(&r.server_args)
    );
    println!("autotune's dry-run prediction of this placement");
    if let Some(e) = &r.prediction_error {
        println!("  {e}");
    }
    for p in &r.predicted {
        println!(
            "  {:<8} {:>10}  budget {:>10}  {}",
            p.device,
            format_size(p.predicted_bytes),
            p.budget_bytes.map_or("-".to_string(), format_size),
            if p.within_budget { "within" } else { "OVER" }
        );
    }
    println!(
        "memory-safe (every device within its budget): {}",
        if r.memory_safe { "yes" } else { "no" }
    );
}
