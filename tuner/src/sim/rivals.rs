//! Other tools' ways of choosing a configuration, emulated on the landscape for `bench/vs-tuners`:
//! Ollama's offload estimate, llama-optimus's measured search, ggrun's placement and `--ai-tune`
//! rounds, FiTuna's bisection of `-ngl`. (AMD Lemonade's released code passes llama-server
//! llama.cpp's own defaults at the context asked for: the `--fit` row. Its measured AutoOpt, in
//! unmerged pull requests, compares backends and, on unified memory only, a batch ladder: neither
//! is on these landscapes, one backend of discrete GPUs, so it would be the same row.) Each follows the tool's own
//! code (read from its sources, not guessed); where the simulator cannot say what the tool says,
//! the emulation says what stands in for it. A model of those tools on a model of hardware: it
//! compares decision procedures, not the tools' real speed.

use super::landscape::{Landscape, GIB, MIB};
use crate::engine::TuneSettings;
use rand::rngs::StdRng;
use rand::Rng;
use search_space::{Candidate, FlashAttn};

/// What Ollama keeps free on a CUDA GPU (`MinimumMemory`, 457 MiB) before placing layers.
const OLLAMA_GPU_MINIMUM: u64 = 457 * MIB;

/// Ollama's choice for the run's context: the layers its estimate (`llm/memory.go`,
/// `EstimateGPULayers`, with the graph sizes of its llama formula, `GraphSize`) places on the
/// GPUs, split in whole layers (`--tensor-split`), and its runner's defaults for the rest: a batch
/// of 512, an f16 KV cache, flash attention off (its default unless `OLLAMA_FLASH_ATTENTION` is
/// set), a thread per physical core. The estimate as Ollama runs it for models it hands to
/// llama.cpp; MoE layers are sized whole, as its dense formula does.
pub fn ollama(land: &Landscape, s: &TuneSettings) -> Candidate {
    let m = &land.model;
    let ctx = s.plan.workload.n_ctx as u64;
    let layer = m.layer_bytes + ctx * m.kv_bytes_per_token_layer;
    let graph = ollama_graph(land, ctx, ctx.min(512));
    let free: Vec<u64> = land.devices.iter().map(|d| d.mem_bytes).collect();
    // GPUs that hold the graph, the minimum, a spare layer and one more.
    let mut with_space: Vec<usize> = (0..free.len())
        .filter(|&g| free[g] >= graph + OLLAMA_GPU_MINIMUM + 2 * layer)
        .collect();
    let mut alloc: Vec<u64> = free.iter().map(|_| OLLAMA_GPU_MINIMUM + layer).collect();
    let mut counts = vec![0u32; free.len()];
    let mut placed = 0u32;
    for i in 0..m.n_layers as usize {
        // Round-robin over the GPUs with space; one without room for this layer leaves the list.
        let mut j = with_space.len();
        while j > 0 {
            let g = with_space[i % j];
            if free[g] > alloc[g] + graph + layer {
                alloc[g] += layer;
                counts[g] += 1;
                placed += 1;
                break;
            }
            with_space.remove(i % j);
            j -= 1;
        }
    }
    // The output layer last, where it fits.
    let mut j = with_space.len();
    while j > 0 {
        let g = with_space[placed as usize % j];
        if free[g] > alloc[g] + graph + m.output_bytes {
            counts[g] += 1;
            placed += 1;
            break;
        }
        j -= 1;
    }
    Candidate {
        n_gpu_layers: placed,
        tensor_split: if free.len() > 1 { counts } else { Vec::new() },
        n_batch: 512,
        n_ubatch: 512,
        flash_attn: FlashAttn::Off,
        ..Candidate::llama_default(land.host.physical_cores, 0)
    }
}

/// Ollama's graph reservation for a llama model (the larger of its partial- and full-offload
/// sizes; several GPUs always take the partial one), in the simulated model's dimensions: heads of
/// 128, 8 KV heads (what the simulator's KV bytes per token are).
fn ollama_graph(land: &Landscape, ctx: u64, batch: u64) -> u64 {
    let m = &land.model;
    let (e, vocab, head, kv_heads) = (m.n_embd, m.n_vocab, 128, 8);
    let heads = e / head;
    let full = (4 * batch * (1 + 4 * e + ctx * (1 + heads))).max(4 * batch * (e + vocab));
    let partial = 4 * batch * e
        + (4 * batch * (1 + e + ctx.max(e))
            + e * e * 9 / 16
            + 4 * ctx * (batch * heads + head * kv_heads))
            .max(4 * batch * (e + vocab) + e * vocab * 105 / 128);
    if land.devices.len() > 1 {
        partial
    } else {
        partial.max(full)
    }
}

/// What llama-optimus maximises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimusMetric {
    /// Generation t/s alone (its default).
    Tg,
    /// The mean of prompt and generation t/s (`--metric mean`).
    Mean,
}

/// llama-optimus 0.1.9 with its defaults: 45 trials a stage, 3 llama-bench repetitions of
/// 192 tokens each, 35 warm-up runs.
#[derive(Debug, Clone)]
pub struct Optimus {
    pub metric: OptimusMetric,
    pub trials: u32,
    pub repeat: u32,
    pub n_tokens: u32,
    pub warmup_runs: u32,
}

impl Optimus {
    pub fn new(metric: OptimusMetric) -> Self {
        Optimus {
            metric,
            trials: 45,
            repeat: 3,
            n_tokens: 192,
            warmup_runs: 35,
        }
    }
}

/// A llama-optimus run's result: the llama-server configuration it prints, the simulated seconds
/// it spent, and how many trials it ran.
pub struct OptimusRun {
    pub pick: Candidate,
    pub seconds: f64,
    pub trials: u32,
}

/// One trial's settings, as llama-optimus samples them.
#[derive(Debug, Clone, Copy)]
struct Trial {
    batch: u32,
    ubatch: u32,
    threads: u32,
    ngl: u32,
    flash_on: bool,
    /// Layers whose experts an `--override-tensor` pattern keeps on the CPU.
    experts_on_cpu: u32,
}

/// The emulation: the same stages, the same search space and the same llama-bench commands,
/// measured with the landscape's noise, a fresh load per command. Optuna's TPE sampler is replaced
/// by uniform random sampling (TPE starts with 10 random trials, then samples near the best values
/// measured so far); the override-tensor patterns become the share of layers whose experts they
/// keep on the CPU (all, half, or the up/down share of three expert tensors as two thirds).
struct Emulation<'a> {
    land: &'a Landscape,
    o: &'a Optimus,
    rng: &'a mut StdRng,
    cpus: u32,
    seconds: f64,
    trials: u32,
}

pub fn llama_optimus(land: &Landscape, o: &Optimus, rng: &mut StdRng) -> OptimusRun {
    let cpus = 2 * land.host.physical_cores; // os.cpu_count(): logical CPUs
    let mut e = Emulation {
        land,
        o,
        rng,
        cpus,
        seconds: 0.0,
        trials: 0,
    };
    let max_ngl = e.max_ngl();
    e.warm_up(max_ngl);
    let patterns = e.patterns();
    let best_1 = e.best_of(|e| Trial {
        flash_on: false,
        experts_on_cpu: 0,
        ..e.numeric(max_ngl)
    });
    // Stage 2: the grid of flash attention × override patterns at stage 1's best numbers.
    let mut stage_2 = Vec::new();
    for flash_on in [false, true] {
        for &experts_on_cpu in &patterns {
            let t = Trial {
                flash_on,
                experts_on_cpu,
                ..best_1
            };
            stage_2.push((e.measure(&t), t));
        }
    }
    let best_2 = best(stage_2);
    // Stage 3 samples everything again; the printed command takes its numbers with stage 2's
    // flash attention and pattern (as llama-optimus's `run_optimization` writes it).
    let best_3 = e.best_of(|e| {
        let i = e.rng.gen_range(0..patterns.len());
        Trial {
            flash_on: e.rng.gen_bool(0.5),
            experts_on_cpu: patterns[i],
            ..e.numeric(max_ngl)
        }
    });
    let pick = Trial {
        flash_on: best_2.flash_on,
        experts_on_cpu: best_2.experts_on_cpu,
        ..best_3
    };
    OptimusRun {
        pick: candidate(&pick, FlashAttn::Auto),
        seconds: e.seconds,
        trials: e.trials,
    }
}

/// The trial that measured fastest (the first of equals, as Optuna's `best_trial`).
fn best(measured: Vec<(f64, Trial)>) -> Trial {
    let mut top = measured[0];
    for m in measured {
        if m.0 > top.0 {
            top = m;
        }
    }
    top.1
}

/// A trial as llama.cpp runs it: `-t` for generation and prompt alike, the micro-batch no larger
/// than the batch; flash attention `on` with `--flash-attn 1`, else the flag left out (`off_as`:
/// llama-bench's and llama-server's default, auto).
fn candidate(t: &Trial, off_as: FlashAttn) -> Candidate {
    Candidate {
        n_gpu_layers: t.ngl,
        n_cpu_moe: t.experts_on_cpu,
        threads: t.threads,
        n_batch: t.batch,
        n_ubatch: t.ubatch.min(t.batch),
        flash_attn: if t.flash_on { FlashAttn::On } else { off_as },
        ..Candidate::llama_default(t.threads, t.ngl)
    }
}

impl Emulation<'_> {
    /// The largest `-ngl` (0–149) whose llama-bench run (`-n 1`, a 512-token prompt, every CPU's
    /// thread) loads, by bisection.
    fn max_ngl(&mut self) -> u32 {
        let (mut low, mut high) = (0u32, 149u32);
        while low < high {
            let mid = (low + high).div_ceil(2);
            let c = Candidate::llama_default(self.cpus, mid);
            let ctx = 513;
            self.seconds += self.land.load_seconds(&c, ctx);
            if self.land.out_of_memory(&c, ctx, false).is_none() {
                self.seconds += self.land.prompt_seconds(&c, ctx, 512, 0);
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        low
    }

    /// The warm-up runs: 3 repetitions of 128 prompt and 128 generated tokens each (time only).
    fn warm_up(&mut self, ngl: u32) {
        let c = Candidate::llama_default(self.cpus, ngl);
        if self.land.out_of_memory(&c, 256, false).is_some() {
            return;
        }
        let rep = self.land.prompt_seconds(&c, 256, 128, 0)
            + 128.0 * self.land.step_seconds(&c, 256, 0, 1);
        let run = self.land.load_seconds(&c, 256) + 3.0 * rep;
        self.seconds += self.o.warmup_runs as f64 * run;
    }

    /// The override patterns' layers of experts on the CPU: none, all, even, odd, up+down, up,
    /// down (a dense model matches none of them).
    fn patterns(&self) -> Vec<u32> {
        let l = self.land.model.n_layers;
        if self.land.model.moe.is_none() {
            return vec![0; 7];
        }
        vec![0, l, l / 2, l / 2, l * 2 / 3, l / 3, l / 3]
    }

    /// Uniform draws over llama-optimus's numeric ranges.
    fn numeric(&mut self, max_ngl: u32) -> Trial {
        Trial {
            batch: self.rng.gen_range(8..=16384),
            ubatch: self.rng.gen_range(4..=8192),
            threads: self.rng.gen_range(1..=self.cpus),
            ngl: self.rng.gen_range(0..=max_ngl),
            flash_on: false,
            experts_on_cpu: 0,
        }
    }

    /// `trials` sampled trials, each measured; the best.
    fn best_of(&mut self, mut sample: impl FnMut(&mut Self) -> Trial) -> Trial {
        let measured = (0..self.o.trials)
            .map(|_| {
                let t = sample(self);
                (self.measure(&t), t)
            })
            .collect();
        best(measured)
    }

    /// One llama-bench command: a fresh load, `repeat` repetitions; its average t/s of the
    /// metric, 0 when it fails (what llama-optimus records for a failed run).
    fn measure(&mut self, t: &Trial) -> f64 {
        self.trials += 1;
        let c = candidate(t, FlashAttn::Auto);
        let n = self.o.n_tokens;
        let (prompt, ctx) = match self.o.metric {
            OptimusMetric::Tg => (0, n),
            OptimusMetric::Mean => (2 * n, 3 * n),
        };
        self.seconds += self.land.load_seconds(&c, ctx);
        if self.land.out_of_memory(&c, ctx, false).is_some() {
            return 0.0;
        }
        let offset = load_offset(self.land, self.rng);
        let (mut pp, mut tg) = (0.0, 0.0);
        for _ in 0..self.o.repeat {
            let step =
                self.land.step_seconds(&c, ctx, 0, 1) / (offset * jitter(self.land, self.rng));
            self.seconds += n as f64 * step;
            tg += 1.0 / step;
            if prompt > 0 {
                let s = self.land.prompt_seconds(&c, ctx, prompt, 0)
                    / (offset * jitter(self.land, self.rng));
                self.seconds += s;
                pp += prompt as f64 / s;
            }
        }
        let r = self.o.repeat as f64;
        match self.o.metric {
            OptimusMetric::Tg => tg / r,
            OptimusMetric::Mean => (tg + pp) / (2.0 * r),
        }
    }
}

/// A fresh load's lasting speed offset, as the simulated measurer draws it.
fn load_offset(land: &Landscape, rng: &mut StdRng) -> f64 {
    let spread = land.load_spread;
    1.0 + rng.gen_range(-spread..=spread)
}

/// One repetition's multiplicative noise, as the simulated measurer draws it.
fn jitter(land: &Landscape, rng: &mut StdRng) -> f64 {
    (1.0 + land.noise * super::standard_normal(rng)).max(0.5)
}

/// A FiTuna run's result: the `-ngl` it prints (none when a bench failed: the search ends with an
/// error), the simulated seconds it spent and its llama-bench commands.
pub struct FitunaRun {
    pub pick: Option<Candidate>,
    pub seconds: f64,
    pub benches: u32,
}

/// FiTuna 0.2.0 (PyPI `fituna`, `search.py`'s `search`) at the model's one quantization, asked
/// for a speed above reach (the user wants the fastest there is). It decides `-ngl` alone, from
/// `llama-bench -ngl N -p 512 -n 128 -d ctx-640` (its 5 repetitions by default, generation t/s
/// decides): every layer first (`-ngl n_layers`, which leaves the output layer on the host), then
/// none, then a bisection of at most 6 more between them, each below the target. Nothing reaches
/// it, and it prints the fastest bench's `-ngl` as `llama-server -m … -ngl N -c ctx`: llama.cpp's
/// defaults for the rest. A bench that fails (out of memory: every layer of a model larger than
/// the GPU) ends the search with an error, and no configuration. It runs no noise threshold and
/// no repetition beyond llama-bench's own.
pub fn fituna(land: &Landscape, s: &TuneSettings, rng: &mut StdRng) -> FitunaRun {
    let layers = land.model.n_layers;
    let (mut seconds, mut benches) = (0.0, 0);
    let mut seen: Vec<(f64, u32)> = Vec::new();
    let mut bench = |ngl: u32| -> Option<()> {
        let c = Candidate::llama_default(s.default_threads, ngl);
        benches += 1;
        let tg = fituna_bench(land, s, &c, rng, &mut seconds)?;
        seen.push((tg, ngl));
        Some(())
    };
    let searched = (|| {
        bench(layers)?;
        if !land.devices.is_empty() {
            bench(0)?;
            let (mut lo, hi) = (0, layers);
            for _ in 0..6 {
                if lo >= hi {
                    break;
                }
                let mid = (lo + hi) / 2;
                bench(mid)?;
                lo = mid + 1;
            }
        }
        Some(())
    })();
    // The fastest bench seen (`consider_best_effort`), the first of equals.
    let pick = searched.and_then(|_| {
        let first = *seen.first()?;
        let best = seen
            .iter()
            .fold(first, |b, &x| if x.0 > b.0 { x } else { b });
        Some(Candidate::llama_default(s.default_threads, best.1))
    });
    FitunaRun {
        pick,
        seconds,
        benches,
    }
}

/// One `llama-bench -p 512 -n 128 -d D` (D fills the context to the run's) on a fresh load: its
/// mean generation t/s over 5 repetitions at that depth, `None` when it does not load.
fn fituna_bench(
    land: &Landscape,
    s: &TuneSettings,
    c: &Candidate,
    rng: &mut StdRng,
    seconds: &mut f64,
) -> Option<f64> {
    let ctx = s.plan.workload.n_ctx;
    let depth = ctx.saturating_sub(640);
    *seconds += land.load_seconds(c, ctx);
    if land.out_of_memory(c, ctx, false).is_some() {
        return None;
    }
    let offset = load_offset(land, rng);
    let mut tg = 0.0;
    for _ in 0..5 {
        let step = land.step_seconds(c, ctx, depth, 1) / (offset * jitter(land, rng));
        *seconds += land.prompt_seconds(c, ctx, depth, 0) + land.prompt_seconds(c, ctx, 512, depth);
        *seconds += 128.0 * step;
        tg += 1.0 / step;
    }
    Some(tg / 5.0)
}

/// A ggrun run's result: the llama-server configuration it keeps after its `--ai-tune` rounds, the
/// simulated seconds they took and how many launches they measured.
pub struct GgrunRun {
    pub pick: Candidate,
    pub seconds: f64,
    pub launches: u32,
}

/// ggrun's `--ai-tune` (raketenkater/ggrun, its Go version: `placement.Compute`, then
/// `tune.Engine.Run`) on a model it runs with mainline llama.cpp. The placement: one GPU, every
/// layer, when the weights, the KV cache and a 1 GiB compute buffer fit the best GPU's free
/// memory; else, where the weights, the cache and 1 GiB a GPU fit all of them, a dense model over
/// the fewest GPUs (at least 2) whose free memory less 1 GiB and their part of the cache each
/// holds the weights and half the cache, every layer, split by free memory; else llama.cpp's fit
/// (`--fit on`; `-ot` expert placement of MoE models is not emulated: its fit stands in). With
/// `--no-mmap` off the GPUs, a q8_0 KV cache, flash attention on, every physical core for both
/// thread counts, and a batch of 8192/1024, 4096/512 or 2048/512 by what still fits the best GPU
/// (a compute buffer of 4 x the micro-batch in MiB, 1-4 GiB). Then 8 rounds of its fixed plan for
/// a dense model (KV f16, K f16 with V q8_0, prompt threads on every logical CPU, the batch
/// doubled, a batch of 16384, the micro-batch halved, doubled, quadrupled, the KV cache on the
/// host), each a relaunch measured once by the generation t/s of a 256-token reply and kept when
/// at least 1% faster than the best so far, with the skipped no-ops and predicted OOMs costing no
/// round; a last back-to-back launch of the baseline and the winner keeps the winner only if it
/// still leads by 1%. The LLM it asks once that plan runs out is not emulated (8 rounds end first).
pub fn ggrun(land: &Landscape, s: &TuneSettings, rng: &mut StdRng) -> GgrunRun {
    let mut e = Ggrun {
        land,
        s,
        rng,
        seconds: 0.0,
        launches: 0,
    };
    let base = e.placement();
    let mut best = (e.launch(&base), base.clone());
    let mut rounds = 0;
    for change in ggrun_plan(2 * land.host.physical_cores) {
        if rounds == 8 {
            break;
        }
        let mut c = best.1.clone();
        change(&mut c);
        let fits = land
            .out_of_memory(&c, s.plan.workload.n_ctx, false)
            .is_none();
        // No-ops and predicted OOMs are skipped without a round.
        if c == best.1 || c.n_ubatch > c.n_batch || !fits {
            continue;
        }
        rounds += 1;
        let tg = e.launch(&c);
        if tg >= best.0 * 1.01 {
            best = (tg, c);
        }
    }
    // The confirmation: the baseline and the winner back to back.
    if best.1 != base {
        let (b, w) = (e.launch(&base), e.launch(&best.1));
        if w < b * 1.01 {
            best.1 = base;
        }
    }
    GgrunRun {
        pick: best.1,
        seconds: e.seconds,
        launches: e.launches,
    }
}

/// One change of ggrun's plan to a configuration.
type Change = Box<dyn Fn(&mut Candidate)>;

/// The plan's changes for a dense model on mainline llama.cpp (`deterministicPlan`'s order), each
/// applied to the best configuration so far.
fn ggrun_plan(logical: u32) -> Vec<Change> {
    use search_space::{CacheType, KvOffload};
    vec![
        Box::new(|c| (c.type_k, c.type_v) = (CacheType::F16, CacheType::F16)),
        Box::new(|c| (c.type_k, c.type_v) = (CacheType::F16, CacheType::Q8_0)),
        Box::new(move |c| c.threads_batch = Some(logical)),
        Box::new(|c| c.n_batch = (2 * c.n_batch).min(8192)),
        Box::new(|c| c.n_batch = 16384),
        Box::new(|c| c.n_ubatch = (c.n_ubatch / 2).max(256)),
        Box::new(|c| c.n_ubatch = (2 * c.n_ubatch).min(4096)),
        Box::new(|c| c.n_ubatch = (4 * c.n_ubatch).min(4096)),
        Box::new(|c| c.kv_offload = KvOffload::Off),
    ]
}

struct Ggrun<'a> {
    land: &'a Landscape,
    s: &'a TuneSettings,
    rng: &'a mut StdRng,
    seconds: f64,
    launches: u32,
}

impl Ggrun<'_> {
    /// `placement.Compute`'s strategy and flags (see [`ggrun`]).
    fn placement(&self) -> Candidate {
        use search_space::{CacheType, HostBuffer};
        let (land, s) = (self.land, self.s);
        let m = &land.model;
        let ctx = s.plan.workload.n_ctx as u64;
        let size = m.n_layers as u64 * m.layer_bytes + m.output_bytes + m.embd_bytes;
        let kv = ctx * m.n_layers as u64 * m.kv_bytes_per_token_layer * 17 / 32; // q8_0
        let free: Vec<u64> = land.devices.iter().map(|d| d.mem_bytes).collect();
        let best_free = free.iter().copied().max().unwrap_or(0);
        let compute = |ub: u64| (4 * ub).clamp(1024, 4096) * MIB;
        let (n_batch, n_ubatch) = if size + kv + compute(1024) <= best_free {
            (8192, 1024)
        } else if size + kv + compute(512) <= best_free {
            (4096, 512)
        } else {
            (2048, 512)
        };
        let mut c = Candidate {
            n_gpu_layers: m.n_layers + 1,
            type_k: CacheType::Q8_0,
            type_v: CacheType::Q8_0,
            flash_attn: FlashAttn::On,
            n_batch,
            n_ubatch,
            ..Candidate::llama_default(land.host.physical_cores, 0)
        };
        if free.is_empty() {
            return Candidate {
                n_gpu_layers: 0,
                ..c
            };
        }
        if size + GIB + kv <= best_free {
            c.devices = vec![land.devices[0].name.clone()];
            return c;
        }
        let need = size + kv / 2;
        let room = |n: usize| {
            free[..n]
                .iter()
                .map(|f| f.saturating_sub(GIB + kv / n as u64))
                .sum::<u64>()
        };
        let all = free.len() as u64;
        if m.moe.is_none() && all >= 2 && size + all * GIB + kv <= free.iter().sum::<u64>() {
            if let Some(n) = (2..=free.len()).find(|&n| room(n) >= need) {
                if n < free.len() {
                    c.devices = land.devices[..n].iter().map(|d| d.name.clone()).collect();
                }
                return c;
            }
        }
        // `--fit on --no-mmap`: llama.cpp's placement under its default margin.
        let fit = super::harness::llama_fit(land, s);
        Candidate {
            n_gpu_layers: fit.n_gpu_layers,
            n_cpu_moe: fit.n_cpu_moe,
            tensor_split: fit.tensor_split,
            host_buffer: HostBuffer::Pinned,
            ..c
        }
    }

    /// One launch of llama-server and its benchmark: a warm-up, a prompt, a 256-token reply; its
    /// generation t/s (0 when it does not load).
    fn launch(&mut self, c: &Candidate) -> f64 {
        self.launches += 1;
        let (land, ctx) = (self.land, self.s.plan.workload.n_ctx);
        self.seconds += land.load_seconds(c, ctx);
        if land.out_of_memory(c, ctx, false).is_some() {
            return 0.0;
        }
        let offset = load_offset(land, self.rng);
        let step = land.step_seconds(c, ctx, 100, 1) / (offset * jitter(land, self.rng));
        self.seconds += 2.0 * land.prompt_seconds(c, ctx, 100, 0) + (32.0 + 256.0) * step;
        1.0 / step
    }
}
