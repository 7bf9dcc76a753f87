//! The split search where offload devices are other hosts: the link each is reached over (measured
//! before the run, `crate::hosts::links`) is part of how fast it is. A token's activations cross to a host
//! and its result comes back once per token whatever share of the layers it holds, so a host's link
//! adds a fixed cost per token, while its memory bandwidth sets how fast it reads its share.
//!
//! Nothing here decides: it orders what is measured first (the host nearest by its link, alone),
//! and which hosts make up "the fewest fastest that hold the model". Measurements choose.

use crate::engine::Engine;
use search_space::Candidate;

/// Links this many times apart in round trip (and [`LINK_GAP_S`] apart) are called different.
const LINK_RATIO: f64 = 2.0;
/// Round trips closer than this are alike whatever their ratio (two LAN hosts at 0.05 and 0.12 ms).
const LINK_GAP_S: f64 = 0.2e-3;

impl Engine<'_> {
    /// Seconds a generated token spends on the link to `device`: its measured round trip; 0 for a
    /// device without a measured link (a local GPU: its bus is in the scheduler's fixed cost).
    pub(crate) fn link_seconds(&self, device: &str) -> f64 {
        (self.settings.links.iter())
            .find(|l| l.device == device)
            .map_or(0.0, |l| l.round_trip_ms / 1e3)
    }

    /// Whether `names` are reached over links that clearly differ ([`LINK_RATIO`], [`LINK_GAP_S`]).
    pub(crate) fn links_differ(&self, names: &[String]) -> bool {
        let s: Vec<f64> = names.iter().map(|n| self.link_seconds(n)).collect();
        let (lo, hi) = s
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        hi - lo > LINK_GAP_S && hi > LINK_RATIO * lo
    }

    /// Where the offload devices are hosts reached over clearly different links: the fewest nearest
    /// (shortest round trips first) that hold every layer `from` could offload, alone (`--device`),
    /// split by their budgets, or the nearest alone at the most layers it holds where not even all
    /// of them hold every layer. A token crosses the least network there; measured early (in the
    /// first group right after the baseline, and in the split group), so a run whose budget ends
    /// early has measured it: over a slow link every load is seconds of weights on the wire, and on
    /// the simulator with 16 hosts (1 in 4 over Wi-Fi) the first 10 minutes went to placements
    /// over all of them (0.82x the two nearest) without it.
    pub(crate) fn nearest_hosts(&self, from: &Candidate) -> Option<Candidate> {
        let budgets: Vec<(String, u64)> = (self.settings.mem_budgets.offload())
            .map(|b| (b.device.clone(), b.bytes))
            .collect();
        let names: Vec<String> = budgets.iter().map(|(n, _)| n.clone()).collect();
        if names.len() < 2 || !from.devices.is_empty() || !self.links_differ(&names) {
            return None;
        }
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by(|&a, &b| {
            (self.link_seconds(&names[a])).total_cmp(&self.link_seconds(&names[b]))
        });
        let all = if self.settings.n_gpu_layers_pinned() {
            from.n_gpu_layers
        } else {
            self.settings.n_layers + 1
        };
        let on = |k: usize| {
            let mut chosen = order[..k].to_vec();
            chosen.sort();
            let weights: Vec<u64> = chosen.iter().map(|&i| budgets[i].1).collect();
            Candidate {
                devices: chosen.iter().map(|&i| names[i].clone()).collect(),
                tensor_split: if k > 1 {
                    super::split::shares_of(&weights)
                } else {
                    Vec::new()
                },
                split_mode: search_space::SplitMode::Layer,
                n_gpu_layers: all,
                ..from.clone()
            }
        };
        // The fewest that hold every layer (all but the host's share); else the nearest alone.
        (1..names.len())
            .map(on)
            .find(|c| c.validate().is_ok() && self.check_device_fit(c).is_ok())
            .or_else(|| self.fitted(vec![on(1)]).into_iter().next())
    }

    /// The order in which to take devices for the fewest fastest that hold `from`'s offloaded
    /// layers, `k` of them: by the seconds a token would spend on each holding `1/k` of the bytes
    /// `from` offloads (its share over its memory bandwidth `bw`, plus its link's round trip).
    /// Without measured links, or the dry run's bytes, by bandwidth alone.
    pub(crate) fn fastest_order(
        &self,
        from: &Candidate,
        names: &[String],
        bw: &[f64],
        k: usize,
    ) -> Vec<usize> {
        let mut order: Vec<usize> = (0..names.len()).collect();
        if self.settings.links.is_empty() {
            // No hosts: by bandwidth, as before links were measured (no dry run needed for it).
            order.sort_by(|&a, &b| bw[b].total_cmp(&bw[a]));
            return order;
        }
        let offloaded: u64 = self.footprint(from).map_or(0, |r| {
            (r.per_device.iter())
                .filter(|d| d.device != "CPU")
                .map(|d| d.bytes)
                .sum()
        });
        let share = offloaded as f64 / k.max(1) as f64;
        let cost = |i: usize| {
            if offloaded == 0 {
                -bw[i]
            } else {
                share / bw[i].max(1.0) + self.link_seconds(&names[i])
            }
        };
        let costs: Vec<f64> = (0..names.len()).map(cost).collect();
        order.sort_by(|&a, &b| costs[a].total_cmp(&costs[b]));
        order
    }
}
