//! The worker process: the same binary started as `autotune __worker`, which loads llama.cpp models
//! and measures on request, one JSON line in, one JSON line out.
//!
//! llama.cpp aborts the whole process on some failures (device out of memory, bad tensors, an illegal
//! instruction in a kernel the OS has not enabled), so the tuner never measures in its own process.
//! A worker keeps its model loaded while requests only change context settings.

use crate::llama::{self, Context, ContextSettings, Model, ModelSettings};
pub use profiles::measurements::{DeviceBytes, LoadReport, Repetition, Workload};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MeasureRequest {
    pub model: PathBuf,
    pub settings: ModelSettings,
    pub context: ContextSettings,
    pub workload: Workload,
    /// Seed of the random prompt tokens.
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// One repetition (pp, tg and, with depth, tg at depth). The first request on a fresh context
    /// runs a discarded warm-up first.
    Measure(MeasureRequest),
    /// Load the model and create the context without running anything: the memory that takes.
    Footprint(MeasureRequest),
    Quit,
    /// Write a quantization of a model with llama.cpp's quantizer (`autotune quantize`).
    Quantize(crate::quant::serve::QuantizeRequest),
    /// Compare a model's next-token distributions with a reference's (`autotune quality`).
    Quality(crate::quant::serve::QualityRequest),
    /// Is a draft model's vocabulary compatible with a target's (`autotune draft`)?
    DraftCheck(crate::speculative::serve::CheckRequest),
    /// Greedy generation over a prompt set, with a draft model (speculative decoding) or without.
    Speculate(crate::speculative::serve::SpeculateRequest),
    /// The memory of a draft (or target) for speculative decoding, from a dry run; answered `Footprint`.
    SpecFootprint(crate::speculative::serve::FootprintRequest),
    /// llama.cpp's own fit (`common_fit_params`) under given budgets (`autotune fit`).
    LlamaFit(crate::fit::FitRequest),
    /// The read bandwidth of a device's memory with its own kernels (`explain`'s roofline).
    Bandwidth(BandwidthRequest),
}

/// Measure a device's memory read bandwidth; RPC servers are connected first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BandwidthRequest {
    pub device: String,
    pub rpc: Vec<String>,
    /// Size of the matrix read.
    pub bytes: u64,
    pub passes: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Response {
    Measured(Repetition),
    Footprint(LoadReport),
    /// llama.cpp refused (returned an error) without crashing.
    Failed {
        stage: String,
        message: String,
    },
    Quantized(crate::quant::serve::QuantizeAnswer),
    Quality(crate::quant::serve::QualityAnswer),
    DraftCheck(crate::speculative::serve::CheckAnswer),
    Speculated(crate::speculative::serve::SpeculateAnswer),
    Fitted(crate::fit::FitAnswer),
    /// Bytes per second, and the bytes each pass read.
    Bandwidth {
        bytes_per_s: f64,
        bytes: u64,
    },
}

/// Entry point of `autotune __worker`: serve requests from stdin until EOF or `Quit`.
pub fn serve() -> anyhow::Result<()> {
    llama::init(std::env::var_os("AUTOTUNE_WORKER_LOG").is_some());
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    let mut state = WorkerState::default();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let request: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                let r = Response::Failed {
                    stage: "protocol".into(),
                    message: e.to_string(),
                };
                writeln!(stdout, "{}", serde_json::to_string(&r)?)?;
                stdout.flush()?;
                continue;
            }
        };
        crate::fault::before_request(&request);
        let response = match request {
            Request::Quit => break,
            Request::Measure(m) => state.measure(&m),
            Request::Footprint(m) => state.footprint(&m),
            Request::Quantize(q) => crate::quant::serve::quantize(&q),
            Request::Quality(q) => crate::quant::serve::quality(&q),
            Request::DraftCheck(c) => crate::speculative::serve::check(&c),
            Request::Speculate(r) => crate::speculative::serve::speculate(&r),
            Request::SpecFootprint(r) => crate::speculative::serve::footprint(&r),
            Request::LlamaFit(r) => crate::fit::serve(&r),
            Request::Bandwidth(r) => bandwidth(&r),
        };
        writeln!(stdout, "{}", serde_json::to_string(&response)?)?;
        stdout.flush()?;
    }
    Ok(())
}

fn bandwidth(r: &BandwidthRequest) -> Response {
    let failed = |stage: &str, e: llama::LlamaError| Response::Failed {
        stage: stage.into(),
        message: e.to_string(),
    };
    if let Err(e) = llama::rpc_add_servers(&r.rpc) {
        return failed("rpc", e);
    }
    match llama::device_read_bandwidth(&r.device, r.bytes, r.passes) {
        Ok((bytes_per_s, bytes)) => Response::Bandwidth { bytes_per_s, bytes },
        Err(e) => failed("bandwidth", e),
    }
}

#[derive(Default)]
struct WorkerState {
    // Field order matters: the context is dropped before the model it holds.
    context: Option<(ContextSettings, Context)>,
    model: Option<((PathBuf, ModelSettings), Arc<Model>)>,
    load_log: Vec<String>,
    load_seconds: f64,
    /// Free memory per non-CPU device and the worker's RSS just before the model was loaded.
    before_load: (Vec<(String, u64)>, u64),
}

impl WorkerState {
    /// Makes sure the requested model and context are loaded; returns a load report when anything
    /// was (re)created.
    fn ensure(&mut self, m: &MeasureRequest) -> Result<Option<LoadReport>, Response> {
        let key = (m.model.clone(), m.settings.clone());
        let mut fresh = false;
        llama::rpc_add_servers(&m.settings.rpc).map_err(|e| Response::Failed {
            stage: "rpc".into(),
            message: e.to_string(),
        })?;
        if self.model.as_ref().map(|(k, _)| k) != Some(&key) {
            self.context = None;
            self.model = None;
            self.before_load = (llama::device_free(), committed_bytes());
            let t = Instant::now();
            let model = Model::load(&m.model, &m.settings).map_err(|e| Response::Failed {
                stage: "load".into(),
                message: e.to_string(),
            })?;
            self.load_seconds = t.elapsed().as_secs_f64();
            self.load_log = llama::take_log();
            self.model = Some((key, Arc::new(model)));
            fresh = true;
        }
        if self.context.as_ref().map(|(c, _)| c) != Some(&m.context) {
            self.context = None;
            let model = &self.model.as_ref().expect("model loaded above").1;
            let ctx = Context::new(model, &m.context).map_err(|e| Response::Failed {
                stage: "context".into(),
                message: e.to_string(),
            })?;
            self.context = Some((m.context.clone(), ctx));
            fresh = true;
        }
        if !fresh {
            return Ok(None);
        }
        let mut log = self.load_log.clone();
        log.extend(llama::take_log());
        let buffers = llama::parse_buffer_reports(&log);
        let reported_bytes = buffers.iter().map(|b| b.bytes).sum();
        // llama.cpp's own accounting (what its fit plans with); the logged buffer sizes as a fallback.
        let ctx = &self.context.as_ref().expect("context created above").1;
        let breakdown = llama::memory_breakdown(ctx);
        let per_device = if breakdown.is_empty() {
            llama::bytes_per_device(&buffers, &llama::devices())
        } else {
            llama::breakdown_per_device(&breakdown)
        };
        let mut per_device = per_device;
        if m.settings.no_alloc {
            // A dry run allocates no tensor, so what this process grew by while loading is llama.cpp's
            // host memory outside its buffers (vocabulary, token caches, metadata): the host side of the
            // prediction includes it, as a real load will hold it too.
            let overhead = committed_bytes().saturating_sub(self.before_load.1);
            match per_device.iter_mut().find(|d| d.device == "CPU") {
                Some(cpu) => cpu.bytes += overhead,
                None => per_device.push(DeviceBytes {
                    device: "CPU".into(),
                    bytes: overhead,
                }),
            }
        }
        let reported_bytes = if breakdown.is_empty() {
            reported_bytes
        } else {
            per_device.iter().map(|d| d.bytes).sum()
        };
        let mut report = LoadReport {
            load_seconds: self.load_seconds,
            buffers,
            rss_bytes: 0,
            reported_bytes,
            per_device,
            actual: Vec::new(),
        };
        if !m.settings.no_alloc {
            self.fill_actual(&mut report);
        }
        Ok(Some(report))
    }

    /// What the load really took: device memory that disappeared, and the worker's RSS growth.
    fn fill_actual(&self, report: &mut LoadReport) {
        report.rss_bytes = rss_bytes();
        let committed = committed_bytes();
        let mut actual = vec![DeviceBytes {
            device: "CPU".into(),
            bytes: committed.saturating_sub(self.before_load.1),
        }];
        for (name, free_after) in llama::device_free() {
            if let Some((_, free_before)) = self.before_load.0.iter().find(|(n, _)| *n == name) {
                actual.push(DeviceBytes {
                    device: name,
                    bytes: free_before.saturating_sub(free_after),
                });
            }
        }
        report.actual = actual;
    }

    fn footprint(&mut self, m: &MeasureRequest) -> Response {
        match self.ensure(m) {
            Ok(report) => Response::Footprint(report.unwrap_or_default()),
            Err(r) => r,
        }
    }

    fn measure(&mut self, m: &MeasureRequest) -> Response {
        let load = match self.ensure(m) {
            Ok(l) => l,
            Err(r) => return r,
        };
        let ctx = &mut self.context.as_mut().expect("context created above").1;
        let mut tokens = TokenSource::new(m.seed, ctx.model().n_vocab(), ctx.model().bos());
        let w = &m.workload;
        let run = |ctx: &mut Context,
                   tokens: &mut TokenSource|
         -> Result<Repetition, llama::LlamaError> {
            if load.is_some() {
                // Warm-up, discarded: first touches of weights and buffers, thread pool start.
                ctx.clear();
                // The warm-up's prompt plus its 4 tokens must fit the context: a prompt as long as
                // the context would otherwise leave no KV slot for them.
                let n = w
                    .n_prompt
                    .min(ctx_batch(m))
                    .min(m.context.n_ctx.saturating_sub(4))
                    .max(1);
                ctx.decode(&mut tokens.prompt(n))?;
                for _ in 0..4 {
                    ctx.decode(&mut [tokens.next()])?;
                }
                ctx.synchronize();
            }
            let pp_tps = time_prompt(ctx, tokens, w.n_prompt)?;
            let tg_tps = time_generation(ctx, tokens, 0, w.n_gen)?;
            let tg_depth_tps = if w.depth > 0 {
                Some(time_generation(ctx, tokens, w.depth, w.n_gen)?)
            } else {
                None
            };
            Ok(Repetition {
                pp_tps,
                tg_tps,
                tg_depth_tps,
                load: load.clone(),
            })
        };
        match run(ctx, &mut tokens) {
            Ok(mut r) => {
                // Measured again after the warm-up touched every weight (mmap pages count once read).
                if let Some(l) = r.load.as_mut() {
                    self.fill_actual(l);
                }
                Response::Measured(r)
            }
            Err(e) => Response::Failed {
                stage: "decode".into(),
                message: e.to_string(),
            },
        }
    }
}

fn ctx_batch(m: &MeasureRequest) -> u32 {
    m.context.n_batch
}

/// Prompt processing: an empty cache, `n` tokens in batches of n_batch, synchronised before the
/// clock stops.
fn time_prompt(
    ctx: &mut Context,
    tokens: &mut TokenSource,
    n: u32,
) -> Result<f64, llama::LlamaError> {
    ctx.clear();
    let mut prompt = tokens.prompt(n);
    let t = Instant::now();
    ctx.decode(&mut prompt)?;
    ctx.synchronize();
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Generation: `depth` tokens already in the cache (filled untimed), then `n` single-token decodes.
fn time_generation(
    ctx: &mut Context,
    tokens: &mut TokenSource,
    depth: u32,
    n: u32,
) -> Result<f64, llama::LlamaError> {
    ctx.clear();
    if depth > 0 {
        ctx.decode(&mut tokens.prompt(depth))?;
        ctx.synchronize();
    }
    let t = Instant::now();
    for i in 0..n {
        let mut tok = [if depth == 0 && i == 0 {
            tokens.bos
        } else {
            tokens.next()
        }];
        ctx.decode(&mut tok)?;
    }
    ctx.synchronize();
    Ok(n as f64 / t.elapsed().as_secs_f64())
}

/// Random token ids, like llama-bench (content does not change the speed of a dense model).
struct TokenSource {
    state: u64,
    n_vocab: i32,
    bos: i32,
}

impl TokenSource {
    fn new(seed: u64, n_vocab: i32, bos: i32) -> Self {
        TokenSource {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
            n_vocab: n_vocab.max(1),
            bos: bos.max(0),
        }
    }
    fn next(&mut self) -> i32 {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let v = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (v % self.n_vocab as u64) as i32
    }
    fn prompt(&mut self, n: u32) -> Vec<i32> {
        let mut v = Vec::with_capacity(n as usize);
        v.push(self.bos);
        while v.len() < n as usize {
            v.push(self.next());
        }
        v.truncate(n as usize);
        v
    }
}

/// Host memory this process holds for llama.cpp's buffers: private data (heap and anonymous
/// mappings: KV cache, compute buffers, repacked weights — counted when allocated, touched or not,
/// as a device allocation is) plus resident file-backed pages (the mmap'd weights, once read), less
/// the reservations of thread stacks (see [`thread_stack_bytes`]).
pub fn committed_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kib("VmData:") + kib("RssFile:")).saturating_sub(thread_stack_bytes(
        &std::fs::read_to_string("/proc/self/maps").unwrap_or_default(),
    ))
}

/// Thread stacks in a `/proc/PID/maps` listing: an anonymous read-write mapping directly above its
/// guard page(s) (an anonymous `---p` mapping of at most 1 MiB), which is how glibc lays out a
/// pthread stack. VmData counts each whole stack reservation (8 MiB by default) although a thread
/// touches a few pages of it: a compute thread started by the first decode is not memory llama.cpp
/// took. Malloc arenas are the other way round (read-write below their reserved, inaccessible rest),
/// and an inaccessible region larger than a guard does not qualify.
pub fn thread_stack_bytes(maps: &str) -> u64 {
    const MAX_GUARD: u64 = 1 << 20;
    let mut total = 0;
    // (end address, size) of the previous line when it was an anonymous guard.
    let mut guard_end: Option<u64> = None;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            guard_end = None;
            continue;
        };
        let anonymous = f.nth(2) == Some("0") && f.next().is_none();
        let Some((start, end)) = range.split_once('-').and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        }) else {
            guard_end = None;
            continue;
        };
        if anonymous && perms.starts_with("rw") && guard_end == Some(start) {
            total += end.saturating_sub(start);
        }
        guard_end =
            (anonymous && perms == "---p" && end.saturating_sub(start) <= MAX_GUARD).then_some(end);
    }
    total
}

/// Resident set size of this process, from /proc (0 where unavailable).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<u64>().ok())
        })
        // SAFETY: sysconf is a plain query.
        .map(|pages| pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::thread_stack_bytes;

    #[test]
    fn thread_stacks_are_the_read_write_mappings_right_above_a_guard() {
        let maps = "\
55d0c0000000-55d0c0100000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000021000 rw-p 00000000 00:00 0
7f0000021000-7f0004000000 ---p 00000000 00:00 0
7f0004000000-7f0024000000 rw-p 00000000 00:00 0
7f0040000000-7f0040001000 ---p 00000000 00:00 0
7f0040001000-7f0040801000 rw-p 00000000 00:00 0
7f0050000000-7f0050100000 r--p 00000000 fd:01 1234                       /models/m.gguf
7f0050100000-7f0050101000 ---p 00000000 fd:01 1234                       /usr/lib/libx.so
7f0050101000-7f0050102000 rw-p 00000000 00:00 0
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
";
        // Counted: the 8 MiB stack above its 4 KiB guard. Not counted: the arena (read-write
        // below its 64 MiB reservation), the 512 MiB buffer right above that reservation (too big a
        // region for a guard), the anonymous page above a library's inaccessible mapping, the main
        // thread's [stack], the heap and the file mapping.
        assert_eq!(thread_stack_bytes(maps), 8 << 20);
        assert_eq!(thread_stack_bytes(""), 0);
        assert_eq!(thread_stack_bytes("garbage\n- x\n"), 0);
    }
}
