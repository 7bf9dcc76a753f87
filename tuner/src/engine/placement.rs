//! Fit before you run: every candidate's memory per device comes from a dry-run load in a worker
//! (llama.cpp's `no_alloc`: the model and context are planned, buffer sizes logged, nothing
//! allocated), and a candidate that would exceed a device's budget is pruned, never loaded. The
//! GPU-layer axis starts from the most layers that fit and walks down, so the offload cliff shows.

use crate::engine::group::Group;
use crate::engine::strategy::{Once, Strategy};
use crate::engine::view::View;
use crate::engine::{vary_cache, Engine, TuneSettings};
use crate::measuring::{LoadReport, TrialFailure};
use search_space::size::format_size_pair;
use search_space::{Candidate, KvOffload};

/// The largest `x` in `lo..hi` for which `holds(x)`, bisected, where it holds at `lo` and not at
/// `hi` (and so, memory being monotone, nowhere above the answer).
pub(crate) fn last_that_holds(mut lo: u32, mut hi: u32, mut holds: impl FnMut(u32) -> bool) -> u32 {
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if holds(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Why a candidate is pruned before it is loaded.
#[derive(Debug, Clone)]
pub struct Unfit {
    /// "pruned: needs 9.1 GiB on CUDA0, budget 8.0 GiB", or llama.cpp's dry run's refusal.
    pub why: String,
    /// Predicted over a device's memory budget (not a dry run that failed).
    pub over_budget: bool,
}

impl Unfit {
    fn over_budget(why: String) -> Self {
        Unfit {
            why,
            over_budget: true,
        }
    }
}

/// Where a configuration fits the host's budget only by paging its mapped weights
/// ([`pageable`]), the host bytes of its dry run `report` and that budget.
pub fn pages(s: &TuneSettings, report: &LoadReport) -> Option<(u64, u64)> {
    let need = report.per_device.iter().find(|d| d.device == "CPU")?.bytes;
    let budget = s.mem_budgets.of("CPU")?;
    (need > budget && pageable(s, report) > 0).then_some((need, budget))
}

/// Host bytes of `report` the kernel can page (the model file's mapped weights) where the host
/// alone computes and its budget is the RAM (not a `--mem-budget CPU=` given, which counts every
/// byte): llama.cpp runs a model larger than the RAM from its mapping, each token reading what was
/// dropped from disk again, so only the rest must fit (and the run says the model pages:
/// [`pages`]). Beside a device, placements that keep the weights in RAM exist, and one that would
/// page is pruned.
pub fn pageable(s: &TuneSettings, report: &LoadReport) -> u64 {
    let given = s.mem_budgets.entry("CPU").is_some_and(|b| b.given);
    if s.offload || given {
        0
    } else {
        report.mapped_bytes()
    }
}

/// The most GPU layers [`Engine::trade_layers_for_batch`] gives up for a larger micro-batch.
const BATCH_FOR_LAYERS: u32 = 2;

impl Engine<'_> {
    /// Dry-run footprint of a candidate (cached); `Err` with the reason when llama.cpp refuses.
    pub fn footprint(&self, c: &Candidate) -> Result<LoadReport, String> {
        let mut req = self.request(c);
        req.settings.no_alloc = true;
        // Thread counts do not change what a load allocates: one dry run serves them all.
        let mut context = req.context.clone();
        context.threads = 0;
        context.threads_batch = None;
        let key = serde_json::to_string(&(&req.settings, &context)).expect("serialises");
        if let Some(r) = self.footprints.borrow().get(&key) {
            return r.clone();
        }
        let stop = self.stop_fn();
        let result = self.measurer.borrow_mut().footprint(&req, stop);
        self.footprints.borrow_mut().insert(key, result.clone());
        result
    }

    /// Whether a candidate fits every device's budget, the host's (`CPU`: RAM) included; the dry-run
    /// report when it does, the reason (device, need, budget) when not.
    pub fn check_fit(&self, c: &Candidate) -> Result<LoadReport, Unfit> {
        self.check_fit_of(c, true)
    }

    /// [`Self::check_fit`] for the devices that take layers only. What they must hold only grows
    /// with the layers (and expert layers) placed on them, while the host's shrinks: the searches
    /// for the most layers that fit bisect on this, and the host's budget prunes the candidates they
    /// lead to (too few layers offloaded for the rest to fit in RAM).
    pub(crate) fn check_device_fit(&self, c: &Candidate) -> Result<LoadReport, Unfit> {
        self.check_fit_of(c, false)
    }

    fn check_fit_of(&self, c: &Candidate, host: bool) -> Result<LoadReport, Unfit> {
        if self.settings.mem_budgets.is_empty() {
            return Ok(LoadReport::default());
        }
        let report = self.footprint(c).map_err(|e| Unfit {
            why: format!("pruned: {e}"),
            over_budget: false,
        })?;
        if c.split_mode == search_space::SplitMode::Tensor {
            self.tensor_parallel_fits(&report)?;
        }
        for d in report
            .per_device
            .iter()
            .filter(|d| host || d.device != "CPU")
        {
            if let Some(budget) = self.settings.mem_budgets.of(&d.device) {
                let pageable = if d.device == "CPU" {
                    self.pageable(&report)
                } else {
                    0
                };
                if d.bytes.saturating_sub(pageable) > budget {
                    let ram = if d.device == "CPU" { " (host RAM)" } else { "" };
                    let (need, budget) = format_size_pair(d.bytes - pageable, budget);
                    return Err(Unfit::over_budget(format!(
                        "pruned: needs {need} on {}{ram}, budget {budget}",
                        d.device,
                    )));
                }
            }
        }
        if host {
            self.host_memory_fits(&report)?;
        }
        Ok(report)
    }

    /// Host bytes of `report` the kernel can page ([`pageable`]).
    pub(crate) fn pageable(&self, report: &LoadReport) -> u64 {
        pageable(&self.settings, report)
    }

    /// What the host and the devices that share its memory (an integrated GPU, llvmpipe) hold
    /// together, held to the host's budget: one memory, one budget. Each was held to its own
    /// budget above, each of which is that same RAM.
    fn host_memory_fits(&self, report: &LoadReport) -> Result<(), Unfit> {
        let shared = &self.settings.host_memory_devices;
        let Some(budget) = self.settings.mem_budgets.of("CPU") else {
            return Ok(());
        };
        if shared.is_empty() {
            return Ok(());
        }
        let on =
            |d: &&crate::measuring::DeviceBytes| d.device == "CPU" || shared.contains(&d.device);
        let held: u64 = report.per_device.iter().filter(on).map(|d| d.bytes).sum();
        let held = held.saturating_sub(self.pageable(report));
        if held <= budget {
            return Ok(());
        }
        let mut names: Vec<&str> = (report.per_device.iter().filter(on))
            .filter(|d| d.bytes > 0)
            .map(|d| d.device.as_str())
            .collect();
        names.sort_by_key(|n| *n != "CPU");
        let (need, budget) = format_size_pair(held, budget);
        Err(Unfit::over_budget(format!(
            "pruned: needs {need} on {} together, one memory (the host's RAM), budget {budget}",
            names.join(" and ")
        )))
    }

    /// Tensor parallelism's dry run reports its devices' buffers as one ("Meta(...)"), not per
    /// device: what the offload devices hold is held to what their budgets allow together.
    fn tensor_parallel_fits(&self, report: &LoadReport) -> Result<(), Unfit> {
        let held: u64 = (report.per_device.iter())
            .filter(|d| d.device != "CPU")
            .map(|d| d.bytes)
            .sum();
        let allowed: u64 = self.settings.mem_budgets.offload().map(|b| b.bytes).sum();
        if held > allowed {
            let (need, budget) = format_size_pair(held, allowed);
            return Err(Unfit::over_budget(format!(
                "pruned: needs {need} on the devices together (-sm tensor), their budgets {budget}"
            )));
        }
        Ok(())
    }

    /// The most layers that fit the budgets with `c`'s other settings (binary search over dry runs);
    /// `None` when not even zero layers fit.
    pub fn max_fitting_layers(&self, c: &Candidate) -> Option<u32> {
        self.max_fitting_layers_from(c, 0)
    }

    /// [`Self::max_fitting_layers`] when `known` layers are already known to fit (a lever that only
    /// shrinks memory fits at least what the unchanged settings fit).
    fn max_fitting_layers_from(&self, c: &Candidate, known: u32) -> Option<u32> {
        let all = self.settings.n_layers + 1;
        let fits = |n: u32| {
            self.check_device_fit(&Candidate {
                n_gpu_layers: n,
                ..c.clone()
            })
            .is_ok()
        };
        if fits(all) {
            return Some(all);
        }
        if known == 0 && !fits(0) {
            return None;
        }
        // known.min(all - 1) fits, all does not.
        Some(last_that_holds(known.min(all - 1), all, fits))
    }

    /// GPU-layer counts to measure first: the most that fit, one fewer, and none (CPU only); with
    /// `--quick` the most that fit, half and none. Then the fit levers' placements. The counts in
    /// between come after, and only while the curve has not fallen ([`BelowTheTop`]).
    pub fn placement_group(&self, from: &Candidate) -> Vec<Candidate> {
        let Some(max) = self.max_fitting_layers(from) else {
            return Vec::new();
        };
        let mut ns = if self.settings.plan.quick {
            vec![max, max / 2, 0]
        } else {
            vec![max, max.saturating_sub(1), 0]
        };
        ns.sort_unstable_by(|a, b| b.cmp(a));
        ns.dedup();
        let mut group: Vec<Candidate> = ns
            .into_iter()
            .map(|n| Candidate {
                n_gpu_layers: n,
                ..from.clone()
            })
            .collect();
        if max <= self.settings.n_layers {
            group.extend(self.lever_placements(from, max));
        }
        group
    }

    /// Whether `a` was measured slower than `b` by more than the noise (the decision rule's verdict),
    /// or `a` stopped mid-repetition as several times slower than the best measured (the walk's `b`
    /// is that best or ties with it).
    pub(super) fn slower(&self, a: &Candidate, b: &Candidate) -> bool {
        let find = |c: &Candidate| self.results.iter().find(|r| &r.candidate == c);
        let (Some(ra), Some(rb)) = (find(a), find(b)) else {
            return false;
        };
        if matches!(ra.failure, Some(TrialFailure::GaveUp { .. })) {
            return true;
        }
        if !ra.ok() || !rb.ok() {
            return false;
        }
        let w = &self.settings.plan.workload;
        ra.compare_with(rb, w, self.settings.plan.noise, self.settings.plan.seed)
            .is_some_and(|c| c.verdict == crate::stats::Verdict::Slower)
    }

    /// When not every layer fits: the settings that shrink what the device must hold — the smallest
    /// micro-batch given (the compute buffer; on a large vocabulary the output logits of one
    /// micro-batch alone are hundreds of MiB), a quantized KV cache, and both — each at the most
    /// layers it lets fit, when that is more than `from`'s `max` and than any lever before it reaches
    /// at a micro-batch at least as large. Measured beside the f16 placements, so the run shows what
    /// each lever bought and what it cost. A lever that reaches an earlier one's layers at a larger
    /// micro-batch is listed: on `bench/vs-tuners`' landscape 55, q4_0 at 512 held every layer as
    /// q8_0 at 128 did, and was 7% faster (the KV-cache axis, one layer lower where the two caches
    /// tie, had kept q8_0). What it moved on `bench/vs-tuners`: docs/benchmarks.md, "The figures
    /// behind the search's choices".
    fn lever_placements(&self, from: &Candidate, max: u32) -> Vec<Candidate> {
        let levers = self.levers(from);
        let all = self.settings.n_layers + 1;
        let mut out: Vec<Candidate> = Vec::new();
        // The most layers a listed lever reaches with micro-batches of at least `ub`: a lever is
        // listed where it reaches more (a smaller micro-batch costs prompt speed, so one that reaches
        // the same layers at `from`'s micro-batch is listed too).
        let most_at = |out: &[Candidate], ub: u32| {
            (out.iter().filter(|c| c.n_ubatch >= ub))
                .map(|c| c.n_gpu_layers)
                .fold(max, u32::max)
        };
        for lever in levers.into_iter().filter(|c| c.validate().is_ok()) {
            if most_at(&out, from.n_ubatch) == all {
                break;
            }
            let best = most_at(&out, lever.n_ubatch);
            if let Some(n) = self
                .max_fitting_layers_from(&lever, max)
                .filter(|&n| n > best)
            {
                out.push(Candidate {
                    n_gpu_layers: n,
                    ..lever
                });
            }
        }
        out
    }

    /// The fit levers' settings around `from`, in the order [`Self::lever_placements`] tries them.
    fn levers(&self, from: &Candidate) -> Vec<Candidate> {
        let small_ub = self
            .settings
            .ubatch_options
            .iter()
            .copied()
            .filter(|&u| u < from.n_ubatch)
            .min();
        // Every quantized type given, not just the first: q8_0 may free less than one layer's
        // bytes where q4_0 frees two (a 70B on two 16 GiB GPUs: 64 layers at f16 and q8_0, 66 at
        // q4_0, 7% faster generation), and one that buys no layer is never listed.
        let quantized = vary_cache(&self.settings, from)
            .into_iter()
            .filter(|c| c.kv_lossy());
        let mut levers: Vec<Candidate> =
            small_ub.map(|u| from.with_ubatch(u)).into_iter().collect();
        for q in quantized {
            let with_small_ub = small_ub.map(|u| q.with_ubatch(u));
            levers.push(q);
            levers.extend(with_small_ub);
        }
        // Last, as it costs a round trip per layer for every token: the KV cache in host memory
        // (-nkvo), alone and with the smallest micro-batch.
        if self.settings.plan.kv_offload.contains(&KvOffload::Off) {
            let host_kv = Candidate {
                kv_offload: KvOffload::Off,
                ..from.clone()
            };
            let with_small_ub = small_ub.map(|u| host_kv.with_ubatch(u));
            levers.push(host_kv);
            levers.extend(with_small_ub);
        }
        levers
    }

    /// Dense models placed as [`Self::expert_group`] places experts, with llama.cpp's `--n-cpu-ffn`:
    /// every layer offloaded, the FFN weights (about two thirds of a layer) of the first N layers
    /// kept in host memory, so every layer's attention and KV cache run on the devices, where whole
    /// layers on the host (`-ngl`) would attend to the whole cache on the CPU. Only where not every
    /// layer fits: the fewest such layers that let the rest fit (dry runs), one and two more, and
    /// each quantized KV cache at the fewest it lets fit where that is fewer (the fit levers,
    /// jointly). Which wins against `-ngl` depends on the bus, the host, the prompt and the depth:
    /// measured beside the `-ngl` placements.
    pub fn ffn_group(&self, from: &Candidate) -> Vec<Candidate> {
        let layers = self.settings.n_layers;
        let on_device = |c: &Candidate, n: u32| Candidate {
            n_gpu_layers: layers + 1,
            n_cpu_ffn: n,
            ..c.clone()
        };
        let at = |n: u32| on_device(from, n);
        let least = match self.fewest_on_host(&at) {
            Some(n) if n > 0 => n,
            // Every layer fits (the -ngl placements hold it) or not even attention alone does.
            _ => return Vec::new(),
        };
        let mut out: Vec<Candidate> = [least, least + 1, least + 2]
            .into_iter()
            .filter(|&n| n <= layers)
            .map(at)
            .filter(|c| self.check_fit(c).is_ok())
            .collect();
        let quantized: Vec<Candidate> = (super::vary_cache(&self.settings, from).into_iter())
            .filter(|c| c.kv_lossy() && c.validate().is_ok())
            .collect();
        for kv in quantized {
            let at_kv = |n: u32| on_device(&kv, n);
            if let Some(n) = self
                .fewest_on_host_upto(&at_kv, least - 1)
                .filter(|&n| n > 0)
            {
                out.push(at_kv(n));
            }
        }
        out
    }

    /// MoE placement, like llama.cpp's `--n-cpu-moe`: every layer offloaded, with the experts of the
    /// first N layers kept in host memory — reading only the active experts there is fast, unlike a
    /// spilled dense layer. N is searched around the fit boundary one layer at a time: the fewest
    /// layers whose experts must stay on the host for the rest to fit (dry runs, binary search), the
    /// next one and two above it, and every expert on the host. Fewer experts on the host is usually
    /// faster, but a slow link or a fast host can turn that, so the neighbours are measured, not
    /// assumed. Only placements that fit are returned.
    pub fn expert_group(&self, from: &Candidate) -> Vec<Candidate> {
        let layers = self.settings.n_layers;
        let on_device = |n: u32| Candidate {
            n_gpu_layers: layers + 1,
            n_cpu_moe: n,
            ..from.clone()
        };
        let Some(least) = self.fewest_on_host(&on_device) else {
            return Vec::new();
        };
        let mut ns = vec![least, least + 1, least + 2, layers];
        ns.retain(|&n| n <= layers);
        ns.dedup();
        ns.into_iter()
            .map(on_device)
            .filter(|c| self.check_fit(c).is_ok())
            .collect()
    }

    /// The fewest layers whose experts (or dense FFNs) stay on the host with which `at(n)` fits the
    /// devices (their fit only improves as n grows; the host's is checked on the candidates);
    /// `None` when not even every layer's on the host lets the rest fit.
    fn fewest_on_host(&self, at: &dyn Fn(u32) -> Candidate) -> Option<u32> {
        self.fewest_on_host_upto(at, self.settings.n_layers)
    }

    /// [`Self::fewest_on_host`] among `0..=most`: `None` when `at(most)` does not fit.
    pub(crate) fn fewest_on_host_upto(
        &self,
        at: &dyn Fn(u32) -> Candidate,
        most: u32,
    ) -> Option<u32> {
        if self.check_device_fit(&at(0)).is_ok() {
            return Some(0);
        }
        if self.check_device_fit(&at(most)).is_err() {
            return None;
        }
        let (mut lo, mut hi) = (0, most); // lo does not fit, hi does
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if self.check_device_fit(&at(mid)).is_ok() {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        Some(hi)
    }

    /// After the other axes: when the best's settings (a smaller KV cache or micro-batch chosen
    /// later) let more of the model onto its devices than it carries, the best with the most that
    /// fits is measured against it (one layer on the host costs several percent of generation
    /// speed; so do a layer's experts).
    pub(crate) fn refit_layers(&mut self, best: Candidate) -> Candidate {
        if !self.settings.offload || self.settings.n_gpu_layers_pinned() {
            return best;
        }
        let Some(more) = self.more_on_device(&best) else {
            return best;
        };
        let group = Group::new(vec![best.clone(), more], "gpu layers");
        self.drive(Once::new(group, None)).unwrap_or(best)
    }

    /// `best` with more of the model on its devices, where its settings let that fit: a placement
    /// with the fewest layers' experts (or dense FFNs) on the host (their count was found at the
    /// first group's f16 cache and micro-batch), else the most layers.
    pub(crate) fn more_on_device(&self, best: &Candidate) -> Option<Candidate> {
        if best.n_cpu_ffn > 0 {
            let at = |n: u32| Candidate {
                n_cpu_ffn: n,
                ..best.clone()
            };
            let least = self.fewest_on_host(&at)?;
            return (least < best.n_cpu_ffn).then(|| at(least));
        }
        if best.n_cpu_moe > 0 {
            let at = |n: u32| Candidate {
                n_cpu_moe: n,
                ..best.clone()
            };
            let least = self.fewest_on_host(&at)?;
            return (least < best.n_cpu_moe).then(|| at(least));
        }
        let n = self.max_fitting_layers(best)?;
        (n > best.n_gpu_layers).then(|| Candidate {
            n_gpu_layers: n,
            ..best.clone()
        })
    }

    /// After the micro-batch axis: each larger micro-batch that did not fit beside the best's layers
    /// (the compute buffer grows with it), at the most layers it lets fit when that is at most
    /// [`BATCH_FOR_LAYERS`] fewer, measured against the best. With a long prompt and the host's
    /// weights copied to the GPU once per micro-batch, a layer given up can cost generation less
    /// than the prompt gains.
    pub(crate) fn trade_layers_for_batch(&mut self, best: Candidate) -> Candidate {
        if !self.settings.offload || self.settings.n_gpu_layers_pinned() {
            return best;
        }
        let larger: Vec<Candidate> = (self.settings.ubatch_options.iter())
            .filter(|&&ub| ub > best.n_ubatch)
            .map(|&ub| best.with_ubatch(ub))
            .collect();
        let mut group = vec![best.clone()];
        for c in larger {
            if self.check_fit(&c).is_ok() {
                continue; // measured on the micro-batch axis
            }
            match self.max_fitting_layers(&c) {
                Some(n) if n > 0 && n + BATCH_FOR_LAYERS >= best.n_gpu_layers => {
                    group.push(Candidate {
                        n_gpu_layers: n,
                        ..c
                    })
                }
                _ => {}
            }
        }
        if group.len() < 2 {
            return best;
        }
        (self.drive(Once::new(Group::new(group, "batch"), None))).unwrap_or(best)
    }
}

/// The cliff, found without walking all the way down: from the most layers that fit, ¾, ½ and ¼ of
/// them are proposed one at a time against the best so far, and the walk stops at the first that
/// is slower by more than the noise (the curve has fallen; lower counts only fall further). A
/// device slower than the host, or a flat curve, walks on.
pub(crate) struct BelowTheTop {
    start: Candidate,
    best: Option<Candidate>,
    /// The layer counts left to walk, the next first.
    steps: Vec<u32>,
    /// The count out against the best.
    lower: Option<Candidate>,
}

impl BelowTheTop {
    /// The walk down from `start`'s most layers that fit, against `best` (the first group's).
    pub fn new(view: &View, start: &Candidate, best: Option<Candidate>) -> Self {
        let max = (best.is_some() && !view.settings.plan.quick)
            .then(|| view.max_fitting_layers(start))
            .flatten();
        let mut steps: Vec<u32> = max.map_or(Vec::new(), |max| {
            [max * 3 / 4, max / 2, max / 4]
                .into_iter()
                .filter(|&n| n > 0 && n + 1 < max)
                .collect()
        });
        steps.dedup();
        BelowTheTop {
            start: start.clone(),
            best,
            steps,
            lower: None,
        }
    }
}

impl Strategy for BelowTheTop {
    type Output = Option<Candidate>;

    fn next(&mut self, view: &View, chosen: Option<Candidate>) -> Option<Group> {
        let best = self.best.clone()?;
        if let Some(lower) = self.lower.take() {
            if view.slower(&lower, &best) {
                self.steps.clear();
                return None;
            }
            self.best = Some(chosen.unwrap_or(best));
        }
        if self.steps.is_empty() || view.past_budget() {
            return None;
        }
        let lower = Candidate {
            n_gpu_layers: self.steps.remove(0),
            ..self.start.clone()
        };
        self.lower = Some(lower.clone());
        let pair = vec![self.best.clone()?, lower];
        Some(Group::new(pair, "gpu layers"))
    }

    fn finish(self, _: &View) -> Option<Candidate> {
        self.best
    }
}
