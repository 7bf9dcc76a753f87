//! One candidate's outcome in a run (its repetitions, memory, failure) and the objective the
//! decisions compare: the modelled seconds of one request of the workload.

use crate::measuring::TrialFailure;
use crate::measuring::{LoadReport, Repetition, Screen, Workload};
use crate::stats::{self, RoundRate, Sample};
use search_space::Candidate;
use serde::{Deserialize, Serialize};

/// [`CandidateResult::skipped`] of a candidate the time budget left unmeasured.
pub const BUDGET_SPENT: &str = "not measured: time budget spent";

/// One candidate's outcome in the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CandidateResult {
    pub candidate: Candidate,
    /// Memory per device predicted by a dry-run load (llama.cpp's no_alloc), before any real load.
    #[serde(default)]
    pub predicted: Option<LoadReport>,
    pub reps: Vec<Repetition>,
    /// The interleaved round each repetition was measured in (parallel to `reps`; `None` for one
    /// reused from an earlier run), so the decision rule can pair repetitions of the same round.
    #[serde(skip)]
    pub rounds: Vec<Option<u64>>,
    pub load: Option<LoadReport>,
    pub failure: Option<TrialFailure>,
    /// Why it was not measured (budget spent, placement skipped after crashes).
    pub skipped: Option<String>,
    /// Pruned as predicted over a device's memory budget (its reason in `skipped`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub over_budget: bool,
    /// A crash after it had measured: it was measured on, on a fresh worker; a second crash ends it
    /// ([`CandidateResult::failure`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crashed_once: Option<TrialFailure>,
    /// Why it took no more repetitions though it had measured (its placement crashed twice since,
    /// in other candidates): its figures stand on the repetitions it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
    pub seconds: f64,
    /// The request `reps` timed where it was a screen, shorter than the workload's
    /// ([`super::fidelity`]); `None`: the workload's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<Screen>,
    /// Its repetitions at the request sizes the engine does not decide at now.
    #[serde(skip)]
    pub(crate) set_aside: Vec<SetAside>,
}

impl CandidateResult {
    pub(crate) fn new(candidate: Candidate) -> Self {
        CandidateResult {
            candidate,
            predicted: None,
            reps: Vec::new(),
            rounds: Vec::new(),
            load: None,
            failure: None,
            skipped: None,
            over_budget: false,
            crashed_once: None,
            halted: None,
            seconds: 0.0,
            screen: None,
            set_aside: Vec::new(),
        }
    }

    pub fn ok(&self) -> bool {
        self.failure.is_none() && self.skipped.is_none() && self.reps.len() >= 2
    }

    /// It did not fit: pruned as over a device's budget, or its load ran out of memory.
    pub fn did_not_fit(&self) -> bool {
        self.over_budget
            || self
                .failure
                .as_ref()
                .is_some_and(TrialFailure::out_of_memory)
    }

    /// What a first visit (the load, then two repetitions) took, told from the figures of
    /// repetitions reused from an earlier run (which cost nothing now): the load's seconds and
    /// each repetition's phases at its rates. The warm-up is not counted: a little short.
    pub(crate) fn visit_seconds_from_figures(&self, w: &Workload) -> f64 {
        let load = self.load.as_ref().map_or(0.0, |l| l.load_seconds);
        load + (self.reps.iter().take(2))
            .map(|r| rep_seconds(r, w))
            .sum::<f64>()
    }

    /// Seconds per request of the workload, per repetition (the objective, lower is better).
    pub fn scores(&self, w: &Workload) -> Vec<f64> {
        self.reps.iter().map(|r| score_seconds(r, w)).collect()
    }

    /// Requests per second per repetition (higher is better), for the statistics.
    pub fn rate_sample(&self, w: &Workload) -> Option<Sample> {
        Sample::new(self.scores(w).iter().map(|s| 1.0 / s).collect()).ok()
    }

    /// Requests per second per repetition, each with its round, for [`stats::decide`].
    pub fn round_rates(&self, w: &Workload) -> Vec<RoundRate> {
        self.reps
            .iter()
            .enumerate()
            .map(|(k, r)| RoundRate {
                round: self.rounds.get(k).copied().flatten(),
                rate: 1.0 / score_seconds(r, w),
            })
            .collect()
    }

    /// The decision rule between two candidates' request rates (paired over shared rounds).
    pub fn compare_with(
        &self,
        other: &CandidateResult,
        w: &Workload,
        noise: f64,
        seed: u64,
    ) -> Option<stats::Comparison> {
        stats::decide(&self.round_rates(w), &other.round_rates(w), noise, seed)
    }

    /// A copy with only the repetitions that timed both phases (none of their figures borrowed),
    /// each with its round; where fewer than two did, all of them.
    pub(crate) fn timed_whole(&self) -> CandidateResult {
        let keep: Vec<bool> = self.reps.iter().map(|r| r.timed.is_both()).collect();
        let mut out = self.clone();
        if keep.iter().filter(|k| **k).count() >= 2 {
            let mut k = keep.iter();
            out.reps.retain(|_| *k.next().unwrap_or(&true));
            let mut k = keep.iter();
            out.rounds.retain(|_| *k.next().unwrap_or(&true));
        }
        out
    }

    /// Bytes the load holds ([`LoadReport::held_bytes`]: llama.cpp's figures, its mapped buffers as
    /// the pages inference read), else the dry run's prediction (0 when neither is known).
    pub fn mem_bytes(&self) -> u64 {
        self.load
            .as_ref()
            .or(self.predicted.as_ref())
            .map(|l| l.held_bytes())
            .unwrap_or(0)
    }
}

/// Repetitions of a candidate at a request size other than the one the engine decides at now.
#[derive(Debug, Clone, Default)]
pub(crate) struct SetAside {
    pub screen: Option<Screen>,
    pub reps: Vec<Repetition>,
    pub rounds: Vec<Option<u64>>,
}

impl CandidateResult {
    /// Its figures become those at `screen` (`None`: the workload's own request); the ones it had
    /// are set aside.
    pub(crate) fn decide_at(&mut self, screen: Option<Screen>) {
        if self.screen == screen {
            return;
        }
        let now = SetAside {
            screen: self.screen,
            reps: std::mem::take(&mut self.reps),
            rounds: std::mem::take(&mut self.rounds),
        };
        if !now.reps.is_empty() {
            self.set_aside.push(now);
        }
        if let Some(k) = self.set_aside.iter().position(|s| s.screen == screen) {
            let back = self.set_aside.remove(k);
            (self.reps, self.rounds) = (back.reps, back.rounds);
        }
        self.screen = screen;
    }

    /// Whether it has the two repetitions a judgement needs at some request size.
    pub(crate) fn measured_at_any_size(&self) -> bool {
        self.reps.len() >= 2 || self.set_aside.iter().any(|s| s.reps.len() >= 2)
    }

    /// Repetitions reused from an earlier run, each where its request size puts it.
    pub(crate) fn reuse(&mut self, reps: Vec<Repetition>) {
        for rep in reps {
            if rep.screen == self.screen {
                self.reps.push(rep);
                self.rounds.push(None);
                continue;
            }
            match self.set_aside.iter_mut().find(|s| s.screen == rep.screen) {
                Some(s) => {
                    s.reps.push(rep);
                    s.rounds.push(None);
                }
                None => self.set_aside.push(SetAside {
                    screen: rep.screen,
                    reps: vec![rep],
                    rounds: vec![None],
                }),
            }
        }
    }

    /// For the report: where it has too few repetitions at the request size decided at last (the
    /// confirmation's: it was screened, not confirmed), its figures at the screen it has the most
    /// repetitions of.
    pub(crate) fn show_screened(&mut self) {
        if self.reps.len() >= 2 {
            return;
        }
        let most = (self.set_aside.iter())
            .filter(|s| s.reps.len() >= 2)
            .max_by_key(|s| (s.reps.len(), s.screen.map(|x| x.n_prompt)))
            .map(|s| s.screen);
        if let Some(screen) = most {
            self.decide_at(screen);
        }
    }
}

/// The objective: expected seconds for one request of the workload,
/// `n_prompt / pp + n_gen / tg`, with pp and tg measured at depth when a depth is set (a request in
/// a long chat processes its prompt after what the cache holds, then generates).
pub fn score_seconds(r: &Repetition, w: &Workload) -> f64 {
    let (pp, tg) = if w.depth > 0 {
        (
            r.pp_depth_tps.unwrap_or(r.pp_tps),
            r.tg_depth_tps.unwrap_or(r.tg_tps),
        )
    } else {
        (r.pp_tps, r.tg_tps)
    };
    w.n_prompt as f64 / pp.max(1e-9) + w.n_gen as f64 / tg.max(1e-9)
}

/// What a repetition's phases took, at its rates: the request at no depth, and with a depth the
/// cache filled to it (at the shallow prompt rate) and the request again there; every sequence's
/// (the rates are all sequences' together).
pub(crate) fn rep_seconds(r: &Repetition, w: &Workload) -> f64 {
    let shallow = Workload {
        depth: 0,
        ..w.clone()
    };
    let mut s = score_seconds(r, &shallow);
    if w.depth > 0 && r.tg_depth_tps.is_some() {
        s += f64::from(w.depth) / r.pp_tps.max(1e-9) + score_seconds(r, w);
    }
    s * f64::from(w.n_parallel.max(1))
}

/// The candidate a tie goes to: the lossless setting. A candidate whose K/V cache drifts from the
/// f16 cache's is kept among the tied only where it holds more of the model on the offload devices
/// (`offload`) than every less lossy one tied with it: there the memory it saves buys something
/// measured (a layer more on a device). Among those left (equal loss, or such a gain), less memory
/// decides ([`tie_break`]), and on the host alone the configuration closer to llama.cpp's defaults
/// first, among those whose median `rate` is within half the `noise` threshold of the best kept
/// (`None`: unknown, kept). A user who did not ask for less memory does not get a lossy cache for
/// nothing; nor a configuration measured slower beside a tied one for being simpler (a micro-batch
/// of 512, llama.cpp's, over 256 measured 3% faster in the same rounds cost a 7B request 2.4%).
pub(super) fn tie_winner<'r>(
    tied: &[&'r CandidateResult],
    offload: bool,
    rate: &dyn Fn(&CandidateResult) -> Option<f64>,
    noise: f64,
) -> Option<&'r CandidateResult> {
    let buys_placement = |r: &CandidateResult| {
        let (loss, held) = (kv_loss(&r.candidate), on_devices(&r.candidate));
        offload
            && (tied.iter())
                .filter(|s| kv_loss(&s.candidate) < loss)
                .all(|s| held > on_devices(&s.candidate))
    };
    let least = (tied.iter())
        .map(|r| kv_loss(&r.candidate))
        .fold(f64::INFINITY, f64::min);
    let kept: Vec<&CandidateResult> = (tied.iter().copied())
        .filter(|r| kv_loss(&r.candidate) <= least || buys_placement(r))
        .collect();
    let best = kept.iter().filter_map(|r| rate(r)).fold(f64::NAN, f64::max);
    let kept = (kept.into_iter())
        .filter(|r| rate(r).is_none_or(|x| best.is_nan() || x >= best * (1.0 - noise / 2.0)));
    match offload {
        true => kept.min_by(|a, b| tie_break(a, b)),
        // On the host alone memory buys nothing: the configuration closer to llama.cpp's defaults
        // (a tie between flash attention on and off went to off for its smaller buffers, and the
        // confirmation measured it 8% slower on a 7B).
        false => kept.min_by(|a, b| {
            (a.candidate.complexity().cmp(&b.candidate.complexity())).then(tie_break(a, b))
        }),
    }
}

/// How far a candidate's KV cache is from lossless: 0 for unquantized K and V, else more the
/// fewer bits its pair keeps (candidates of one pair are of equal loss).
fn kv_loss(c: &Candidate) -> f64 {
    if c.kv_lossy() {
        2.0 - c.kv_bytes_factor()
    } else {
        0.0
    }
}

/// What a candidate holds on the offload devices, in the order it matters: its layers, then the
/// fewer layers whose FFNs or experts stay in host memory, then its KV cache there.
fn on_devices(c: &Candidate) -> (u32, std::cmp::Reverse<u32>, bool) {
    (
        c.n_gpu_layers,
        std::cmp::Reverse(c.n_cpu_moe + c.n_cpu_ffn),
        c.kv_offload.is_on(),
    )
}

/// Among tied candidates: less memory first, then fewer changed knobs, then the label (stable). On
/// an axis, over every tied candidate; in the run's choice, among those [`tie_winner`] keeps.
pub(super) fn tie_break(a: &CandidateResult, b: &CandidateResult) -> std::cmp::Ordering {
    a.mem_bytes()
        .cmp(&b.mem_bytes())
        .then(
            a.candidate
                .kv_bytes_factor()
                .total_cmp(&b.candidate.kv_bytes_factor()),
        )
        .then(a.candidate.complexity().cmp(&b.candidate.complexity()))
        .then(a.candidate.cmp(&b.candidate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use search_space::CacheType;

    /// A tied candidate with `ngl` layers offloaded, a K/V pair of `kv` and `mib` MiB held.
    fn tied(ngl: u32, kv: CacheType, mib: u64) -> CandidateResult {
        let mut r = CandidateResult::new(Candidate {
            type_k: kv,
            type_v: kv,
            ..Candidate::llama_default(4, ngl)
        });
        r.predicted = Some(LoadReport {
            load_seconds: 0.0,
            buffers: Vec::new(),
            rss_bytes: 0,
            reported_bytes: mib << 20,
            per_device: Vec::new(),
            actual: Vec::new(),
            mapped_in_use: None,
        });
        r
    }

    fn winner(rs: &[CandidateResult], offload: bool) -> (u32, CacheType) {
        let refs: Vec<&CandidateResult> = rs.iter().collect();
        let w = tie_winner(&refs, offload, &|_| None, 0.02).expect("a winner");
        (w.candidate.n_gpu_layers, w.candidate.type_k)
    }

    #[test]
    fn a_tie_goes_to_the_lossless_cache_whatever_memory_it_saves() {
        use CacheType::*;
        // Same placement: the f16 cache wins though q8_0 holds less (on the CPU and beside a GPU).
        let same = [tied(0, Q8_0, 300), tied(0, F16, 340)];
        assert_eq!(winner(&same, false), (0, F16));
        assert_eq!(winner(&same, true), (0, F16));
        // Of equal loss, less memory decides.
        let equal = [tied(0, F16, 340), tied(0, F16, 320)];
        let refs: Vec<&CandidateResult> = equal.iter().collect();
        assert_eq!(
            tie_winner(&refs, false, &|_| None, 0.02)
                .unwrap()
                .mem_bytes(),
            320 << 20
        );
        // Less lossy first among lossy pairs too.
        assert_eq!(
            winner(&[tied(0, Q4_0, 250), tied(0, Q8_0, 300)], false),
            (0, Q8_0)
        );
    }

    #[test]
    fn on_the_host_a_tie_goes_to_the_defaults_only_within_half_the_threshold_of_the_best() {
        use CacheType::*;
        let simpler = tied(0, F16, 340);
        let mut smaller_batch = tied(0, F16, 330);
        smaller_batch.candidate.n_ubatch = 256;
        assert!(smaller_batch.candidate.complexity() > simpler.candidate.complexity());
        let refs = [&simpler, &smaller_batch];
        let ub = |r: &CandidateResult| r.candidate.n_ubatch;
        // Seconds a request: 37.6 for llama.cpp's micro-batch, 36.5 for 256 (3% apart).
        let apart = |r: &CandidateResult| Some(1.0 / if ub(r) == 256 { 36.5 } else { 37.6 });
        assert_eq!(ub(tie_winner(&refs, false, &apart, 0.02).unwrap()), 256);
        // 0.5% apart: within half the 2% threshold, the defaults'.
        let close = |r: &CandidateResult| Some(1.0 / if ub(r) == 256 { 37.4 } else { 37.6 });
        assert_eq!(ub(tie_winner(&refs, false, &close, 0.02).unwrap()), 512);
        // A faster lossy cache is still no winner of a tie, however far ahead its median.
        let mut lossy = tied(0, Q8_0, 300);
        lossy.candidate.n_ubatch = 128;
        let three = [&simpler, &smaller_batch, &lossy];
        let fast_lossy = |r: &CandidateResult| Some(1.0 / if ub(r) == 128 { 30.0 } else { 37.6 });
        assert_eq!(
            ub(tie_winner(&three, false, &fast_lossy, 0.02).unwrap()),
            512
        );
    }

    #[test]
    fn a_lossy_cache_that_buys_a_layer_on_a_device_wins_a_tie_by_memory() {
        use CacheType::*;
        // q8_0 lets a 16th layer onto the GPU: what it saves buys something measured.
        let lever = [tied(15, F16, 340), tied(16, Q8_0, 300)];
        assert_eq!(winner(&lever, true), (16, Q8_0));
        // Without an offload device, layer counts mean nothing: lossless.
        assert_eq!(winner(&lever, false), (15, F16));
        // q4_0 buys nothing over q8_0 at the same 16 layers: q8_0, the less lossy of the two.
        let three = [tied(15, F16, 340), tied(16, Q8_0, 300), tied(16, Q4_0, 280)];
        assert_eq!(winner(&three, true), (16, Q8_0));
    }
}
