//! The order of the descent's axes on the host alone: by the gain each can bring per second of
//! measuring it (issue 60). The gain is the most the ceilings leave its phases to win (the same
//! bound that skips an axis with nothing to win), the cost its new candidates' first visits at the
//! request its group is screened on, priced by the defaults' figures (a load only where the model
//! changes). A generation thread count costs a few generated tokens, a kernel choice a load and a
//! whole prompt: on a 7B model on two cores the thread counts came first and the KV cache's four
//! pairs last. Beside an offload device there are no ceilings, and the table's order stands.

use super::{Axis, Engine};
use search_space::{knob, Candidate};

/// Axes that go with the one before them in the table, whatever their own gain: they vary what it
/// chose (the rotation of a quantized cache, the offload threshold of the micro-batch's batches,
/// the NUMA strategy beside the threads it spreads).
fn follows(axis: &str) -> bool {
    matches!(axis, "attention rotation" | "op offload threshold" | "numa")
}

/// The order's prior on thread counts: fewer threads than llama.cpp's default (the physical or
/// performance cores) rarely win either phase (the prompt is compute-bound; generation's bandwidth
/// wants every core's loads in flight: on a 7B model on two cores one thread generated at 60% of
/// two's and processed the prompt at half), so an axis that offers only fewer goes after those
/// with as much room. It orders; the measurement decides.
fn prior(s: &super::TuneSettings, new: &[&Candidate]) -> f64 {
    const FEWER_THREADS: f64 = 0.25;
    let fewer =
        |c: &&Candidate| c.threads < s.default_threads || c.batch_threads() < s.default_threads;
    match !new.is_empty() && new.iter().all(fewer) {
        true => FEWER_THREADS,
        false => 1.0,
    }
}

impl Engine<'_> {
    /// `axes` by the gain each can bring per second from `from`, the most first, each with the
    /// axes that follow it; as given where the gain or the cost cannot be told (a device beside
    /// the host, no time plan yet).
    pub(crate) fn by_gain_per_second(&self, axes: &[Axis], from: &Candidate) -> Vec<Axis> {
        if self.settings.offload || self.time_plan.is_none() {
            return axes.to_vec();
        }
        let mut blocks: Vec<Vec<Axis>> = Vec::new();
        for a in axes {
            match blocks.last_mut() {
                Some(b) if follows(a.name) => b.push(*a),
                _ => blocks.push(vec![*a]),
            }
        }
        let gain: Vec<f64> = blocks
            .iter()
            .map(|b| self.gain_per_second(&b[0], from))
            .collect();
        let mut order: Vec<usize> = (0..blocks.len()).collect();
        order.sort_by(|&a, &b| gain[b].total_cmp(&gain[a]));
        order.into_iter().flat_map(|k| blocks[k].clone()).collect()
    }

    /// The most `axis` could win from `from` (relative) over what measuring its new candidates
    /// costs (seconds); 0 where it has none, its room where its cost is nothing.
    fn gain_per_second(&self, axis: &Axis, from: &Candidate) -> f64 {
        let s = &self.settings;
        let group: Vec<Candidate> = std::iter::once(from.clone())
            .chain((axis.vary)(s, from))
            .filter(|c| c.validate().is_ok())
            .collect();
        let new: Vec<&Candidate> = group.iter().filter(|c| *c != from).collect();
        if new.is_empty() {
            return 0.0;
        }
        // Where the ceilings cannot bound an axis, it is taken to have everything to win.
        let room = self.room_on(&group, from).unwrap_or(1.0).max(0.0) * prior(s, &new);
        let screen = self.screen_for(&group, axis.name);
        let phases = knob::phases_moved(&group);
        let cost: f64 = (new.iter())
            .map(|c| self.step_cost_at(c, true, phases, screen))
            .sum();
        if cost > 0.0 {
            room / cost
        } else {
            room
        }
    }
}
