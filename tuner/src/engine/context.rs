//! `--ctx max`: the largest context at which the whole model stays in fast memory. Fit is a cliff:
//! a context whose KV cache pushes layers off the GPU runs at a fraction of the speed, so the context
//! is chosen first, by dry runs of llama.cpp's defaults with every layer on the offload devices (in
//! RAM without one), and the search then tunes at it. Like llama.cpp's own fit, which lowers the
//! context toward its `--fit-ctx` minimum (4096) before it moves layers off the GPUs; but measured
//! against the budgets the run was given, not the free memory alone.

use super::{in_space, Engine};
use search_space::Candidate;
use serde::Serialize;

/// The context is chosen in steps of this many tokens per slot (llama.cpp rounds a slot's context
/// up to a multiple of 256).
pub const CTX_STEP: u32 = 256;

/// llama.cpp's `--fit-ctx` default: the least context its fit lowers to before it moves layers.
pub const FIT_MIN_CTX: u32 = 4096;

/// How `--ctx max` chose the context.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextChoice {
    /// The context tuned at (llama-server's `-c`).
    pub n_ctx: u32,
    /// The most asked for: the model's trained context times the slots.
    pub ceiling: u32,
    /// Every layer and its KV cache fit the budgets at `n_ctx` (false: not even the least context
    /// does, and the search places layers at that context).
    pub whole: bool,
    /// What the next larger context would need beyond a budget (none when the ceiling fits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// A mixture of experts whose experts do not fit beside its context: the context is the most
    /// that fits with every expert in RAM on purpose (a token reads only the experts it routes to)
    /// and the rest of every layer on the offload devices.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub experts_on_host: bool,
}

impl ContextChoice {
    /// One line for the report.
    pub fn describe(&self, offload: bool) -> String {
        let place = match (offload, self.experts_on_host) {
            (true, false) => "every layer and its KV cache fit the offload devices",
            (true, true) => {
                "every layer but its experts, and the KV cache, fit the offload devices (the experts in RAM)"
            }
            (false, _) => "the model and its KV cache fit in RAM",
        };
        match (&self.limit, self.whole) {
            (None, _) => format!(
                "{} tokens, the most asked for (the model's trained context per slot): {place}",
                self.n_ctx
            ),
            (Some(l), true) => format!(
                "{} tokens, the most at which {place} (of {} asked; at {l})",
                self.n_ctx, self.ceiling
            ),
            (Some(l), false) => format!(
                "{} tokens, the least tried: not even it lets {place} ({l}); the search places layers",
                self.n_ctx
            ),
        }
    }
}

/// The contexts tried: `floor`, `ceiling` and the multiples of `step` between them. Returns the
/// largest for which `fits` holds, given that it fails at `ceiling` and holds at `floor`
/// (bisection: what a load needs only grows with the context).
pub fn bisect(floor: u32, ceiling: u32, step: u32, fits: &mut dyn FnMut(u32) -> bool) -> u32 {
    let (mut lo, mut hi) = (floor, ceiling);
    loop {
        let mid = ((lo / 2 + hi / 2) / step * step).max((lo / step + 1) * step);
        if mid >= hi {
            return lo;
        }
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
}

impl Engine<'_> {
    /// What the context is chosen with: llama.cpp's defaults in the user's space, every layer on
    /// the offload devices, spread by their budgets where there are several.
    pub(crate) fn context_probe(&self) -> Candidate {
        let mut c = in_space(
            &self.settings,
            &Candidate::llama_default(self.settings.default_threads, self.settings.n_gpu_layers),
        );
        let (names, shares) = self.budget_split();
        if names.len() > 1 {
            c.tensor_split = shares;
        }
        c
    }

    /// The largest context from `floor` to `ceiling` (in steps of [`CTX_STEP`] per slot) at which
    /// [`Self::context_probe`] fits every budget; for a mixture of experts that does not fit even
    /// at `floor`, with every expert on the host instead. The workload's context is left at it.
    pub fn largest_context(&mut self, floor: u32, ceiling: u32) -> ContextChoice {
        let c = self.context_probe();
        let whole = self.largest_context_of(&c, floor, ceiling);
        if whole.whole || !(self.settings.moe && self.settings.offload) {
            return whole;
        }
        let lean = Candidate {
            n_cpu_moe: self.settings.n_layers,
            ..c
        };
        let lean = self.largest_context_of(&lean, floor, ceiling);
        let choice = if lean.whole {
            ContextChoice {
                experts_on_host: true,
                ..lean
            }
        } else {
            whole
        };
        self.settings.plan.workload.n_ctx = choice.n_ctx;
        choice
    }

    fn largest_context_of(&mut self, c: &Candidate, floor: u32, ceiling: u32) -> ContextChoice {
        let step = CTX_STEP * self.settings.plan.workload.n_parallel.max(1);
        let at = |e: &mut Self, n: u32| {
            e.settings.plan.workload.n_ctx = n;
            e.check_fit(c)
                .err()
                .map(|u| u.why.trim_start_matches("pruned: ").to_string())
        };
        let Some(over) = at(self, ceiling) else {
            return ContextChoice {
                n_ctx: ceiling,
                ceiling,
                whole: true,
                limit: None,
                experts_on_host: false,
            };
        };
        if let Some(short) = at(self, floor) {
            return ContextChoice {
                n_ctx: floor,
                ceiling,
                whole: false,
                limit: Some(short),
                experts_on_host: false,
            };
        }
        let mut limit = (ceiling, over);
        let n = bisect(floor, ceiling, step, &mut |n| match at(self, n) {
            None => true,
            Some(m) => {
                if n < limit.0 {
                    limit = (n, m);
                }
                false
            }
        });
        self.settings.plan.workload.n_ctx = n;
        ContextChoice {
            n_ctx: n,
            ceiling,
            whole: true,
            limit: Some(format!("{}: {}", limit.0, limit.1)),
            experts_on_host: false,
        }
    }
}

/// The least context `--ctx max` tries: llama.cpp's fit minimum per slot, or what the workload's
/// request needs when that is more (a multiple of `step`), never above `ceiling`.
pub fn floor_of(need_per_slot: u32, slots: u32, ceiling: u32) -> u32 {
    let slots = slots.max(1);
    let step = CTX_STEP * slots;
    let need = need_per_slot.max(FIT_MIN_CTX).saturating_mul(slots);
    need.div_ceil(step).saturating_mul(step).min(ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bisection_finds_the_largest_step_that_fits() {
        for limit in [4096, 4097, 5000, 30000, 32767] {
            let mut tried = Vec::new();
            let n = bisect(4096, 32768, 256, &mut |n| {
                tried.push(n);
                n <= limit
            });
            assert_eq!(n, limit / 256 * 256, "limit {limit}");
            assert!(tried
                .iter()
                .all(|t| t.is_multiple_of(256) && *t > 4096 && *t < 32768));
            assert!(tried.len() <= 7, "{tried:?}");
        }
        // A floor off the step: the first multiple above it comes next.
        assert_eq!(bisect(300, 1000, 256, &mut |n| n <= 600), 512);
        assert_eq!(bisect(300, 1000, 256, &mut |n| n <= 400), 300);
        // Nothing strictly between: the floor.
        assert_eq!(bisect(4096, 4352, 256, &mut |_| panic!("not called")), 4096);
    }

    #[test]
    fn the_floor_is_llama_cpps_fit_minimum_or_the_workloads_need() {
        assert_eq!(floor_of(640, 1, 131072), 4096);
        assert_eq!(floor_of(5000, 1, 131072), 5120);
        assert_eq!(floor_of(640, 4, 131072), 16384);
        assert_eq!(floor_of(640, 1, 2048), 2048);
    }
}
