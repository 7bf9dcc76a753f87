//! The run's baseline: what a user gets from llama-server without a tuner, measured in the same run
//! at the same context. With a device to offload to, that is llama-server's default placement —
//! llama.cpp's own fit (`--fit`, `common_fit_params`) asked under the run's budgets — not the most
//! layers autotune's dry runs find: the fit fills the devices back to front, writes a `-ts` of whole
//! layers per device, and moves MoE experts to the host, each of which a search may or may not beat.
//! When the fit gives no placement that can be measured, the baseline falls back to the most layers
//! that fit by autotune's dry runs, and says why.

pub use super::run::{BaselinePlacement, BaselineSource};
use crate::engine::Engine;
use crate::llama::fit::as_n_cpu_moe;
use crate::measuring::{FitAnswer, FitRequest, TensorOverride};
use search_space::size::format_size;
use search_space::Candidate;

/// llama.cpp's fit's answer as a placement: what `-ngl`, `-ts`, `--n-cpu-moe` / `-ot` pin it.
#[derive(Debug, Clone, PartialEq)]
pub struct FitPlacement {
    /// Layers on non-CPU devices (llama.cpp's -1, "every layer", resolved to a count).
    pub n_gpu_layers: u32,
    /// Whole layers per non-CPU device in the model's order (`-ts`); empty: llama.cpp's split by
    /// free memory (the fit changed nothing, or there is one device).
    pub tensor_split: Vec<u32>,
    /// The overrides as `--n-cpu-moe N`, where they say exactly that.
    pub n_cpu_moe: Option<u32>,
    /// The overrides as `-ot PATTERN=BUFT` otherwise.
    pub tensor_overrides: Vec<(String, String)>,
}

impl FitPlacement {
    /// The placement of `answer` for a model of `n_layer` layers.
    pub fn of(answer: &FitAnswer, n_layer: u32) -> Self {
        let n_cpu_moe = as_n_cpu_moe(&answer.overrides, n_layer);
        FitPlacement {
            // Without a non-CPU device there is nothing to offload (llama.cpp ignores -ngl then).
            n_gpu_layers: if answer.devices.is_empty() {
                0
            } else {
                u32::try_from(answer.n_gpu_layers).unwrap_or(n_layer + 1)
            },
            tensor_split: answer
                .tensor_split
                .iter()
                .map(|v| v.round() as u32)
                .collect(),
            n_cpu_moe,
            tensor_overrides: if n_cpu_moe.is_some() {
                Vec::new()
            } else {
                answer
                    .overrides
                    .iter()
                    .map(|o| (o.pattern.clone(), o.buffer_type.clone()))
                    .collect()
            },
        }
    }

    /// `defaults` placed this way by `answer`'s fit; with a note when the overrides had to be
    /// approximated (a candidate carries `--n-cpu-moe`, not `-ot`), or why the placement cannot be
    /// carried at all. A split the same as llama.cpp's default split by free memory is left empty:
    /// the same placement, so not one more candidate to measure beside the search's own.
    pub fn candidate(
        &self,
        defaults: &Candidate,
        answer: &FitAnswer,
    ) -> Result<(Candidate, Option<String>), String> {
        let overrides = &answer.overrides;
        let (n_cpu_moe, note) = match self.n_cpu_moe {
            Some(n) => (n, None),
            None if overrides.is_empty() => (0, None),
            None => {
                let n = host_layers(overrides).ok_or_else(|| {
                    format!(
                        "llama.cpp's fit placed tensors a candidate cannot carry ({})",
                        overrides
                            .iter()
                            .map(|o| format!("-ot {}={}", o.pattern, o.buffer_type))
                            .collect::<Vec<_>>()
                            .join(" ")
                    )
                })?;
                let note = format!(
                    "llama.cpp's fit put tensors of {n} layers on the host ({} -ot overrides); \
                     measured as --n-cpu-moe {n} (the experts of the first {n} layers)",
                    overrides.len()
                );
                (n, Some(note))
            }
        };
        let free: Vec<u64> = answer.devices.iter().map(|d| d.free).collect();
        let by_free_memory = split_by_free_memory(&free, self.n_gpu_layers);
        let c = Candidate {
            n_gpu_layers: self.n_gpu_layers,
            tensor_split: if self.tensor_split == by_free_memory {
                Vec::new()
            } else {
                self.tensor_split.clone()
            },
            n_cpu_moe,
            ..defaults.clone()
        };
        c.validate().map_err(|e| e.to_string())?;
        Ok((c, note))
    }
}

/// Whole layers per device that llama.cpp's default split (by free memory; `free` in the model's
/// device order) gives `n` offloaded layers, by `llama_model::load_tensors`' rule in its `f32`
/// arithmetic: offloaded layer `j` goes to the first device whose cumulative share exceeds `j / n`.
fn split_by_free_memory(free: &[u64], n: u32) -> Vec<u32> {
    let sum: f32 = free.iter().map(|&f| f as f32).sum();
    if free.len() < 2 || sum <= 0.0 {
        return Vec::new();
    }
    let mut cumulative = Vec::with_capacity(free.len());
    let mut acc = 0f32;
    for &f in free {
        acc += f as f32;
        cumulative.push(acc / sum);
    }
    let mut out = vec![0u32; free.len()];
    for j in 0..n {
        let x = j as f32 / n as f32;
        let d = cumulative
            .iter()
            .position(|&c| c > x)
            .unwrap_or(free.len() - 1);
        out[d] += 1;
    }
    out
}

/// How many layers the overrides send (some of) to the host, when every override sends one
/// layer's tensors there; `None` when one goes to another device or names no single layer.
fn host_layers(overrides: &[TensorOverride]) -> Option<u32> {
    let mut layers = std::collections::BTreeSet::new();
    for o in overrides {
        if o.device != "CPU" {
            return None;
        }
        let rest = o.pattern.strip_prefix("blk\\.")?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let layer: u32 = digits.parse().ok()?;
        rest[digits.len()..].strip_prefix("\\.")?;
        layers.insert(layer);
    }
    Some(layers.len() as u32)
}

impl Engine<'_> {
    /// `defaults` at llama.cpp's fit placement under the run's budgets and context, checked by
    /// autotune's dry run against the budgets; when the fit gives none that can be measured, at the
    /// most layers that fit by dry runs, with why.
    pub(crate) fn fit_defaults(&mut self, defaults: Candidate) -> (Candidate, BaselinePlacement) {
        match self.llama_fit_placement(&defaults) {
            Ok((c, note)) => (c, BaselinePlacement::new(BaselineSource::LlamaFit, note)),
            Err(why) => {
                let n = self.max_fitting_layers(&defaults);
                let c = Candidate {
                    n_gpu_layers: n.unwrap_or(defaults.n_gpu_layers),
                    ..defaults
                };
                let why = format!(
                    "{why}; the baseline is the most layers that fit by autotune's dry runs"
                );
                (
                    c,
                    BaselinePlacement::new(BaselineSource::DryRunFit, Some(why)),
                )
            }
        }
    }

    /// llama.cpp's fit asked for its placement of `defaults`, as a candidate that fits the budgets.
    fn llama_fit_placement(
        &mut self,
        defaults: &Candidate,
    ) -> Result<(Candidate, Option<String>), String> {
        let s = &self.settings;
        let request = FitRequest {
            model: s.model.clone(),
            rpc: s.plan.rpc.clone(),
            n_ctx: s.plan.workload.n_ctx,
            sequences: s.plan.workload.n_parallel,
            budgets: s.mem_budgets.clone(),
            // Every device of the run has a budget; one the fit finds beside them gets no room.
            default_margin: u64::MAX,
        };
        let n_layers = s.n_layers;
        let stop = self.stop_fn();
        let answer = self.measurer.get_mut().llama_fit(&request, stop)?;
        if answer.status != 0 {
            return Err(format!(
                "llama.cpp's fit reported {}: {}",
                answer.status_name(),
                profiles::one_line(&answer.log_tail)
            ));
        }
        let (c, note) = FitPlacement::of(&answer, n_layers).candidate(defaults, &answer)?;
        let devices: Vec<String> = answer.devices.iter().map(|d| d.name.clone()).collect();
        let (fitted, trimmed) = self.within_budgets(c.clone(), &devices)?;
        let note = match trimmed {
            Some(why) => Some(match note {
                Some(n) => format!("{n}; {why}"),
                None => why,
            }),
            None => note,
        };
        Ok((fitted, note))
    }

    /// The fit's placement `c`, with a layer taken off a device autotune's dry run finds over its
    /// budget, at most [`MAX_TRIM`] times: llama.cpp's fit counts a device's memory its own way and
    /// can end a few MiB over the target it was given (seen: 15 MiB on an RPC device), and the
    /// budget is never exceeded. Returns the placement and, when it was trimmed, how and why;
    /// `Err` when it cannot be brought within the budgets this way.
    fn within_budgets(
        &mut self,
        mut c: Candidate,
        devices: &[String],
    ) -> Result<(Candidate, Option<String>), String> {
        let fit = c.label();
        let mut first_over = None;
        let mut trimmed = 0;
        loop {
            let over = self.over_budget(&c).map_err(|e| {
                format!("autotune's dry run of llama.cpp's fit placement {fit} failed: {e}")
            })?;
            let Some((device, need, budget)) = over else {
                let why = first_over.map(|(d, need, budget)| {
                    format!(
                        "llama.cpp's fit placement {fit} needs {} on {d} by autotune's dry run, \
                         over its budget of {}: measured with {trimmed} layer(s) fewer there",
                        format_size(need),
                        format_size(budget)
                    )
                });
                return Ok((c, why));
            };
            let k = devices.iter().position(|n| *n == device);
            let fewer = match k {
                _ if trimmed == MAX_TRIM || c.n_gpu_layers == 0 => false,
                Some(k) if !c.tensor_split.is_empty() => {
                    let has = c.tensor_split.get(k).copied().unwrap_or(0) > 0;
                    if has {
                        c.tensor_split[k] -= 1;
                    }
                    has
                }
                Some(_) => true,
                None => false,
            };
            if !fewer {
                return Err(format!(
                    "llama.cpp's fit placement {fit} needs {} on {device} by autotune's dry run, \
                     over its budget of {}",
                    format_size(need),
                    format_size(budget)
                ));
            }
            c.n_gpu_layers -= 1;
            if c.tensor_split.iter().all(|&v| v == 0) {
                c.tensor_split.clear();
            }
            first_over.get_or_insert((device, need, budget));
            trimmed += 1;
        }
    }

    /// The first device whose budget `c` exceeds by a dry run: its name, the bytes needed and the
    /// budget; `None` when it fits.
    fn over_budget(&mut self, c: &Candidate) -> Result<Option<(String, u64, u64)>, String> {
        if self.settings.mem_budgets.is_empty() {
            return Ok(None);
        }
        let report = self.footprint(c)?;
        Ok(report.per_device.iter().find_map(|d| {
            let budget = self.settings.mem_budgets.of(&d.device)?;
            (d.bytes > budget).then(|| (d.device.clone(), d.bytes, budget))
        }))
    }
}

/// At most this many layers are taken off llama.cpp's fit placement to bring it within the budgets
/// by autotune's dry run; beyond that the baseline falls back to the dry runs' own most layers.
const MAX_TRIM: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measuring::FitDevice;

    fn answer(ngl: i32, split: &[f32], overrides: &[&str]) -> FitAnswer {
        FitAnswer {
            status: 0,
            n_gpu_layers: ngl,
            n_ctx: 4096,
            tensor_split: split.to_vec(),
            overrides: overrides
                .iter()
                .map(|p| TensorOverride {
                    pattern: p.to_string(),
                    buffer_type: "CPU".into(),
                    device: "CPU".into(),
                })
                .collect(),
            devices: vec![
                FitDevice {
                    name: "RPC0".into(),
                    free: 1 << 30,
                    budget: 1 << 29,
                    margin: 1 << 29,
                };
                split.len().max(1)
            ],
            log_tail: String::new(),
        }
    }

    #[test]
    fn every_layer_and_a_split_of_whole_layers_become_the_candidate() {
        let d = Candidate::llama_default(4, 0);
        let a = answer(-1, &[], &[]);
        let (c, note) = FitPlacement::of(&a, 32).candidate(&d, &a).unwrap();
        assert_eq!(
            (c.n_gpu_layers, c.tensor_split.clone(), note),
            (33, vec![], None)
        );
        let a = answer(20, &[7.0, 13.0], &[]);
        let (c, _) = FitPlacement::of(&a, 32).candidate(&d, &a).unwrap();
        assert_eq!((c.n_gpu_layers, c.tensor_split), (20, vec![7, 13]));
        // The split llama.cpp makes by free memory anyway (equal here): no split of its own.
        let a = answer(20, &[10.0, 10.0], &[]);
        let (c, _) = FitPlacement::of(&a, 32).candidate(&d, &a).unwrap();
        assert_eq!((c.n_gpu_layers, c.tensor_split), (20, vec![]));
    }

    #[test]
    fn llama_cpps_split_by_free_memory_in_whole_layers() {
        assert_eq!(split_by_free_memory(&[3 << 30, 1 << 30], 8), vec![6, 2]);
        assert_eq!(split_by_free_memory(&[1 << 30, 1 << 30], 81), vec![41, 40]);
        assert_eq!(split_by_free_memory(&[1 << 30], 8), Vec::<u32>::new());
    }

    #[test]
    fn experts_of_the_last_layers_are_measured_as_as_many_first_layers() {
        let d = Candidate::llama_default(4, 0);
        let tail = "\\.ffn_(up|down|gate_up|gate)_(ch|)exps";
        let first = [format!("blk\\.0{tail}"), format!("blk\\.1{tail}")];
        let first: Vec<&str> = first.iter().map(|s| s.as_str()).collect();
        let a = answer(33, &[], &first);
        let (c, note) = FitPlacement::of(&a, 32).candidate(&d, &a).unwrap();
        assert_eq!((c.n_cpu_moe, note), (2, None));
        let last = [
            format!("blk\\.30{tail}"),
            "blk\\.31\\.ffn_down.*".to_string(),
        ];
        let last: Vec<&str> = last.iter().map(|s| s.as_str()).collect();
        let a = answer(33, &[], &last);
        let (c, note) = FitPlacement::of(&a, 32).candidate(&d, &a).unwrap();
        assert_eq!(c.n_cpu_moe, 2);
        assert!(note.unwrap().contains("--n-cpu-moe 2"));
        let mut a = answer(33, &[], &last);
        a.overrides[0].device = "RPC1".into();
        assert!(FitPlacement::of(&a, 32).candidate(&d, &a).is_err());
    }
}
