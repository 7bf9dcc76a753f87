//! A simulated landscape for testing the engine's search logic — unit tests and `bench/search-sim`
//! only; a user's run always measures real llama.cpp through worker processes.
//!
//! [`Landscape`] is a roofline model of devices and a model (see `landscape.rs`); [`SimMeasurer`]
//! answers the engine's [`Measurer`] calls from it the way the worker pool would: loads are kept per
//! placement (two at most), each load runs a seeded offset faster or slower for as long as it lives,
//! each repetition has seeded multiplicative noise, a seeded share of repetitions crash their worker,
//! a configuration that exceeds a device's memory fails to load like llama.cpp's out-of-memory, and
//! the clock is simulated: every dry run, load, warm-up and repetition advances it by the seconds it
//! would take, so the budget logic runs in microseconds. llama.cpp's own fit, asked for the baseline,
//! is emulated on the landscape (`llama_fit.rs`), and so are other tools' ways of choosing, for
//! `bench/vs-tuners` (`rivals.rs`). Deterministic for a seed.

mod axes_tests;
mod backend_tests;
mod baseline_tests;
mod bench;
mod budget_tests;
mod ceiling_tests;
mod context_tests;
mod crash_tests;
mod depth_tests;
mod ffn_tests;
mod gate_tests;
pub mod harness;
mod host_buffer_tests;
mod host_tests;
mod hosts_tests;
pub mod landscape;
mod llama_fit;
mod moe_tests;
mod placement_tests;
mod rivals;
mod rounds_tests;
mod screen_tests;
mod split_tests;
mod strategy_tests;

pub use landscape::{candidate_of, Device, Host, Landscape, Moe, OtherBackend, SimModel, GIB, MIB};

use crate::engine::score_seconds;
use crate::measuring::TrialFailure;
use crate::measuring::{FitAnswer, FitRequest};
use crate::measuring::{KvQualityAnswer, KvQualityRequest, Measurer};
use crate::measuring::{LoadReport, MeasureRequest, Repetition};
use profiles::QualityFigures;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use search_space::{CacheType, Candidate};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// What happened to one measurement call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Measured,
    OutOfMemory,
    Crashed,
    /// Stopped at its `give_up` limit.
    GaveUp,
}

/// Everything the simulator saw, shared with the test that reads it after the run.
#[derive(Debug, Default)]
pub struct Trace {
    /// Every measurement call in order, with its outcome and the simulated time it ended.
    pub calls: Vec<(Candidate, Outcome, f64)>,
    pub loads: u32,
    pub dry_runs: u32,
    /// Times llama.cpp's fit was asked (each costs its dry runs in simulated time).
    pub llama_fits: u32,
    /// K/V pairs whose quality the gate measured.
    pub kv_checks: Vec<(CacheType, CacheType)>,
    /// The simulated time each of those began.
    pub kv_checks_began: Vec<f64>,
    /// The request each measurement call asked for (its workload: a screen's is shorter).
    pub requests: Vec<crate::measuring::Workload>,
}

impl Trace {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.calls.iter().filter(|(_, o, _)| *o == outcome).count()
    }
}

/// Which configurations a measurer's rates are scaled for, and by how much.
pub type Skew = (fn(&Candidate) -> bool, f64);

/// One loaded model in a simulated worker.
struct Loaded {
    model: String,
    context: Option<String>,
    /// This load's lasting speed offset (multiplicative).
    offset: f64,
}

impl Landscape {
    /// What a run's probes would find here: where the host alone computes, generation at the host's
    /// bandwidth (at the best thread count and NUMA strategy) over the bytes a token reads, and the
    /// prompt at every core's compute with repacked kernels at the most efficient micro-batch over
    /// the multiplications a token needs (the landscape's own formulas, their fixed costs left
    /// out: a bound, never reached); nothing beside a device, where the real probes bound nothing.
    pub fn ceilings(&self, w: &crate::measuring::Workload) -> crate::measuring::Ceilings {
        if !self.devices.is_empty() {
            return crate::measuring::Ceilings::default();
        }
        let c = Candidate::llama_default(1, 0);
        let read: f64 = (self.shares(&c, w.n_ctx).iter())
            .map(|s| s.read_per_token)
            .sum();
        let nodes = f64::from(self.host.numa_nodes.max(1));
        let numa = if nodes > 1.0 {
            0.9f64.max(1.1 / nodes)
        } else {
            1.0
        };
        let cores = f64::from(self.host.physical_cores.max(1));
        let best_batch = 512.0 / (512.0 + 96.0);
        crate::measuring::Ceilings {
            generation_tps: Some(self.host.bandwidth * numa / read),
            // A probe of the kernels' peak: a little above what a whole graph reaches (its other
            // operations), as the real one is.
            prompt_tps: Some(
                1.02 * self.host.flops_per_core * cores * 1.3 * best_batch / (3.6 * read),
            ),
            method: vec!["the simulated host's bandwidth and compute".into()],
        }
    }
}

/// The engine's measurer on a simulated landscape.
pub struct SimMeasurer {
    pub land: Landscape,
    rng: StdRng,
    clock: f64,
    max_alive: usize,
    loaded: Vec<Loaded>,
    crashes: HashMap<String, u32>,
    /// Configurations that always crash (a kernel that aborts, say), besides the random crashes.
    pub crashing: Option<fn(&Candidate) -> bool>,
    /// llama.cpp's fit failing with this message (a worker that aborts, say) instead of answering.
    pub llama_fit_error: Option<String>,
    pub trace: Rc<RefCell<Trace>>,
    /// The configurations whose every rate is scaled by this factor (a landscape's tie nudged).
    pub skew: Option<Skew>,
}

fn model_key(req: &MeasureRequest) -> String {
    let mut s = req.settings.clone();
    s.no_alloc = false;
    serde_json::to_string(&s).expect("serialises")
}

/// A standard normal draw (Box–Muller), clipped at ±3: a repetition's noise.
pub fn standard_normal(rng: &mut StdRng) -> f64 {
    let (u1, u2): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()).clamp(-3.0, 3.0)
}

impl SimMeasurer {
    pub fn new(land: Landscape, seed: u64) -> Self {
        SimMeasurer {
            land,
            rng: StdRng::seed_from_u64(seed ^ 0x5157_4c41_4e44),
            clock: 0.0,
            max_alive: 2,
            loaded: Vec::new(),
            crashes: HashMap::new(),
            crashing: None,
            llama_fit_error: None,
            trace: Rc::default(),
            skew: None,
        }
    }

    fn normal(&mut self) -> f64 {
        standard_normal(&mut self.rng)
    }

    fn record(&mut self, c: &Candidate, outcome: Outcome) {
        let now = self.clock;
        self.trace
            .borrow_mut()
            .calls
            .push((c.clone(), outcome, now));
    }

    /// As the worker stops a repetition at its limit: the phases the score counts run until their
    /// time passes the limit (per request), the others run whole; the clock is charged that.
    fn give_up(&mut self, req: &MeasureRequest, rep: &Repetition) -> Option<TrialFailure> {
        let g = req.give_up?;
        let w = &req.workload;
        let limit = g.limit_ms as f64 / 1e3;
        let score = score_seconds(rep, w);
        if score <= limit {
            return None;
        }
        let np = f64::from(w.n_parallel.max(1));
        let unscored = (self.land.rep_seconds(rep, w) - score * np).max(0.0);
        self.clock += unscored + limit * np;
        Some(TrialFailure::GaveUp {
            limit_ms: g.limit_ms,
            best_ms: g.best_ms,
            load: rep.load.clone().map(Box::new),
            took_ms: None,
        })
    }

    fn oom(&mut self, c: &Candidate, stage: &str, message: String) -> TrialFailure {
        self.record(c, Outcome::OutOfMemory);
        TrialFailure::Refused {
            stage: stage.into(),
            message,
        }
    }

    /// The worker holding this request's model, loading it (evicting the oldest) when needed;
    /// `Ok(true)` when the model was loaded now.
    fn ensure_loaded(
        &mut self,
        req: &MeasureRequest,
        c: &Candidate,
    ) -> Result<usize, TrialFailure> {
        let key = model_key(req);
        if let Some(i) = self.loaded.iter().position(|l| l.model == key) {
            return Ok(i);
        }
        if self.loaded.len() >= self.max_alive {
            self.loaded.remove(0);
        }
        self.trace.borrow_mut().loads += 1;
        self.clock += self.land.load_seconds(c, req.context.n_ctx);
        if let Some(why) = self.land.out_of_memory(c, req.context.n_ctx, true) {
            return Err(self.oom(c, "load", why));
        }
        let spread = self.land.load_spread;
        let offset = if spread > 0.0 {
            1.0 + self.rng.gen_range(-spread..=spread)
        } else {
            1.0
        };
        self.loaded.push(Loaded {
            model: key,
            context: None,
            offset,
        });
        Ok(self.loaded.len() - 1)
    }
}

impl Measurer for SimMeasurer {
    fn measure(
        &mut self,
        req: &MeasureRequest,
        _stop: &dyn Fn() -> bool,
    ) -> Result<Repetition, TrialFailure> {
        let c = candidate_of(req);
        let w = &req.workload;
        self.trace.borrow_mut().requests.push(w.clone());
        let i = self.ensure_loaded(req, &c)?;
        let mut ideal = self.land.ideal(&c, w);
        if let Some((_, k)) = self.skew.filter(|(skewed, _)| skewed(&c)) {
            ideal.pp_tps *= k;
            ideal.tg_tps *= k;
        }
        let context = serde_json::to_string(&req.context).expect("serialises");
        let fresh = self.loaded[i].context.as_deref() != Some(context.as_str());
        // The worker warms a fresh load up on the whole prompt where a device may run its batches.
        let whole =
            self.loaded[i].context.is_none() && req.phases.prompt && !self.land.devices.is_empty();
        if fresh {
            if let Some(why) = self.land.out_of_memory(&c, w.n_ctx, false) {
                self.loaded.remove(i);
                return Err(self.oom(&c, "context", why));
            }
            // The discarded warm-up.
            self.clock += self
                .land
                .warm_up_seconds(&ideal, w, req.context.n_batch, whole);
            self.loaded[i].context = Some(context);
        }
        let crash = self.rng.gen::<f64>() < self.land.crash_rate;
        if crash || self.crashing.is_some_and(|f| f(&c)) {
            self.loaded.remove(i);
            *self.crashes.entry(model_key(req)).or_insert(0) += 1;
            self.clock += 1.0;
            self.record(&c, Outcome::Crashed);
            return Err(TrialFailure::Crashed {
                signal: 6,
                name: "SIGABRT".into(),
                stderr_tail: "simulated crash".into(),
            });
        }
        let offset = self.loaded[i].offset;
        let noise = self.land.noise;
        let jitter = |x: f64, m: &mut Self| x * offset * (1.0 + noise * m.normal()).max(0.5);
        let mut rep = Repetition {
            pp_tps: jitter(ideal.pp_tps, self),
            tg_tps: jitter(ideal.tg_tps, self),
            pp_depth_tps: ideal.pp_depth_tps.map(|d| jitter(d, self)),
            tg_depth_tps: ideal.tg_depth_tps.map(|d| jitter(d, self)),
            load: fresh.then(|| LoadReport {
                load_seconds: self.land.load_seconds(&c, w.n_ctx),
                ..self.land.footprint(&c, w.n_ctx)
            }),
            timed: search_space::Phases::BOTH,
            screen: None,
        };
        if req.phases.is_both() {
            if let Some(stopped) = self.give_up(req, &rep) {
                self.record(&c, Outcome::GaveUp);
                return Err(stopped);
            }
        }
        // As the worker: only the phases asked for are timed (and take time); the others' figures
        // are the engine's to lend.
        self.clock += self.land.timed_seconds(&rep, w, req.phases);
        untimed_zeroed(&mut rep, req.phases);
        self.record(&c, Outcome::Measured);
        Ok(rep)
    }

    fn footprint(
        &mut self,
        req: &MeasureRequest,
        _stop: &dyn Fn() -> bool,
    ) -> Result<LoadReport, String> {
        self.trace.borrow_mut().dry_runs += 1;
        self.clock += 0.3;
        Ok(self.land.footprint(&candidate_of(req), req.context.n_ctx))
    }

    fn llama_fit(
        &mut self,
        req: &FitRequest,
        _stop: &dyn Fn() -> bool,
    ) -> Result<FitAnswer, String> {
        self.trace.borrow_mut().llama_fits += 1;
        if let Some(e) = &self.llama_fit_error {
            self.clock += 1.0;
            return Err(e.clone());
        }
        let (answer, dry_runs) = self.land.llama_fit(req);
        self.clock += 0.3 * dry_runs as f64;
        Ok(answer)
    }

    /// As `explain`'s probe: about 3 s a device, the device's bandwidth within the noise (drawn
    /// apart from the repetitions' noise, which stays as it was without the probe). The models in
    /// memory are let go, as the real probe's workers let go of theirs.
    fn device_bandwidths(
        &mut self,
        devices: &[(String, u64)],
        _rpc: &[String],
    ) -> Vec<(String, f64)> {
        self.loaded.clear();
        let mut out = Vec::new();
        for (k, d) in self.land.devices.iter().enumerate() {
            if devices.iter().any(|(name, _)| *name == d.name) {
                self.clock += 3.0;
                let mut rng = StdRng::seed_from_u64(0xBA4D ^ k as u64);
                let noise = self.land.noise * standard_normal(&mut rng);
                out.push((d.name.clone(), d.bandwidth * (1.0 + noise)));
            }
        }
        out
    }

    /// The landscape's figure for the pair, in the time two passes over the text take (a round
    /// 10 s and a second per thousand tokens each). The engine's stop (an interruption) is heeded
    /// before it begins; one begun runs to its end, or to `ends_by` on the simulated clock.
    fn kv_quality(
        &mut self,
        req: &KvQualityRequest,
        stop: &dyn Fn() -> bool,
        ends_by: Duration,
    ) -> Result<KvQualityAnswer, String> {
        if stop() {
            return Err("stopped before it began".into());
        }
        self.loaded.clear();
        let mut trace = self.trace.borrow_mut();
        trace.kv_checks.push((req.type_k, req.type_v));
        trace.kv_checks_began.push(self.clock);
        drop(trace);
        self.clock += 10.0 + 2.0 * f64::from(req.max_tokens) / 1000.0;
        if self.clock >= ends_by.as_secs_f64() {
            self.clock = self.clock.min(ends_by.as_secs_f64().max(0.0));
            return Err("stopped at the budget's end".into());
        }
        let kld = self.land.kv_kld(req.type_k, req.type_v);
        Ok(KvQualityAnswer {
            figures: QualityFigures {
                positions: u64::from(req.max_tokens),
                kld_mean: kld,
                kld_se: kld / 20.0,
                kld_median: kld / 3.0,
                kld_p99: kld * 8.0,
                kld_p999: kld * 30.0,
                kld_max: kld * 40.0,
                top1: (1.0 - 1.7 * kld.sqrt()).max(0.0),
                ref_ppl: 10.0,
                ppl: 10.0 * (1.0 + kld),
            },
            weights_kld: None,
            against: None,
            measured_with: profiles::MeasuredWith {
                llama: "simulated".into(),
                backend: "simulated".into(),
                flash_attn: req.flash_attn,
            },
            cached: false,
            seconds: 0.0,
        })
    }

    fn crashes_for(&self, req: &MeasureRequest) -> u32 {
        self.crashes.get(&model_key(req)).copied().unwrap_or(0)
    }

    fn unload(&mut self) {
        self.loaded.clear();
    }

    fn shutdown(&mut self) {
        self.loaded.clear();
    }

    fn elapsed(&self) -> Duration {
        Duration::from_secs_f64(self.clock)
    }
}

/// `rep` as a worker that timed `phases` alone answers it: the other phase's figures 0.
fn untimed_zeroed(rep: &mut Repetition, phases: search_space::Phases) {
    rep.timed = phases;
    if !phases.prompt {
        rep.pp_tps = 0.0;
        rep.pp_depth_tps = rep.pp_depth_tps.map(|_| 0.0);
    }
    if !phases.generation {
        rep.tg_tps = 0.0;
        rep.tg_depth_tps = rep.tg_depth_tps.map(|_| 0.0);
    }
}
