//! llama.cpp's fit (`common_fit_params`, llama-server's default `--fit`) emulated on the landscape,
//! so the engine's baseline is what llama-server would do on the simulated devices.
//!
//! The algorithm as llama.cpp's `common/fit.cpp` runs it, in the simulator's terms: each device may
//! use its target (free memory less the margin it is told to keep, autotune's budget); when every
//! layer fits at llama.cpp's split (by free memory) nothing changes; otherwise the devices are filled
//! back to front with whole layers, the last device first, each with as many as fit its target (the
//! split becomes those layer counts); for a MoE model whose dense weights fit with every expert on
//! the host, the experts come back layer by layer while they fit (here: the experts of the first N
//! layers stay on the host, `--n-cpu-moe N`), else the fill runs with every expert on the host. The
//! context and the other settings stay llama.cpp's defaults; host memory is taken as unlimited.
//! Exact searches stand in for llama.cpp's false-position steps (the same answer where memory grows
//! linearly with layers).

use super::landscape::Landscape;
use crate::measuring::{FitAnswer, FitDevice, FitRequest, TensorOverride};
use search_space::Candidate;

impl Landscape {
    /// What llama.cpp's fit answers for `req`, and how many dry runs it took.
    pub fn llama_fit(&self, req: &FitRequest) -> (FitAnswer, u32) {
        let targets: Vec<u64> = self
            .devices
            .iter()
            .map(|d| {
                (req.budgets.of(&d.name)).unwrap_or(d.mem_bytes.saturating_sub(req.default_margin))
            })
            .collect();
        let mut fit = Fitting {
            land: self,
            n_ctx: req.n_ctx,
            targets,
            dry_runs: 0,
        };
        let (n_gpu_layers, split, n_cpu_moe) = fit.place();
        let n_layers = self.model.n_layers;
        let overrides = (0..n_cpu_moe.min(n_layers))
            .map(|l| TensorOverride {
                // The pattern llama.cpp's fit writes for one layer's experts.
                pattern: format!("blk\\.{l}\\.ffn_(up|down|gate_up|gate)_(ch|)exps"),
                buffer_type: "CPU".into(),
                device: "CPU".into(),
            })
            .collect();
        let answer = FitAnswer {
            status: 0,
            n_gpu_layers,
            n_ctx: req.n_ctx,
            tensor_split: split.iter().map(|&n| n as f32).collect(),
            overrides,
            devices: self
                .devices
                .iter()
                .zip(&fit.targets)
                .map(|(d, &t)| FitDevice {
                    name: d.name.clone(),
                    free: d.mem_bytes,
                    budget: t,
                    margin: d.mem_bytes.saturating_sub(t),
                })
                .collect(),
            log_tail: String::new(),
        };
        (answer, fit.dry_runs)
    }
}

/// One run of the emulated fit.
struct Fitting<'a> {
    land: &'a Landscape,
    n_ctx: u32,
    targets: Vec<u64>,
    dry_runs: u32,
}

impl Fitting<'_> {
    /// llama.cpp's defaults with `n` layers offloaded, split `split` (empty: by free memory) and
    /// the experts of the first `moe` layers on the host.
    fn candidate(&self, n: u32, split: &[u32], moe: u32) -> Candidate {
        Candidate {
            tensor_split: if self.land.devices.len() > 1 {
                split.to_vec()
            } else {
                Vec::new()
            },
            n_cpu_moe: moe,
            ..Candidate::llama_default(self.land.host.physical_cores, n)
        }
    }

    /// Bytes per device (the landscape's order) of a candidate as the fit counts them: one dry run.
    fn bytes(&mut self, c: &Candidate) -> Vec<u64> {
        self.dry_runs += 1;
        let shares = self.land.shares(c, self.n_ctx);
        (0..self.land.devices.len())
            .map(|d| {
                let bytes: u64 = shares
                    .iter()
                    .filter(|s| s.device == Some(d))
                    .map(|s| s.bytes())
                    .sum();
                bytes.saturating_sub(self.land.fit_undercount)
            })
            .collect()
    }

    fn fits(&mut self, c: &Candidate) -> bool {
        let b = self.bytes(c);
        b.iter().zip(&self.targets).all(|(b, t)| b <= t)
    }

    /// `(n_gpu_layers, split, n_cpu_moe)` as llama.cpp's fit leaves them: -1 and an empty split
    /// when nothing had to change.
    fn place(&mut self) -> (i32, Vec<u32>, u32) {
        let m = &self.land.model;
        let (n_layers, moe) = (m.n_layers, m.moe.is_some());
        let all = n_layers + 1;
        if self.fits(&self.candidate(all, &[], 0)) {
            return (-1, Vec::new(), 0);
        }
        if moe && self.fits(&self.candidate(all, &[], n_layers)) {
            // The dense weights fit with every expert on the host: experts back, layer by layer.
            let k = (0..=n_layers)
                .find(|&k| self.fits(&self.candidate(all, &[], k)))
                .unwrap_or(n_layers);
            return (all as i32, Vec::new(), k);
        }
        let experts_away = if moe { n_layers } else { 0 };
        let split = self.fill_back_to_front(all, experts_away);
        let n: u32 = split.iter().sum();
        let split = if self.land.devices.len() > 1 {
            split
        } else {
            Vec::new()
        };
        (n as i32, split, experts_away)
    }

    /// Whole layers per device, the last device first, each as many as fit its target with the
    /// devices after it already filled.
    fn fill_back_to_front(&mut self, all: u32, moe: u32) -> Vec<u32> {
        let nd = self.land.devices.len();
        let mut split = vec![0u32; nd];
        for id in (0..nd).rev() {
            let unassigned = all - split[id + 1..].iter().sum::<u32>();
            // The devices after this one are checked too: in the simulator the output layer joins
            // the last device once every repeating layer is offloaded.
            let on = |n: u32, f: &mut Self| {
                let mut s = split.clone();
                s[id] = n;
                let c = f.candidate(s.iter().sum(), &s, moe);
                let bytes = f.bytes(&c);
                bytes[id..]
                    .iter()
                    .zip(&f.targets[id..])
                    .all(|(b, t)| b <= t)
            };
            let (mut lo, mut hi) = (0, unassigned + 1); // lo fits (or is 0), hi does not
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if on(mid, self) {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            split[id] = lo;
        }
        split
    }
}
