//! Several offload devices: how the layers are spread over them. llama.cpp splits by each device's
//! free memory, which is wrong whenever a budget, another tenant or a slower device says otherwise.
//! The search measures the split in proportion to the budgets, that split moved a step toward each
//! device, the roofline's splits (the clearly fastest device filled; with three or more devices
//! of different speeds, the fewest fastest ones that hold the model alone), each device alone, each
//! backend's devices alone (the same GPU can appear as CUDA0 and
//! Vulkan0) and `-sm row` where every device is CUDA — each at the most layers it lets fit, and not
//! at all where that is fewer than the best's on the same devices — and
//! then keeps moving the split in the direction that won while the measurements say it pays, each
//! step as long as the split has moved so far (10, 20, 40 points) and no longer than still holds
//! every layer.

use crate::engine::backends::backend_of_device as backend_of;
use crate::engine::placement::last_that_holds;
use crate::engine::strategy::{Group, Strategy};
use crate::engine::view::View;
use crate::engine::{vary_cache, Engine};
use search_space::{CacheType, Candidate, FlashAttn, SplitMode};

/// Percentage points one step of the split moves.
const STEP: u32 = 10;
/// Steps taken beyond the first group, at most.
const MAX_STEPS: usize = 4;
/// A device this much faster (memory read bandwidth) than the slowest of the run's devices gets the
/// split that fills it first; below, the devices count as alike.
const FASTER: f64 = 1.15;

/// Shares in percent (summing to 100, each at least 1) in proportion to `weights`.
pub fn shares_of(weights: &[u64]) -> Vec<u32> {
    let total: u128 = weights.iter().map(|&w| w as u128).sum::<u128>().max(1);
    let mut out: Vec<u32> = weights
        .iter()
        .map(|&w| ((w as u128 * 100 + total / 2) / total).max(1) as u32)
        .collect();
    fix_total(&mut out);
    out
}

/// `ts` with `step` points moved to device `to` from the others (in proportion to their shares);
/// `None` when nothing can move.
pub fn shifted(ts: &[u32], to: usize, step: u32) -> Option<Vec<u32>> {
    let others: u32 = ts
        .iter()
        .enumerate()
        .filter(|(k, _)| *k != to)
        .map(|(_, v)| v)
        .sum();
    let step = step.min(others);
    if step == 0 || to >= ts.len() {
        return None;
    }
    let mut out: Vec<u32> = ts
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            if k == to {
                v + step
            } else {
                v - (v as u64 * step as u64 / others as u64) as u32
            }
        })
        .collect();
    // Rounding leftovers come off the largest other device.
    let total: u32 = ts.iter().sum();
    let now: u32 = out.iter().sum();
    if now > total {
        if let Some(k) = (0..out.len()).filter(|&k| k != to).max_by_key(|&k| out[k]) {
            out[k] -= (now - total).min(out[k]);
        }
    }
    Some(out)
}

/// The index of the largest of `bandwidths` where it is [`FASTER`] than the smallest.
fn clearly_fastest(bandwidths: &[f64]) -> Option<usize> {
    let slowest = bandwidths.iter().copied().fold(f64::INFINITY, f64::min);
    let (to, fastest) =
        (bandwidths.iter().copied().enumerate()).max_by(|a, b| a.1.total_cmp(&b.1))?;
    (fastest > FASTER * slowest).then_some(to)
}

fn fix_total(v: &mut [u32]) {
    let sum: i64 = v.iter().map(|&x| x as i64).sum();
    if let Some(k) = (0..v.len()).max_by_key(|&k| v[k]) {
        v[k] = (v[k] as i64 + 100 - sum).max(1) as u32;
    }
}

impl Engine<'_> {
    /// The non-CPU devices the run may offload to, in llama.cpp's order, and their shares of the
    /// layers in proportion to their budgets.
    pub(crate) fn budget_split(&self) -> (Vec<String>, Vec<u32>) {
        let (names, bytes): (Vec<String>, Vec<u64>) = self.offload_budgets().into_iter().unzip();
        let shares = shares_of(&bytes);
        (names, shares)
    }

    /// The non-CPU devices' budgets in bytes, in llama.cpp's order.
    fn offload_budgets(&self) -> Vec<(String, u64)> {
        (self.settings.mem_budgets.offload())
            .map(|b| (b.device.clone(), b.bytes))
            .collect()
    }

    /// The other ways to spread `from`'s layers over two or more devices (empty with fewer).
    pub fn split_group(&self, from: &Candidate) -> Vec<Candidate> {
        let (names, by_budget) = self.budget_split();
        if names.len() < 2 {
            return Vec::new();
        }
        let with = |devices: Vec<String>, tensor_split: Vec<u32>, split_mode| Candidate {
            devices,
            tensor_split,
            split_mode,
            ..from.clone()
        };
        let mut shapes = vec![with(Vec::new(), by_budget.clone(), SplitMode::Layer)];
        for to in 0..names.len() {
            if let Some(ts) = shifted(&by_budget, to, STEP) {
                shapes.push(with(Vec::new(), ts, SplitMode::Layer));
            }
        }
        for n in &names {
            shapes.push(with(vec![n.clone()], Vec::new(), SplitMode::Layer));
        }
        let mut backends: Vec<&str> = names.iter().map(|n| backend_of(n)).collect();
        backends.dedup();
        if backends.len() > 1 {
            for b in &backends {
                let group: Vec<String> = names
                    .iter()
                    .filter(|n| backend_of(n) == *b)
                    .cloned()
                    .collect();
                if group.len() > 1 {
                    shapes.push(with(group, Vec::new(), SplitMode::Layer));
                }
            }
        }
        for &mode in &self.settings.split_modes {
            let mut c = with(Vec::new(), Vec::new(), mode);
            if mode == SplitMode::Tensor {
                // Its constraints, applied before it is built: flash attention, an f16 cache.
                c.type_k = CacheType::F16;
                c.type_v = CacheType::F16;
                if c.flash_attn == FlashAttn::Off {
                    c.flash_attn = FlashAttn::Auto;
                }
            }
            shapes.push(c);
        }
        let mut out = self.fitted(shapes);
        out.retain(|c| c != from && !fewer_layers_on_the_same_devices(c, from));
        out.sort();
        out.dedup();
        out
    }

    /// Each shape at the most layers it lets fit (the user's pinned count when that fits); shapes
    /// that fit no layer are left out.
    pub(crate) fn fitted(&self, shapes: Vec<Candidate>) -> Vec<Candidate> {
        let mut out = Vec::new();
        for c in shapes.into_iter().filter(|c| c.validate().is_ok()) {
            if self.settings.n_gpu_layers_pinned() {
                if self.check_fit(&c).is_ok() {
                    out.push(c);
                }
            } else if let Some(n) = self.max_fitting_layers(&c).filter(|&n| n > 0) {
                out.push(Candidate {
                    n_gpu_layers: n,
                    ..c
                });
            }
        }
        out
    }

    /// One more step in the direction `c`'s split already moved from the budgets' split: as far
    /// again as it has moved (10, 20, 40 points), so a device far faster than its share of the
    /// budgets says is reached in a few steps; `half` instead steps half as far (after a step that
    /// went too far).
    pub(super) fn split_step(&self, c: &Candidate, half: bool) -> Option<Candidate> {
        if c.tensor_split.is_empty() || !c.devices.is_empty() {
            return None;
        }
        let (_, base) = self.budget_split();
        let to =
            (0..c.tensor_split.len().min(base.len())).find(|&k| c.tensor_split[k] > base[k])?;
        let moved = self.split_moved(c).max(STEP);
        let step = if half { moved / 2 } else { moved };
        let at = |ts: Vec<u32>| Candidate {
            tensor_split: ts,
            ..c.clone()
        };
        let step = self.longest_step_that_holds(c, to, step);
        if step < 2 {
            return None;
        }
        let ts = shifted(&c.tensor_split, to, step)?;
        self.fitted(vec![at(ts)]).into_iter().next()
    }

    /// `step`, or where moving that far would push layers off the devices (the device `to` full), the
    /// longest step (bisected on dry runs) that still holds all of `c`'s layers; 0 where not even
    /// one point does.
    fn longest_step_that_holds(&self, c: &Candidate, to: usize, step: u32) -> u32 {
        let holds = |s: u32| {
            shifted(&c.tensor_split, to, s).is_some_and(|ts| {
                self.check_device_fit(&Candidate {
                    tensor_split: ts,
                    ..c.clone()
                })
                .is_ok()
            })
        };
        if holds(step) {
            return step;
        }
        if !holds(1) {
            return 0;
        }
        last_that_holds(1, step, holds)
    }

    /// The split that moves as much of `from`'s layers to the clearly fastest device (memory read
    /// bandwidth, [`Engine::fastest_device`]) as still holds them all: generation reads every
    /// layer once per token, one device after the other, so each byte there costs the least (a
    /// step search from the budgets' split takes several measured steps to get there). `None`
    /// where the devices are alike or that device cannot take more than a step.
    fn fill_fastest(&self, from: &Candidate) -> Option<Candidate> {
        let (names, by_budget) = self.budget_split();
        if names.len() < 2 || !from.devices.is_empty() {
            return None;
        }
        let to = self.fastest_device(&names)?;
        let at = |tensor_split: Vec<u32>| Candidate {
            devices: Vec::new(),
            tensor_split,
            split_mode: SplitMode::Layer,
            ..from.clone()
        };
        let c = self.filled(&at(by_budget), to)?;
        self.fitted(vec![c]).into_iter().next()
    }

    /// `c` with as much of its split moved to device `to` as still holds every layer of `c`, on the
    /// devices left a share (a device with none is left out: all on one is that device alone);
    /// `None` where that is no more than a step.
    fn filled(&self, c: &Candidate, to: usize) -> Option<Candidate> {
        let step = self.longest_step_that_holds(c, to, 100);
        let ts = shifted(&c.tensor_split, to, step).filter(|_| step > STEP)?;
        if !ts.contains(&0) {
            return Some(Candidate {
                tensor_split: ts,
                ..c.clone()
            });
        }
        let names = if c.devices.is_empty() {
            self.budget_split().0
        } else {
            c.devices.clone()
        };
        let (devices, ts): (Vec<String>, Vec<u32>) =
            (names.into_iter().zip(ts)).filter(|(_, s)| *s > 0).unzip();
        Some(Candidate {
            tensor_split: if devices.len() > 1 { ts } else { Vec::new() },
            devices,
            ..c.clone()
        })
    }

    /// The fewest of the fastest devices (memory read bandwidth) that hold every layer `from`
    /// offloads, two or more and fewer than all, alone (`--device`), split by their budgets; and,
    /// where one of them is clearly faster than the rest of them, that split with it filled. A token
    /// then passes no slower device: on the simulator a model that two fast GPUs of four hold ran
    /// 1.8x as fast on those two as spread over the four with the fastest filled. Where still fewer
    /// of them hold every layer with a quantized KV cache only (the least quantized that does),
    /// that too: at `from`'s f16 cache the choice would wait for the split's second pass, after the
    /// cache axis, which a fixed budget may not reach (`bench/vs-tuners`' landscape 161: two of three
    /// GPUs at q4_0 ran 1.8x as fast as the three at f16). Empty with fewer than three devices or
    /// where they are alike.
    fn fastest_devices_alone(&self, from: &Candidate) -> Vec<Candidate> {
        let budgets = self.offload_budgets();
        let names: Vec<String> = budgets.iter().map(|(n, _)| n.clone()).collect();
        if names.len() < 3 || !from.devices.is_empty() {
            return Vec::new();
        }
        // Hosts reached over different links differ by them even where their memory is alike.
        let Some(bw) = self
            .device_speeds(&names)
            .filter(|bw| clearly_fastest(bw).is_some() || self.links_differ(&names))
        else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for k in 2..names.len() {
            let order = self.fastest_order(from, &names, &bw, k);
            let mut chosen = order[..k].to_vec();
            chosen.sort();
            let c = Candidate {
                devices: chosen.iter().map(|&i| names[i].clone()).collect(),
                tensor_split: shares_of(&chosen.iter().map(|&i| budgets[i].1).collect::<Vec<_>>()),
                split_mode: SplitMode::Layer,
                ..from.clone()
            };
            let speeds: Vec<f64> = chosen.iter().map(|&i| bw[i]).collect();
            if self.check_device_fit(&c).is_ok() {
                out.extend(self.with_fastest_filled(c, &speeds));
                break;
            }
            if out.is_empty() {
                let quantized = vary_cache(&self.settings, &c)
                    .into_iter()
                    .filter(|q| q.kv_lossy() && (q.type_k, q.type_v) != (from.type_k, from.type_v))
                    .find(|q| q.validate().is_ok() && self.check_device_fit(q).is_ok());
                if let Some(q) = quantized {
                    out = self.with_fastest_filled(q, &speeds);
                }
            }
        }
        out
    }

    /// `c` (devices alone, split by their budgets) and, where one of them is clearly faster than
    /// the rest (`speeds`, in `c`'s device order), that split with it filled.
    fn with_fastest_filled(&self, c: Candidate, speeds: &[f64]) -> Vec<Candidate> {
        let filled = clearly_fastest(speeds)
            .and_then(|to| self.filled(&c, to))
            // Every layer on one of them is that device alone, which the group measures.
            .filter(|f| f.devices.len() > 1);
        std::iter::once(c).chain(filled).collect()
    }

    /// The device of `names` clearly fastest at reading its memory ([`FASTER`] than the slowest),
    /// by the probe of each run before the search; `None` where they are alike, a probe failed or
    /// none ran.
    fn fastest_device(&self, names: &[String]) -> Option<usize> {
        clearly_fastest(&self.device_speeds(names)?)
    }

    /// The probed memory read bandwidths of `names`, in their order ([`Self::probe_device_bandwidths`],
    /// before the search); `None` where a probe failed or none ran.
    fn device_speeds(&self, names: &[String]) -> Option<Vec<f64>> {
        let measured = self.device_bandwidths.as_ref()?;
        (names.iter())
            .map(|n| measured.iter().find(|(d, _)| d == n).map(|(_, b)| *b))
            .collect()
    }

    /// Probes the offload devices' memory read bandwidths, once, where the run may split layers
    /// over two or more. Called before anything is loaded: the probe's workers hold the devices, so
    /// later it would cost a reload of the model being measured.
    pub(crate) fn probe_device_bandwidths(&mut self) {
        let devices = self.offload_budgets();
        if self.device_bandwidths.is_some() || !self.settings.offload || devices.len() < 2 {
            return;
        }
        let rpc = self.settings.plan.rpc.clone();
        let names: Vec<&str> = devices.iter().map(|(n, _)| n.as_str()).collect();
        let label = format!("memory bandwidth of {}", names.join(", "));
        self.progress.candidate_started(&label, "split");
        self.device_bandwidths = Some(self.measurer.get_mut().device_bandwidths(&devices, &rpc));
    }

    /// Points `c`'s split has moved toward one device from the budgets' split (0 for none).
    pub(super) fn split_moved(&self, c: &Candidate) -> u32 {
        let (_, base) = self.budget_split();
        (c.tensor_split.iter().zip(&base))
            .find(|(v, b)| v > b)
            .map_or(0, |(v, b)| v - b)
    }

    /// The split search around `best` ([`SplitSearch`]); returns the new best.
    pub fn search_split(&mut self, best: Candidate) -> Candidate {
        let search = SplitSearch::new(&self.view(), best);
        self.drive(search)
    }

    /// The first group of the split search from `best`: the split group, its promising shapes
    /// first, as `best`'s backend runs them; `None` where there is nothing to split.
    pub(super) fn split_search_group(&self, best: &Candidate) -> Option<Group> {
        if !self.settings.offload || self.past_budget() {
            return None;
        }
        let from = crate::engine::in_space(&self.settings, &self.plain(best));
        let mut group = self.split_group(&from);
        if group.is_empty() {
            return None;
        }
        // The fewest hosts nearest by their links are visited first, then the roofline's split, then the
        // fastest devices alone: where the budget ends within the group (a large model on several
        // GPUs, weights sent over slow links), they are the ones measured.
        let mut promising: Vec<Candidate> = self.nearest_hosts(&from).into_iter().collect();
        promising.extend(self.fill_fastest(&from));
        promising.extend(self.fastest_devices_alone(&from));
        group.extend(promising.iter().cloned());
        let through = |v: Vec<Candidate>| -> Vec<Candidate> {
            v.iter().filter_map(|c| self.like(c, best)).collect()
        };
        let (mut group, promising) = (through(group), through(promising));
        group.insert(0, best.clone());
        Some(Group {
            promising,
            ..Group::new(group, "split")
        })
    }
}

/// The split search around a best (the placement group's winner): the split group, then steps in
/// the winning direction, each as far as the split has moved, while each step wins; a step that
/// loses after a longer one is followed by one half as long.
///
/// The shapes are built as llama.cpp names the devices by default and run through the best's
/// backend where a GPU shows through several ([`Engine::like`]).
pub(crate) struct SplitSearch {
    best: Candidate,
    /// The split group, until proposed.
    first: Option<Group>,
    /// The group is out: its choice comes next.
    group_out: bool,
    /// The step out against the best.
    step: Option<Candidate>,
    /// Steps taken (at most [`MAX_STEPS`]).
    taken: usize,
    /// The next step is half as long (the last went too far).
    half: bool,
}

impl SplitSearch {
    pub fn new(view: &View, best: Candidate) -> Self {
        SplitSearch {
            first: view.split_search_group(&best),
            best,
            group_out: false,
            step: None,
            taken: 0,
            half: false,
        }
    }

    /// Hears the last step's choice; `false`: the search is over.
    fn hear_step(&mut self, view: &View, step: &Candidate, chosen: Option<Candidate>) -> bool {
        match chosen {
            Some(c) if c == *step && !self.half => self.best = c,
            Some(c) if c == *step => {
                self.best = c;
                return false;
            }
            // Too far: half as far from the best, once, where the step was longer than one.
            _ if !self.half && view.split_moved(&self.best) > STEP => self.half = true,
            _ => return false,
        }
        true
    }
}

impl Strategy for SplitSearch {
    type Output = Candidate;

    fn next(&mut self, view: &View, chosen: Option<Candidate>) -> Option<Group> {
        if let Some(g) = self.first.take() {
            self.group_out = true;
            return Some(g);
        }
        if std::mem::take(&mut self.group_out) {
            self.best = chosen.unwrap_or_else(|| self.best.clone());
        } else if let Some(step) = self.step.take() {
            if !self.hear_step(view, &step, chosen) {
                self.taken = MAX_STEPS;
            }
        } else {
            return None;
        }
        if self.taken >= MAX_STEPS || view.past_budget() {
            return None;
        }
        self.taken += 1;
        let plain = view.plain(&self.best);
        let next = (view.split_step(&plain, self.half)).and_then(|c| view.like(&c, &self.best))?;
        self.step = Some(next.clone());
        Some(Group::new(vec![self.best.clone(), next], "split"))
    }

    fn finish(self, _: &View) -> Candidate {
        self.best
    }
}

/// Whether `c` spreads layers over the same devices as `from` (another split, or `-sm row`) but
/// holds fewer of them: the layers it leaves to the host are read from host memory at every token
/// and multiplied there (or copied to a device for a large batch), slower than on any offload
/// device, and the devices' own work only shrinks. Dominated; not worth a measurement.
fn fewer_layers_on_the_same_devices(c: &Candidate, from: &Candidate) -> bool {
    c.devices == from.devices && c.n_gpu_layers < from.n_gpu_layers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_the_budgets_and_sum_to_100() {
        assert_eq!(shares_of(&[200, 100]), vec![67, 33]);
        assert_eq!(shares_of(&[1, 1, 1]).iter().sum::<u32>(), 100);
        assert_eq!(shares_of(&[u64::MAX, 0]), vec![99, 1]);
    }

    #[test]
    fn a_step_moves_points_toward_one_device_and_keeps_the_total() {
        assert_eq!(shifted(&[50, 50], 0, 10), Some(vec![60, 40]));
        assert_eq!(shifted(&[50, 50], 1, 10), Some(vec![40, 60]));
        let three = shifted(&[40, 30, 30], 2, 10).unwrap();
        assert_eq!(three.iter().sum::<u32>(), 100);
        assert_eq!(three[2], 40);
        assert_eq!(shifted(&[100, 0], 0, 10), None);
        assert_eq!(shifted(&[95, 5], 0, 10), Some(vec![100, 0]));
    }

    #[test]
    fn only_a_clearly_faster_device_is_filled_first() {
        assert_eq!(clearly_fastest(&[900e9, 3000e9, 900e9]), Some(1));
        assert_eq!(clearly_fastest(&[900e9, 950e9]), None, "within 15%: alike");
        assert_eq!(clearly_fastest(&[]), None);
    }

    #[test]
    fn backends_are_named_by_their_prefix() {
        assert_eq!(backend_of("CUDA1"), "CUDA");
        assert_eq!(backend_of("RPC0"), "RPC");
        assert_eq!(backend_of("Vulkan12"), "Vulkan");
    }
}
