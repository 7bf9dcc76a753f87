//! Other tools' ways of choosing a configuration, emulated on the landscape for `bench/vs-tuners`:
//! Ollama's offload estimate and llama-optimus's measured search. Each follows the tool's own
//! code (read from its sources, not guessed); where the simulator cannot say what the tool says,
//! the emulation says what stands in for it. A model of those tools on a model of hardware: it
//! compares decision procedures, not the tools' real speed.

use super::landscape::{Landscape, MIB};
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
    let ctx = s.workload.n_ctx as u64;
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
        let spread = self.land.load_spread;
        let offset = 1.0 + self.rng.gen_range(-spread..=spread);
        let (mut pp, mut tg) = (0.0, 0.0);
        for _ in 0..self.o.repeat {
            let step = self.land.step_seconds(&c, ctx, 0, 1) / (offset * self.jitter());
            self.seconds += n as f64 * step;
            tg += 1.0 / step;
            if prompt > 0 {
                let s = self.land.prompt_seconds(&c, ctx, prompt, 0) / (offset * self.jitter());
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

    /// One repetition's multiplicative noise, as the simulated measurer draws it.
    fn jitter(&mut self) -> f64 {
        (1.0 + self.land.noise * super::standard_normal(self.rng)).max(0.5)
    }
}
