//! The tuning run: measure llama.cpp's defaults, then walk the knobs one axis at a time (coordinate
//! descent), measuring each axis's variants interleaved and shuffled, and keep a change only when it
//! beats the current best beyond the noise threshold.
//!
//! Why coordinate descent: on a CPU the knobs interact weakly (threads and kernels set the compute
//! rate, KV type and flash attention the attention cost, batch sizes the prompt throughput), so one
//! pass along each axis from the defaults finds the grid's best in a small fraction of its size.
//! Every candidate is measured in rounds: each round runs every unfinished candidate once, in a
//! shuffled order (seeded, recorded), so slow drift of the machine hits all candidates alike.

use crate::measuring::LoadReport;
use crate::measuring::{ContextSettings, MeasureRequest, Measurer, ModelSettings, Progress};
use crate::measuring::{Screen, SkippedAxis, TimePlan};
use crate::stats::Verdict;
use profiles::measurements::MeasurementLog;
use run::{BaselinePlacement, BaselineSource};
use search_space::{CacheType, Candidate, Phases};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// The simulated landscape the engine's decisions are tested on (tests and `bench/search-sim` only;
/// a user's run always measures llama.cpp). Declared here so it sits beside what it tests.
#[cfg(test)]
#[path = "sim/mod.rs"]
pub(crate) mod sim;

mod axes;
mod backends;
pub mod baseline;
mod ceiling;
mod challenge;
mod confirm;
pub mod context;
pub(crate) mod fidelity;
mod gate;
mod group;
mod hosts;
mod lent;
mod order;
pub(crate) mod placement;
pub mod ranking;
mod result;
mod rounds;
mod run;
mod search;
mod settings;
pub(crate) mod split;
mod strategy;
mod time;
mod view;
#[cfg(test)]
pub use rounds::{GATE_WOULD_OVERRUN, GIVE_UP_FACTOR, ONE_REPETITION_FACTOR};

pub use axes::grid;
pub(crate) use axes::in_space;
#[cfg(test)]
pub(crate) use axes::offloads_host_ops;
pub(crate) use axes::vary_cache;
#[cfg(test)]
pub(crate) use axes::AXES;
use axes::*;
#[cfg(test)]
pub(crate) use backends::backend_of_device;
pub use result::{score_seconds, CandidateResult, BUDGET_SPENT};
use result::{tie_break, tie_winner};
pub use run::{BackendTried, Run, TwinVerdict};
#[cfg(test)]
pub use settings::TEXT;
pub use settings::{
    split_modes_for, GateChoice, Plan, QualityGate, TuneSettings, DEFAULT_MAX_KV_KLD,
    SCORED_POSITIONS,
};

/// What [`Engine::conclude`] found after the search.
pub(crate) struct Concluded {
    pub winner: Option<Candidate>,
    /// The finalists the confirmation measured, the search's winner first.
    pub confirmed: Vec<Candidate>,
    /// Each finalist's median on the workload's request over its median where it was screened,
    /// less one.
    pub drift: Vec<(Candidate, f64)>,
    pub twin: Option<TwinVerdict>,
}

/// How a tie is broken: on an axis beside an offload device toward less memory (what it frees may
/// buy a later axis more), on the host's axes and in the run's choice toward the lossless setting;
/// in the run's choice a tie counts below the best as above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ties {
    LessMemory,
    Lossless,
    Final,
}

/// Visits (a load, its warm-up and two repetitions) a default budget leaves time for: about what
/// the search needs on a model split over several GPUs (`bench/vs-tuners`).
pub const VISITS: f64 = 40.0;

/// What the quality gate holds a candidate to: its K/V pair and their rotation.
type Lossy = (CacheType, CacheType, search_space::AttnRot);

fn lossy_of(c: &Candidate) -> Lossy {
    (c.type_k, c.type_v, c.attn_rot)
}

pub struct Engine<'a> {
    pub settings: TuneSettings,
    pub results: Vec<CandidateResult>,
    /// Behind a cell so that dry runs, which allocate nothing and measure nothing, can be asked
    /// from a shared borrow: the strategies propose from a read-only view ([`search`]).
    pub(crate) measurer: RefCell<Box<dyn Measurer + 'a>>,
    /// Dry-run results by request key.
    pub(crate) footprints: RefCell<HashMap<String, Result<LoadReport, String>>>,
    log: Option<&'a mut MeasurementLog>,
    round: u64,
    stop: &'a dyn Fn() -> bool,
    pub(crate) progress: &'a dyn Progress,
    pub interrupted: bool,
    pub budget_spent: bool,
    /// The axes the search had candidates for but did not reach before the budget ran out.
    pub not_reached: Vec<String>,
    /// The seconds the baseline's first visit took, once the default budget was sized on it.
    pub visit_seconds: Option<f64>,
    /// The baseline as this run measures it (llama.cpp's fit placement with an offload device), and
    /// where its placement came from.
    defaults: Option<(Candidate, BaselinePlacement)>,
    /// The offload devices' memory read bandwidths, probed once before anything loads where the
    /// run may split layers over two or more ([`Engine::probe_device_bandwidths`]).
    pub(crate) device_bandwidths: Option<Vec<(String, f64)>>,
    /// Candidates whose first visits come right after the baseline's, in this order, in the group
    /// being measured (the roofline's split, the fastest devices alone): where the budget ends
    /// within the group, they are the ones measured.
    pub(crate) promising: Vec<Candidate>,
    /// What the group being measured borrows for the phase its repetitions do not time
    /// ([`Engine::lent_for`]); `None` outside a group and where every phase is timed.
    lent: Option<lent::Lent>,
    /// The K/V pairs held to the quality gate so far, with their verdicts ([`gate`]).
    pub(crate) kv_checks: Vec<profiles::KvQualityCheck>,
    /// What the backend axis measured ([`backends`]).
    pub(crate) backend_trials: Vec<BackendTried>,
    /// The run's time as said once llama.cpp's defaults were measured ([`time`]).
    pub time_plan: Option<TimePlan>,
    /// The axes not measured: the ceilings left nothing beyond the noise to win there
    /// ([`ceiling`]).
    pub skipped_axes: Vec<SkippedAxis>,
    /// The request size decided at now ([`fidelity`]): a screen, or `None`, the workload's own.
    fidelity: Option<Screen>,
    /// The model keys of the configurations measured last, most recent last: a first visit of a
    /// configuration that shares one reuses its load ([`Engine::step_cost`]).
    loaded: Vec<Vec<String>>,
}

impl<'a> Engine<'a> {
    /// An engine that measures through `measurer`: the worker processes on a user's run
    /// (`tuning`'s `Workers`), the simulator in tests.
    pub fn new(
        settings: TuneSettings,
        measurer: Box<dyn Measurer + 'a>,
        log: Option<&'a mut MeasurementLog>,
        stop: &'a dyn Fn() -> bool,
        progress: &'a dyn Progress,
    ) -> Self {
        Engine {
            settings,
            results: Vec::new(),
            measurer: RefCell::new(measurer),
            footprints: Default::default(),
            log,
            round: 0,
            stop,
            progress,
            interrupted: false,
            budget_spent: false,
            not_reached: Vec::new(),
            visit_seconds: None,
            defaults: None,
            device_bandwidths: None,
            promising: Vec::new(),
            lent: None,
            kv_checks: Vec::new(),
            backend_trials: Vec::new(),
            time_plan: None,
            skipped_axes: Vec::new(),
            fidelity: None,
            loaded: Vec::new(),
        }
    }

    /// `c`'s model is loaded (a worker keeps the last two).
    pub(crate) fn now_loaded(&mut self, c: &Candidate) {
        let key = search_space::knob::model_key(c);
        self.loaded.retain(|k| *k != key);
        self.loaded.push(key);
        if self.loaded.len() > 2 {
            self.loaded.remove(0);
        }
    }

    pub(crate) fn stop_fn(&self) -> &'a dyn Fn() -> bool {
        self.stop
    }

    /// Time since the run started (the measurer's clock: wall time, or the simulator's).
    pub fn elapsed(&self) -> Duration {
        self.measurer.borrow().elapsed()
    }

    /// llama.cpp's defaults, except for a kernel choice or op offload the user excluded (--kernels,
    /// --op-offload: a user who knows the extra kernels or the offload crash here must not see them
    /// run, even as the baseline). With a
    /// non-CPU device llama-server places what fits by its own fit (`--fit`), so the defaults carry
    /// that placement under this run's budgets (`baseline`), unless the user pinned the layers.
    pub fn baseline(&mut self) -> Candidate {
        self.baseline_and_placement().0
    }

    /// The baseline and where its placement came from.
    pub fn baseline_and_placement(&mut self) -> (Candidate, BaselinePlacement) {
        if let Some(d) = &self.defaults {
            return d.clone();
        }
        let mut c =
            Candidate::llama_default(self.settings.default_threads, self.settings.n_gpu_layers);
        // Model-level knobs the user excluded: the baseline loads what the user allowed.
        c.kernels = pick(&self.settings.plan.kernels, c.kernels);
        c.host_buffer = pick(&self.settings.host_buffers, c.host_buffer);
        c.numa = pick(&self.settings.numa, c.numa);
        c.op_offload = pick(&self.settings.op_offload, c.op_offload);
        c.n_cpu_ffn = self.settings.plan.n_cpu_ffn.unwrap_or(0);
        let mut d = if self.settings.offload && !self.settings.n_gpu_layers_pinned() {
            self.fit_defaults(c)
        } else {
            (c, BaselinePlacement::new(BaselineSource::Defaults, None))
        };
        // Where a GPU shows through several backends: through the run's first, named.
        if let Some(home) = self.home_backend() {
            d.0 = self.on_backend(&d.0, home);
        }
        self.defaults = Some(d.clone());
        d
    }

    /// Where the placement search starts: the defaults' settings inside the user's space at
    /// llama.cpp's split by free memory with every expert on its layer's device. The layer walk finds
    /// its own counts; llama.cpp's fit placement (its `-ts` of whole layers, its experts on the host)
    /// is measured beside them as the baseline.
    pub(crate) fn placement_start(&self, base: &Candidate) -> Candidate {
        Candidate {
            tensor_split: Vec::new(),
            n_cpu_moe: 0,
            ..in_space(&self.settings, base)
        }
    }

    pub(crate) fn index_of(&mut self, c: &Candidate) -> usize {
        if let Some(i) = self.results.iter().position(|r| &r.candidate == c) {
            return i;
        }
        let mut r = CandidateResult::new(c.clone());
        r.screen = self.fidelity;
        if let Some(log) = self.log.as_deref() {
            let reps = log.previous_reps(c);
            r.load = reps.iter().rev().find_map(|x| x.load.clone());
            r.reuse(reps);
        }
        self.results.push(r);
        self.results.len() - 1
    }

    pub(crate) fn out_of_time(&mut self) -> bool {
        self.plan_time();
        if (self.stop)() {
            self.interrupted = true;
        }
        if self.elapsed() >= self.settings.time_budget {
            self.budget_spent = true;
        }
        self.interrupted || self.budget_spent
    }

    pub(crate) fn request(&self, c: &Candidate) -> MeasureRequest {
        MeasureRequest {
            model: self.settings.model.clone(),
            settings: ModelSettings::for_candidate(c, &self.settings.plan.rpc),
            context: ContextSettings::for_candidate(c, self.settings.plan.workload.n_ctx)
                .with_sequences(self.settings.plan.workload.n_parallel),
            workload: self.measured_workload(),
            seed: self.settings.plan.seed ^ (self.round.wrapping_mul(0x100_0000_01B3)),
            expect: Vec::new(),
            give_up: None,
            phases: self.lent.as_ref().map_or(Phases::BOTH, |l| l.timed),
        }
    }

    /// Chooses among one axis's measured candidates, the point the search goes on from: the best
    /// median rate, unless another is statistically tied with it, its median within half the
    /// noise threshold of the best, and it uses less memory or is simpler (closer to llama.cpp's
    /// defaults). A lossier KV cache that ties is the point the search goes on from, so that what
    /// its memory buys on later axes (a larger micro-batch, a split toward a faster device) is
    /// measured; the run's choice ([`Engine::choose_final`]) then gives a tie to the lossless
    /// setting. A tie further below is more likely slower than not, and such choices compound
    /// over the axes. The rule holds on every axis: letting every tie win there (memory a tie frees
    /// can buy a later axis more) and limiting only the final choice hit fewer landscapes of
    /// `bench/vs-tuners` (docs/benchmarks.md, "The figures behind the search's choices"). On
    /// landscape 41 the threads axis had then kept llama.cpp's thread count over `-t 8`, 6% faster
    /// there, as three repetitions under the 40 s cap left the two statistically tied.
    ///
    /// A candidate with a quantized K or V cache that would be chosen is held to the quality gate
    /// first ([`Engine::passes_gate`]); one refused is left out with every candidate of its K/V
    /// pair, and the choice is made again among the rest (the lossless caches always remain).
    pub fn choose(&mut self, among: &[Candidate]) -> Option<Candidate> {
        // On the host alone memory buys nothing later (no device takes more layers for it): a tie
        // goes to the lossless setting there too, with no quality evaluation for nothing.
        let ties = match self.settings.offload {
            true => Ties::LessMemory,
            false => Ties::Lossless,
        };
        self.choose_by(among, ties)
    }

    /// The run's choice among every measured candidate: [`Engine::choose`]'s rule, except that a
    /// tie goes to the lossless setting ([`result::tie_winner`]): a quantized cache wins only by
    /// being faster beyond the noise, or by holding more of the model on the offload devices than
    /// every less lossy candidate tied with it; less memory decides only among settings of equal
    /// loss. A user who did not ask for less memory does not get a lossy cache for nothing.
    pub fn choose_final(&mut self, among: &[Candidate]) -> Option<Candidate> {
        self.choose_by(among, Ties::Final)
    }

    fn choose_by(&mut self, among: &[Candidate], ties: Ties) -> Option<Candidate> {
        let mut refused: Vec<Lossy> = Vec::new();
        loop {
            let pick = self.choose_ungated(among, &refused, ties)?;
            if self.passes_gate(&pick) {
                return Some(pick);
            }
            refused.push(lossy_of(&pick));
        }
    }

    /// [`Engine::choose`]'s rule among the candidates whose K/V pair is not in `refused`.
    fn choose_ungated(
        &self,
        among: &[Candidate],
        refused: &[Lossy],
        ties: Ties,
    ) -> Option<Candidate> {
        let w = &self.settings.plan.workload;
        let found: Vec<&CandidateResult> = among
            .iter()
            .filter(|c| !refused.contains(&lossy_of(c)))
            .filter_map(|c| self.results.iter().find(|r| &r.candidate == c))
            .filter(|r| r.ok())
            .collect();
        // In the run's choice, measured figures alone: a phase a repetition borrowed from its group
        // is a constant outside it, with no variance to judge by.
        let whole: Vec<CandidateResult> = match ties {
            Ties::Final => found.iter().map(|r| r.timed_whole()).collect(),
            _ => Vec::new(),
        };
        let measured: Vec<&CandidateResult> = match ties {
            Ties::Final => whole.iter().filter(|r| r.ok()).collect(),
            _ => found,
        };
        let top = measured.iter().max_by(|a, b| {
            let (ma, mb) = (
                a.rate_sample(w).map(|s| s.median()),
                b.rate_sample(w).map(|s| s.median()),
            );
            ma.partial_cmp(&mb).unwrap_or(std::cmp::Ordering::Equal)
        })?;
        let noise = self.settings.plan.noise;
        // On an axis a tie further below the best is more likely slower than not, and such choices
        // compound over the axes; in the run's choice a tie is a tie either way.
        let near = |ratio: f64| ties == Ties::Final || ratio >= -noise / 2.0;
        let tied = measured.iter().filter(|r| {
            std::ptr::eq(**r, *top)
                || r.compare_with(top, w, noise, self.settings.plan.seed)
                    .is_some_and(|c| c.verdict == Verdict::Tie && near(c.ratio))
        });
        let winner = match ties {
            Ties::LessMemory => tied.copied().min_by(|a, b| tie_break(a, b)),
            Ties::Lossless | Ties::Final => {
                let rate = |r: &CandidateResult| r.rate_sample(w).map(|s| s.median());
                let tied: Vec<&CandidateResult> = tied.copied().collect();
                tie_winner(&tied, self.settings.offload, &rate, noise)
            }
        };
        winner.map(|r| r.candidate.clone())
    }

    /// Which of `axes` would vary `from` (what a run cut short by its budget left unmeasured).
    pub(super) fn axes_with_candidates(&self, axes: &[Axis], from: &Candidate) -> Vec<String> {
        axes.iter()
            .filter(|axis| {
                (axis.vary)(&self.settings, from)
                    .iter()
                    .any(|c| c != from && c.validate().is_ok())
            })
            .map(|axis| axis.name.to_string())
            .collect()
    }

    /// Relative margin of `best` over the next-best measured candidate.
    pub fn margin_over_runner_up(&self, best: &Candidate) -> Option<f64> {
        let b = self.median_rate(best)?;
        let next = self
            .results
            .iter()
            .filter(|r| &r.candidate != best)
            .filter_map(|r| self.ok_median(r))
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))?;
        Some(b / next - 1.0)
    }

    /// The median rate at the workload of `c`'s measurement, when it ran.
    pub(super) fn median_rate(&self, c: &Candidate) -> Option<f64> {
        self.ok_median(self.results.iter().find(|r| &r.candidate == c)?)
    }

    /// The median rate at the workload of a measurement that ran.
    fn ok_median(&self, r: &CandidateResult) -> Option<f64> {
        r.ok().then(|| {
            r.rate_sample(&self.settings.plan.workload)
                .map(|s| s.median())
        })?
    }

    pub fn shutdown(&mut self) {
        self.measurer.get_mut().shutdown();
    }
}

impl Engine<'_> {
    /// The whole run: the search (or the grid with `exhaustive`), the confirmation rounds of the
    /// winner and the runner-up (within the budget), the final choice, and the workers ended.
    pub fn tune(mut self, exhaustive: bool) -> Run {
        let mut winner = if exhaustive {
            self.run_exhaustive()
        } else {
            self.run()
        };
        let (baseline, baseline_placement) = self.baseline_and_placement();
        let done = self.conclude(winner.clone());
        winner = done.winner;
        self.shutdown();
        Run {
            settings: self.settings.clone(),
            results: std::mem::take(&mut self.results),
            winner,
            baseline,
            baseline_placement,
            confirm_drift: (done.drift.into_iter())
                .map(|(c, d)| (c.label(), d))
                .collect(),
            confirmed: done.confirmed,
            interrupted: self.interrupted,
            budget_spent: self.budget_spent,
            not_reached: std::mem::take(&mut self.not_reached),
            quality: self.quality_record(),
            visit_seconds: self.visit_seconds,
            backends: std::mem::take(&mut self.backend_trials),
            time_plan: self.time_plan.take(),
            skipped_axes: std::mem::take(&mut self.skipped_axes),
            twin: done.twin,
        }
    }

    /// After the search: its finalists confirmed on the workload's request ([`confirm`]), and the
    /// run's choice made among them on the confirmation's rounds; where those measured too little
    /// (the budget ran out, the run was stopped), among what the search measured.
    pub(crate) fn conclude(&mut self, searched: Option<Candidate>) -> Concluded {
        let mut done = Concluded {
            winner: searched.clone(),
            confirmed: Vec::new(),
            drift: Vec::new(),
            twin: None,
        };
        let Some(w) = searched.filter(|_| !self.interrupted) else {
            self.show_screened();
            return done;
        };
        let base = self.baseline();
        let measured = self.choosable();
        // `--quick` confirms only a winner that changes the output, beside its lossless twin: its
        // groups compared their candidates in shared rounds already, and a confirming round costs
        // each finalist a load (on the 7B, 8.5-s loads of repacked weights: 24 of its 50 s).
        if self.settings.plan.quick && search_space::knob::lossless_twin(&w) == w {
            self.show_screened();
            done.winner = self.choose_final(&measured).or(Some(w));
            return done;
        }
        let finalists = self.finalists(&w, &measured, &base);
        done.drift = self.confirm(&finalists);
        let allowed = self.allowed(&finalists);
        // The choice on the confirmation's rounds where it measured the search's winner and every
        // finalist it compares with (a finalist it did not reach would lose to the winner unseen).
        let judged = |r: &CandidateResult| r.ok() || r.did_not_fit() || r.failure.is_some();
        let confirmed =
            (allowed.iter()).all(|c| (self.results.iter()).any(|r| &r.candidate == c && judged(r)));
        done.winner = match confirmed.then(|| self.choose_final(&allowed)).flatten() {
            Some(b) => {
                done.twin = self.twin_verdict(&finalists, &b);
                Some(b)
            }
            None => {
                self.decide_at(self.search_fidelity(&w));
                self.choose_final(&measured).or(Some(w))
            }
        };
        done.confirmed = finalists;
        self.show_screened();
        done
    }

    /// The results as the report shows them ([`CandidateResult::show_screened`]).
    fn show_screened(&mut self) {
        for r in &mut self.results {
            r.show_screened();
        }
    }

    /// The candidates the run may choose among at the request size decided at, best first: those
    /// measured and not refused by the quality gate, with a cache the user allowed.
    fn choosable(&self) -> Vec<Candidate> {
        let s = &self.settings;
        let measured: Vec<Candidate> =
            ranking::leaderboard(&self.results, &s.plan.workload, s.plan.noise, s.plan.seed)
                .into_iter()
                .filter(|e| e.figures.is_some() && !self.refused(&e.candidate))
                .map(|e| e.candidate)
                .collect();
        self.allowed(&measured)
    }

    /// `cs` with a cache the user allowed: llama.cpp's defaults, the baseline or a lossless twin
    /// keep an f16 cache that `--cache-types q8_0` rules out, and are not chosen.
    fn allowed(&self, cs: &[Candidate]) -> Vec<Candidate> {
        (cs.iter())
            .filter(|c| self.settings.kv_pairs.contains(&(c.type_k, c.type_v)))
            .cloned()
            .collect()
    }

    /// The request size the search measured `c` at last (its figures where the confirmation has
    /// none).
    fn search_fidelity(&self, c: &Candidate) -> Option<Screen> {
        let r = self.results.iter().find(|r| &r.candidate == c)?;
        (r.set_aside.iter())
            .filter(|s| s.reps.len() >= 2)
            .map(|s| s.screen)
            .next_back()
            .flatten()
    }
}
