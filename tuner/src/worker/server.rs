//! The worker process's measuring side: the requests of the measuring contract (a repetition, a dry
//! run) and the device probes, answered in `autotune __worker` (whose loop, `child.rs`, hands the
//! other features' requests to their own handlers).
//!
//! llama.cpp aborts the whole process on some failures (device out of memory, bad tensors, an illegal
//! instruction in a kernel the OS has not enabled), so the tuner never measures in its own process.
//! A worker keeps its model loaded while requests only change context settings.

use super::memory::{self, committed_bytes, rss_bytes, short_of_device_memory};
use super::protocol::{BandwidthRequest, KvPairsRequest, LinkRequest, MatmulRequest, Response};
use super::timing::{self, Cutoff, TokenSource};
use crate::llama::{self, Context, ContextSettings, Model, ModelSettings};
use crate::measuring::{DeviceBytes, LoadReport, MeasureRequest, Repetition};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The warm-up's prompt where no device's pipelines need building, or only generation is
/// timed, or the model was loaded and run before: every weight is touched by any token.
pub(crate) const WARM_UP_TOKENS: u32 = 32;

/// A link probe to an RPC server's device (`hosts::links`).
pub fn link(r: &LinkRequest) -> Response {
    if let Err(e) = llama::rpc_add_servers(&r.rpc) {
        return Response::Failed {
            stage: "rpc".into(),
            message: e.to_string(),
        };
    }
    match llama::device_link(&r.device, r.bytes, r.round_trips, r.passes) {
        Ok(p) => Response::Link {
            round_trip_s: p.round_trip_s,
            upload_bytes_per_s: p.upload_bytes_per_s,
            download_bytes_per_s: p.download_bytes_per_s,
            bytes: p.bytes,
        },
        Err(e) => Response::Failed {
            stage: "link".into(),
            message: e.to_string(),
        },
    }
}

/// The CPU's matrix-multiply peak on a weight type (a prompt's ceiling).
pub fn matmul(r: &MatmulRequest) -> Response {
    let limit = std::time::Duration::from_millis(r.time_limit_ms);
    match llama::cpu_matmul_rate(r.ggml_type, r.threads, r.passes, limit) {
        Ok(m) => Response::Matmul {
            flops_per_s: m.flops_per_s,
            buffer: m.buffer,
            passes: m.passes,
        },
        Err(e) => Response::Failed {
            stage: "matmul".into(),
            message: e.to_string(),
        },
    }
}

/// A device's memory read bandwidth (explain's roofline).
pub fn bandwidth(r: &BandwidthRequest) -> Response {
    let failed = |stage: &str, e: llama::LlamaError| Response::Failed {
        stage: stage.into(),
        message: e.to_string(),
    };
    if let Err(e) = llama::rpc_add_servers(&r.rpc) {
        return failed("rpc", e);
    }
    let limit = std::time::Duration::from_millis(r.time_limit_ms);
    match llama::device_read_bandwidth(&r.device, r.bytes, r.passes, limit) {
        Ok(p) => Response::Bandwidth {
            bytes_per_s: p.bytes_per_s,
            bytes: p.bytes,
            passes: p.passes,
        },
        Err(e) => failed("bandwidth", e),
    }
}

/// Answers a [`KvPairsRequest`]: each device, with the pairs it runs (a pair it cannot be asked
/// about counts as not run).
pub fn kv_pairs(r: &KvPairsRequest) -> Response {
    let runs = (r.devices.iter())
        .map(|d| {
            let pairs = (r.pairs.iter().copied())
                .filter(|&p| llama::runs_kv_pair(d, p, r.shape).unwrap_or(false))
                .collect();
            (d.clone(), pairs)
        })
        .collect();
    Response::KvPairs { runs }
}

/// What a measuring worker holds between requests: its model and context, and what it saw before
/// the load.
#[derive(Default)]
pub struct WorkerState {
    // Field order matters: the context is dropped before the model it holds.
    context: Option<(ContextSettings, Context)>,
    model: Option<((PathBuf, ModelSettings), Arc<Model>)>,
    load_log: Vec<String>,
    load_seconds: f64,
    before_load: BeforeLoad,
    /// Whether the referenced bits were cleared after the last (re)load, so that the model file's
    /// pages read from then on can be counted ([`memory::model_pages_referenced`]).
    refs_cleared: bool,
    /// Whether the last request loaded the model (not only made a new context on it).
    model_loaded: bool,
}

/// The worker's memory just before the model was loaded.
#[derive(Default)]
struct BeforeLoad {
    /// Free memory per non-CPU device.
    free: Vec<(String, u64)>,
    /// [`committed_bytes`]: private memory and resident file pages.
    committed: u64,
    /// [`memory::private_bytes`].
    private: u64,
}

impl WorkerState {
    /// Loads the request's model in place of any other, first checking (for a real load) that the
    /// device memory the dry run predicted is free right now.
    fn load_model(
        &mut self,
        m: &MeasureRequest,
        key: (PathBuf, ModelSettings),
    ) -> Result<(), Response> {
        self.context = None;
        self.model = None;
        self.before_load = BeforeLoad {
            // A GPU several backends drive is named as this load names it (`--device Vulkan0`).
            free: llama::device_free_for(&m.settings.devices),
            committed: committed_bytes(),
            private: memory::private_bytes(),
        };
        let failed = |message: String| Response::Failed {
            stage: "load".into(),
            message,
        };
        if !m.settings.no_alloc {
            // The host's part too: the RAM available now, this worker's previous model freed.
            let mut free = self.before_load.free.clone();
            free.extend(crate::ram::available_now().map(|a| ("CPU".to_string(), a)));
            if let Some(message) = short_of_device_memory(&m.expect, &free) {
                return Err(Response::Failed {
                    stage: profiles::measurements::MEMORY_CHECK.into(),
                    message,
                });
            }
        }
        let t = Instant::now();
        let model = Model::load(&m.model, &m.settings).map_err(|e| failed(e.to_string()))?;
        self.load_seconds = t.elapsed().as_secs_f64();
        self.load_log = llama::take_log();
        self.model = Some((key, Arc::new(model)));
        Ok(())
    }

    /// Makes sure the requested model and context are loaded; returns a load report when anything
    /// was (re)created.
    fn ensure(&mut self, m: &MeasureRequest) -> Result<Option<LoadReport>, Response> {
        let key = (m.model.clone(), m.settings.clone());
        let mut fresh = false;
        llama::rpc_add_servers(&m.settings.rpc).map_err(|e| Response::Failed {
            stage: "rpc".into(),
            message: e.to_string(),
        })?;
        self.model_loaded = false;
        if self.model.as_ref().map(|(k, _)| k) != Some(&key) {
            self.load_model(m, key)?;
            fresh = true;
            self.model_loaded = true;
        }
        if self.context.as_ref().map(|(c, _)| c) != Some(&m.context) {
            self.context = None;
            let model = &self.model.as_ref().expect("model loaded above").1;
            let ctx = Context::like_server(model, &m.context).map_err(|e| Response::Failed {
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
        let mut buffers = llama::parse_buffer_reports(&log);
        let reported_bytes = buffers.iter().map(|b| b.bytes).sum();
        // llama.cpp's own accounting (what its fit plans with); the logged buffer sizes as a fallback.
        let ctx = &self.context.as_ref().expect("context created above").1;
        let breakdown = llama::memory_breakdown(ctx);
        if m.settings.no_alloc && m.settings.host_buffer == search_space::HostBuffer::Mapped {
            llama::predicted_mapping(&mut buffers, &breakdown);
        }
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
            let overhead = committed_bytes().saturating_sub(self.before_load.committed);
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
            mapped_in_use: None,
        };
        if !m.settings.no_alloc {
            let host = committed_bytes().saturating_sub(self.before_load.committed);
            self.fill_actual(&mut report, host);
            // From here on, the model file's pages that inference reads are counted.
            self.refs_cleared = memory::clear_referenced();
        }
        Ok(Some(report))
    }

    /// What the first repetition after a load held on the host: private memory (weights copied
    /// out of the mapping, KV cache, compute buffers) grown since before the load, plus the pages
    /// of the mapped model file that the warm-up and the measurement read. Where the kernel cannot
    /// tell which pages were read, every resident page of the file counts, as after the load.
    fn fill_actual_after_inference(&self, report: &mut LoadReport) {
        let referenced = self
            .refs_cleared
            .then(memory::model_pages_referenced)
            .flatten();
        report.mapped_in_use = referenced;
        let host = match referenced {
            Some(pages) => memory::private_bytes().saturating_sub(self.before_load.private) + pages,
            None => committed_bytes().saturating_sub(self.before_load.committed),
        };
        self.fill_actual(report, host);
    }

    /// What the load really took: device memory that disappeared, and `host` bytes on the CPU.
    fn fill_actual(&self, report: &mut LoadReport, host: u64) {
        report.rss_bytes = rss_bytes();
        let mut actual = vec![DeviceBytes {
            device: "CPU".into(),
            bytes: host,
        }];
        let named = (self.model.as_ref()).map_or(&[][..], |((_, s), _)| &s.devices[..]);
        for (name, free_after) in llama::device_free_for(named) {
            if let Some((_, free_before)) = self.before_load.free.iter().find(|(n, _)| *n == name) {
                actual.push(DeviceBytes {
                    device: name,
                    bytes: free_before.saturating_sub(free_after),
                });
            }
        }
        report.actual = actual;
    }

    pub fn footprint(&mut self, m: &MeasureRequest) -> Response {
        match self.ensure(m) {
            Ok(report) => Response::Footprint(report.unwrap_or_default()),
            Err(r) => r,
        }
    }

    pub fn measure(&mut self, m: &MeasureRequest) -> Response {
        let load = match self.ensure(m) {
            Ok(l) => l,
            Err(r) => return r,
        };
        let warm = (load.is_some()).then_some(self.model_loaded);
        let ctx = &mut self.context.as_mut().expect("context created above").1;
        let mut tokens = TokenSource::new(m.seed, ctx.model().n_vocab(), ctx.model().bos());
        let w = &m.workload;
        let np = w.n_parallel.max(1);
        let run = |ctx: &mut Context,
                   tokens: &mut TokenSource|
         -> Result<Repetition, llama::LlamaError> {
            if let Some(model_loaded) = warm {
                warm_up(ctx, tokens, m, model_loaded)?;
            }
            let (mut shallow, mut deep) = cutoffs(m);
            // A phase not asked for is not timed: its figures stay 0 until the engine lends them.
            let timed = m.phases;
            let pp_tps = match timed.prompt {
                true => timing::prompt(ctx, tokens, w.n_prompt, np, &mut shallow)?,
                false => 0.0,
            };
            let tg_tps = match timed.generation {
                true => timing::generation(ctx, tokens, w.n_gen, np, &mut shallow)?,
                false => 0.0,
            };
            let (pp_depth_tps, tg_depth_tps) = match w.depth > 0 {
                true => timing::at_depth(ctx, tokens, (w, np), timed, &mut deep)
                    .map(|(pp, tg)| (Some(pp), Some(tg)))?,
                false => (None, None),
            };
            Ok(Repetition {
                pp_tps,
                tg_tps,
                pp_depth_tps,
                tg_depth_tps,
                load: load.clone(),
                timed,
                screen: None,
            })
        };
        match run(ctx, &mut tokens) {
            Ok(mut r) => {
                // Measured again after the warm-up and the measurement read what inference reads.
                if let Some(l) = r.load.as_mut() {
                    self.fill_actual_after_inference(l);
                }
                Response::Measured(Box::new(r))
            }
            Err(llama::LlamaError::Aborted) => {
                ctx.set_deadline(None);
                match m.give_up {
                    Some(limit) => {
                        let mut load = load.clone();
                        if let Some(l) = load.as_mut() {
                            self.fill_actual_after_inference(l);
                        }
                        Response::GaveUp {
                            limit,
                            load: load.map(Box::new),
                        }
                    }
                    None => Response::Failed {
                        stage: "decode".into(),
                        message: "stopped without a deadline".into(),
                    },
                }
            }
            Err(e) => Response::Failed {
                stage: "decode".into(),
                message: e.to_string(),
            },
        }
    }
}

/// The stopping rules of a repetition's phases on an empty cache and at depth: the score counts
/// the phases at depth when there is one, else the others.
fn cutoffs(m: &MeasureRequest) -> (Cutoff, Cutoff) {
    let limit = m.give_up.map(|g| g.limit_ms as f64 / 1e3);
    let np = m.workload.n_parallel.max(1);
    match m.workload.depth > 0 {
        true => (Cutoff::off(), Cutoff::new(limit, np)),
        false => (Cutoff::new(limit, np), Cutoff::off()),
    }
}

/// The warm-up before a fresh context's first repetition, discarded: first touches of weights
/// and buffers, thread pool start. The warm-up's prompt plus its 4 tokens must fit a slot's
/// context: a prompt as long as the context would otherwise leave no KV slot for them.
/// [`WARM_UP_TOKENS`] of prompt touch every weight. On the CPU alone a prompt-sized graph needs no
/// warming: on a 7B on two cores (the file in the page cache) the first pp512 after a fresh load
/// ran at 31.1-33.7 t/s after a 32-token warm-up and 29.8-32.6 after a whole prompt's (plain
/// kernels; the slower of two repetitions, five loads each, alternated), and the whole prompt's
/// warm-up was 15-25 s of every load. Where a device may run the prompt's batches (offloaded
/// layers, or op offload of the host's), a fresh load's first batch of each size builds the
/// device's pipelines: with llvmpipe's shader cache cold, a 32-token warm-up left that to the
/// first timed 256-token batch, and candidates were stopped as 1.75x slower than the baseline.
fn warm_up(
    ctx: &mut Context,
    tokens: &mut TokenSource,
    m: &MeasureRequest,
    model_loaded: bool,
) -> Result<(), llama::LlamaError> {
    let w = &m.workload;
    let np = w.n_parallel.max(1);
    let whole = m.phases.prompt && model_loaded && a_device_may_run_batches();
    let prompt = match whole {
        true => w.n_prompt,
        false => w.n_prompt.min(WARM_UP_TOKENS),
    };
    let n = prompt
        .min(m.context.n_batch / np)
        .min((m.context.n_ctx / np).saturating_sub(4))
        .max(1);
    timing::warm_up(ctx, tokens, n, np)
}

/// Whether this worker's llama.cpp has a device beside the CPU (a GPU, an RPC host's), which
/// the prompt's batches may run on.
fn a_device_may_run_batches() -> bool {
    (llama::devices().iter()).any(|d| matches!(d.kind.as_str(), "gpu" | "igpu"))
}
