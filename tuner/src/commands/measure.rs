//! `autotune measure MODEL [knobs]`: one configuration measured like llama-bench does (a discarded
//! warm-up, then repetitions), through the same worker process and code path as tuning. The fidelity
//! benchmark compares these figures with llama-bench's.

use crate::busy::{self, Watch};
use crate::cli::{Cli, MeasureArgs};
use crate::commands::settings;
use crate::exit::{self, Exit};
use crate::inputs;
use crate::llama::{ContextSettings, ModelSettings};
use crate::measuring::{LoadReport, MeasureRequest, Repetition, Workload};
use crate::probe;
use crate::session::inspect_model;
use crate::stats::{self, Comparison, RoundRate, Sample, Summary, Verdict};
use crate::worker::WorkerPool;
use crate::worker::{Request, Response};
use search_space::knob::{self, Knob};
use search_space::Candidate;
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Serialize)]
pub struct Measurement {
    pub candidate: Candidate,
    pub workload: Workload,
    pub pp: Summary,
    pub tg: Summary,
    /// Prompt processing at the (first) depth: `workload.depth` when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pp_depth: Option<Summary>,
    /// Generation at the (first) depth: `workload.depth` when one was given.
    pub tg_depth: Option<Summary>,
    /// Prompt processing and generation at each depth asked for, when several were (`-d 4096,16384`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub depths: Vec<DepthFigure>,
    pub load: Option<LoadReport>,
    /// The dry-run prediction (`--predict`): bytes per device before anything was allocated.
    pub predicted: Option<LoadReport>,
    /// `-ot PATTERN=BUFT` overrides measured with (a placement from `autotune fit`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tensor_overrides: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tensor_split: Vec<u32>,
    pub llama_version: String,
    pub cpu_variant: Option<String>,
    pub devices: Vec<String>,
    /// Other programs' share of the CPUs' time while it measured (absent where `/proc` cannot say).
    pub others_cpu_share: Option<f64>,
}

/// Prompt processing and generation speed with `depth` tokens in the KV cache.
#[derive(Debug, Serialize)]
pub struct DepthFigure {
    pub depth: u32,
    pub pp: Summary,
    pub tg: Summary,
}

/// The depths to measure at: those above 0, in order, each once.
fn depths_of(a: &MeasureArgs) -> Vec<u32> {
    let mut d: Vec<u32> = a.depth.iter().copied().filter(|&d| d > 0).collect();
    d.sort_unstable();
    d.dedup();
    d
}

/// `-ot PATTERN=BUFT` values as (pattern, buffer type) pairs; the pattern may itself contain `=`.
pub fn tensor_overrides(values: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    values
        .iter()
        .map(|v| match v.rsplit_once('=') {
            Some((p, b)) if !p.is_empty() && !b.is_empty() => Ok((p.to_string(), b.to_string())),
            _ => Err(Exit::new(
                exit::USAGE,
                format!("--override-tensor '{v}': write PATTERN=BUFT, e.g. 'blk\\.3\\.ffn_.*=CPU'"),
            )),
        })
        .collect()
}

pub fn run(cli: &Cli, a: &MeasureArgs) -> anyhow::Result<i32> {
    check_layer_counts(a, &inspect_model(&a.model)?)?;
    let model = std::fs::canonicalize(&a.model)?;
    let d = probe::probe(cli.verbose, &a.rpc.servers)?;
    let (candidate, mut request) = request_of(a, model, &d)?;
    // Always a dry run first: the worker compares its prediction with the memory free right before
    // it loads (the host's RAM included) and refuses rather than run the machine out of memory.
    let predicted = predict(&request, &candidate)?;
    request.expect = (predicted.iter())
        .flat_map(|p| p.per_device.clone())
        .collect();
    let depths = depths_of(a);
    let cpus = d.machine.logical_cpus;
    let watch = Watch::start(&a.rpc.servers);
    let when = "while autotune measured";
    if a.twice {
        if depths.len() > 1 {
            return Err(Exit::new(exit::USAGE, "--twice measures one --depth"));
        }
        let code = twice(a, &request, &candidate)?;
        busy::warn(watch.share(Duration::ZERO), cpus, when);
        return Ok(code);
    }
    let predicted = predicted.filter(|_| a.predict);
    let (reps, load) = repetitions(&request, &candidate, a.reps, &depths)?;
    let others_cpu_share = watch.share(Duration::ZERO);
    busy::warn(others_cpu_share, cpus, when);
    let mut workload = request.workload.clone();
    workload.depth = depths.first().copied().unwrap_or(0);
    let summary = |v: Vec<f64>| Sample::new(v).ok().map(|s| s.summary());
    let at = |d: u32, figure: fn(&Repetition) -> Option<f64>| {
        summary(
            reps.iter()
                .filter(|r| r.0 == d)
                .filter_map(|r| figure(&r.1))
                .collect(),
        )
    };
    let pp_at = |d: u32| at(d, |r| r.pp_depth_tps);
    let tg_at = |d: u32| at(d, |r| r.tg_depth_tps);
    let per_depth = if depths.len() > 1 {
        (depths.iter())
            .filter_map(|&depth| {
                Some(DepthFigure {
                    depth,
                    pp: pp_at(depth)?,
                    tg: tg_at(depth)?,
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let m = Measurement {
        pp: summary(reps.iter().map(|r| r.1.pp_tps).collect()).expect("at least 2 reps"),
        tg: summary(reps.iter().map(|r| r.1.tg_tps).collect()).expect("at least 2 reps"),
        pp_depth: pp_at(workload.depth),
        tg_depth: tg_at(workload.depth),
        depths: per_depth,
        candidate,
        workload,
        load,
        predicted,
        tensor_overrides: request.settings.tensor_overrides.clone(),
        tensor_split: request.settings.tensor_split.clone(),
        llama_version: d.llama_version,
        cpu_variant: d.cpu_variant,
        devices: d.machine.devices.iter().map(|x| x.name.clone()).collect(),
        others_cpu_share,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&m)?);
        return Ok(exit::OK);
    }
    print_text(&m);
    Ok(exit::OK)
}

/// Layer counts the flags give that the model's layers bound (`--n-cpu-ffn`).
fn check_layer_counts(a: &MeasureArgs, info: &search_space::gguf::GgufInfo) -> anyhow::Result<()> {
    let layers = info.block_count.unwrap_or(0);
    if a.n_cpu_ffn > layers {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "--n-cpu-ffn {}: the model has {layers} layers; give at most {layers}",
                a.n_cpu_ffn
            ),
        ));
    }
    Ok(())
}

/// The configuration the flags describe, and its measurement request.
fn request_of(
    a: &MeasureArgs,
    model: std::path::PathBuf,
    d: &probe::Probe,
) -> anyhow::Result<(Candidate, MeasureRequest)> {
    let threads = match a.threads {
        Some(t) => {
            inputs::threads("-t", &[t], inputs::logical_cpus())?;
            t
        }
        None => d.machine.llama_default_threads(),
    };
    let mut candidate = Candidate {
        n_cpu_moe: a.n_cpu_moe,
        n_cpu_ffn: a.n_cpu_ffn,
        devices: a.devices.clone(),
        tensor_split: a.tensor_split.clone(),
        split_mode: a.split_mode,
        kernels: a.kernels,
        host_buffer: a.host_buffer,
        threads_batch: a.threads_batch,
        n_batch: a.batch,
        n_ubatch: a.ubatch,
        type_k: a.cache_type_k,
        type_v: a.cache_type_v,
        flash_attn: a.flash_attn,
        op_offload: a.op_offload,
        kv_offload: a.kv_offload,
        numa: a.numa,
        attn_rot: a.attn_rot,
        ..Candidate::llama_default(threads, a.n_gpu_layers)
    };
    knob::OpOffloadMinBatch
        .set(&mut candidate, &a.op_offload_min_batch.to_string())
        .map_err(|e| Exit::new(exit::USAGE, e.to_string()))?;
    if let Some(t) = a.threads_batch {
        inputs::threads("-tb", &[t], inputs::logical_cpus())?;
    }
    // `-tb` equal to `-t` is llama.cpp's default: one spelling.
    let candidate = candidate.with_threads(candidate.threads, candidate.batch_threads());
    candidate
        .validate()
        .map_err(|e| Exit::new(exit::USAGE, e.to_string()))?;
    if a.reps < 2 {
        return Err(Exit::new(exit::USAGE, "--reps must be at least 2"));
    }
    let workload = Workload {
        n_ctx: a.ctx,
        n_prompt: a.prompt,
        n_gen: a.gen,
        // The deepest asked for must fit; each repetition sets its own.
        depth: depths_of(a).last().copied().unwrap_or(0),
        n_parallel: a.parallel,
        name: String::new(),
    };
    settings::check_workload(&workload)?;
    let request = MeasureRequest {
        expect: Vec::new(),
        give_up: None,
        phases: search_space::Phases::BOTH,
        model,
        // The candidate's settings, with the `-ot` overrides a candidate does not carry.
        settings: ModelSettings {
            tensor_overrides: tensor_overrides(&a.override_tensor)?,
            ..ModelSettings::for_candidate(&candidate, &a.rpc.servers)
        },
        context: ContextSettings::for_candidate(&candidate, a.ctx).with_sequences(a.parallel),
        workload: workload.clone(),
        seed: a.seed,
    };
    Ok((candidate, request))
}

/// `--predict`: the dry run's memory per device (nothing allocated).
fn predict(request: &MeasureRequest, candidate: &Candidate) -> anyhow::Result<Option<LoadReport>> {
    let mut dry = request.clone();
    dry.settings.no_alloc = true;
    let mut pool = WorkerPool::new(1, Duration::from_secs(600));
    let r = match pool.call(&Request::Footprint(dry), &|| false) {
        Ok(Response::Footprint(r)) => Some(r),
        Ok(_) => None,
        Err(f) => {
            return Err(Exit::new(
                exit::NOTHING_MEASURED,
                format!("dry run of {}: {f}", candidate.label()),
            ))
        }
    };
    pool.shutdown();
    Ok(r)
}

/// A repetition and the depth it measured generation at.
type AtDepth = (u32, Repetition);

/// `n` rounds of repetitions in one worker (one load): a repetition at each of `depths` per round
/// (one without a depth when there is none), each tagged with its depth; and the load's report.
fn repetitions(
    request: &MeasureRequest,
    candidate: &Candidate,
    n: u32,
    depths: &[u32],
) -> anyhow::Result<(Vec<AtDepth>, Option<LoadReport>)> {
    let mut pool = WorkerPool::new(1, Duration::from_secs(600));
    let mut reps = Vec::new();
    let mut load = None;
    let depths = if depths.is_empty() { &[0][..] } else { depths };
    let mut req = request.clone();
    for _ in 0..n {
        for &d in depths {
            req.workload.depth = d;
            let r = repetition(&mut pool, &req, &candidate.label())?;
            if r.load.is_some() {
                load = r.load.clone();
            }
            reps.push((d, r));
        }
    }
    pool.shutdown();
    Ok((reps, load))
}

/// The text form: the figures with their statistics, and memory predicted against reported.
fn print_text(m: &Measurement) {
    match m.workload.n_parallel {
        0 | 1 => println!("{}", m.candidate.label()),
        n => println!(
            "{}  ({n} sequences at once: t/s of all together)",
            m.candidate.label()
        ),
    }
    for (pattern, buft) in &m.tensor_overrides {
        println!("  -ot {pattern}={buft}");
    }
    if !m.tensor_split.is_empty() {
        println!("  -ts {:?}", m.tensor_split);
    }
    let row = |name: &str, s: &Summary| {
        println!(
            "  {name:<12} median {:>8.2} t/s  mean {:>8.2} ± {:>6.2}  min {:>8.2}  max {:>8.2}  95% CI [{:.2}, {:.2}] (±{:.1}%)  n={}{}",
            s.median,
            s.mean,
            s.sd,
            s.min,
            s.max,
            s.ci_low,
            s.ci_high,
            100.0 * s.ci_halfwidth,
            s.n,
            if s.outliers > 0 { format!("  ({} outliers)", s.outliers) } else { String::new() }
        )
    };
    row(&format!("pp{}", m.workload.n_prompt), &m.pp);
    row(&format!("tg{}", m.workload.n_gen), &m.tg);
    // As llama-bench names them: pp512 @ d4096, tg128 @ d4096.
    let (p, g) = (m.workload.n_prompt, m.workload.n_gen);
    if m.depths.is_empty() {
        let d = m.workload.depth;
        if let Some(s) = &m.pp_depth {
            row(&format!("pp{p}@d{d}"), s);
        }
        if let Some(s) = &m.tg_depth {
            row(&format!("tg{g}@d{d}"), s);
        }
    }
    for d in &m.depths {
        row(&format!("pp{p}@d{}", d.depth), &d.pp);
        row(&format!("tg{g}@d{}", d.depth), &d.tg);
    }
    if let (Some(p), Some(l)) = (&m.predicted, &m.load) {
        for d in &p.per_device {
            let reported = l
                .per_device
                .iter()
                .find(|x| x.device == d.device)
                .map_or(0, |x| x.bytes);
            let actual = l
                .actual
                .iter()
                .find(|x| x.device == d.device)
                .map(|x| x.bytes);
            println!(
                "  memory {:<8} predicted {:>10}  llama.cpp after load {:>10}  measured {}",
                d.device,
                search_space::size::format_size(d.bytes),
                search_space::size::format_size(reported),
                actual.map_or("-".to_string(), search_space::size::format_size)
            );
        }
        if let Some(read) = l.mapped_in_use {
            println!(
                "  mapped   inference read {} of the {} of the model file llama.cpp counts as mapped \
                 (the rest is page cache the kernel may drop: repacked or offloaded weights)",
                search_space::size::format_size(read),
                search_space::size::format_size(l.mapped_bytes()),
            );
        }
    }
}

/// One repetition of `request` in `pool`'s worker; a failed trial is the command's error.
fn repetition(
    pool: &mut WorkerPool,
    request: &MeasureRequest,
    label: &str,
) -> anyhow::Result<Repetition> {
    match pool.call(&Request::Measure(request.clone()), &|| false) {
        Ok(Response::Measured(r)) => Ok(*r),
        Ok(_) => anyhow::bail!("unexpected answer from the worker"),
        Err(f) => Err(Exit::new(exit::NOTHING_MEASURED, format!("{label}: {f}"))),
    }
}

/// `measure --twice`: the same configuration as candidates A and B, each repetition in a fresh
/// worker (its own load and warm-up), in rounds whose order alternates (A B, B A, ...), then judged
/// with the tuner's decision rule (`stats::decide`: paired over rounds). Identical configurations should come out a tie; a verdict
/// says this machine is noisier than `--noise` allows.
#[derive(Debug, Serialize)]
struct Twice {
    candidate: Candidate,
    workload: Workload,
    noise: f64,
    a: [Summary; 2],
    b: [Summary; 2],
    /// pp, then tg (at the workload's depth when it has one): A relative to B.
    comparisons: [Comparison; 2],
}

fn twice(a: &MeasureArgs, request: &MeasureRequest, candidate: &Candidate) -> anyhow::Result<i32> {
    if !(a.noise > 0.0 && a.noise < 1.0) {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "--noise {} must be between 0 and 1 (e.g. 0.02 for 2%)",
                a.noise
            ),
        ));
    }
    let reps = interleaved(request, candidate, a.reps)?;
    let column = |which: usize, k: usize| -> Vec<f64> {
        reps[which]
            .iter()
            .map(|r| if k == 0 { r.0 } else { r.1 })
            .collect()
    };
    let summary = |v: Vec<f64>| -> anyhow::Result<Summary> {
        Ok(Sample::new(v)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .summary())
    };
    // The tuner's own decision rule (stats::decide), with each repetition tagged by its round, so
    // this A/A test exercises exactly what the search, the leaderboard and the headline decide with.
    let comparison = |k: usize| -> anyhow::Result<Comparison> {
        let in_rounds = |which: usize| -> Vec<RoundRate> {
            column(which, k)
                .into_iter()
                .enumerate()
                .map(|(round, rate)| RoundRate {
                    round: Some(round as u64),
                    rate,
                })
                .collect()
        };
        stats::decide(&in_rounds(0), &in_rounds(1), a.noise, a.seed)
            .ok_or_else(|| anyhow::anyhow!("--twice needs at least 2 repetitions (--reps)"))
    };
    let t = Twice {
        candidate: candidate.clone(),
        workload: request.workload.clone(),
        noise: a.noise,
        a: [summary(column(0, 0))?, summary(column(0, 1))?],
        b: [summary(column(1, 0))?, summary(column(1, 1))?],
        comparisons: [comparison(0)?, comparison(1)?],
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&t)?);
        return Ok(exit::OK);
    }
    print_twice(&t, a.reps);
    Ok(exit::OK)
}

/// `rounds` rounds of A and B, the order alternating, each repetition on a fresh load: (pp, tg) each,
/// at the workload's depth when it has one.
fn interleaved(
    request: &MeasureRequest,
    candidate: &Candidate,
    rounds: u32,
) -> anyhow::Result<[Vec<(f64, f64)>; 2]> {
    let mut reps: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds as usize {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            // A fresh load for every repetition: on a VM one load of a configuration can run ~10%
            // slower than another load of the same configuration for as long as it lives (measured
            // here: whichever of two workers loaded first), so a load is part of the noise to sample.
            let mut pool = WorkerPool::new(1, Duration::from_secs(600));
            let label = format!("{} ({})", candidate.label(), ["A", "B"][which]);
            let r = repetition(&mut pool, request, &label);
            pool.shutdown();
            let r = r?;
            // With a depth, the figures a tune at that depth decides on.
            reps[which].push(match (r.pp_depth_tps, r.tg_depth_tps) {
                (Some(pp), Some(tg)) => (pp, tg),
                _ => (r.pp_tps, r.tg_tps),
            });
        }
    }
    Ok(reps)
}

/// `--twice`'s text form: A and B per figure, their ratio and the verdict.
fn print_twice(t: &Twice, reps: u32) {
    println!(
        "{} measured twice (A and B), {} interleaved rounds",
        t.candidate.label(),
        reps
    );
    let at = match t.workload.depth {
        0 => String::new(),
        d => format!("@d{d}"),
    };
    let names = [
        format!("pp{}{at}", t.workload.n_prompt),
        format!("tg{}{at}", t.workload.n_gen),
    ];
    for (k, name) in names.iter().enumerate() {
        let c = &t.comparisons[k];
        let verdict = match c.verdict {
            Verdict::Tie => "tie".to_string(),
            Verdict::Faster => "A faster: this machine is noisier than --noise".to_string(),
            Verdict::Slower => "B faster: this machine is noisier than --noise".to_string(),
        };
        println!(
            "  {:<12} A {:>8.2} t/s  B {:>8.2} t/s  A/B {:+.1}%  95% CI [{:+.1}%, {:+.1}%]  noise ±{:.1}%  -> {verdict}",
            name,
            t.a[k].median,
            t.b[k].median,
            100.0 * c.ratio,
            100.0 * c.ci_low,
            100.0 * c.ci_high,
            100.0 * t.noise,
        );
    }
}
