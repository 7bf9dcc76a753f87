//! The backends one GPU was measured through: where a GPU is driven by several loaded modules
//! (CUDA0 and Vulkan0 on an NVIDIA machine with both), the run measures the best placement found
//! through each, paired and interleaved, and goes on with the faster. What each gave is kept with
//! the profile, so `explain` can say by how much the winner's backend won.

use crate::profile::Figures;
use search_space::Candidate;
use serde::{Deserialize, Serialize};

/// One backend's configuration in the comparison, and what it measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendTrial {
    /// The ggml backend (`CUDA`, `Vulkan`).
    pub backend: String,
    /// The configuration measured through it (its `devices` name the GPU as this backend does).
    pub candidate: Candidate,
    /// Its figures, where it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub figures: Option<Figures>,
    /// `ok`, or why it has no figures (pruned by a memory budget, failed, not reached).
    pub status: String,
    /// The comparison's choice: the search went on through this backend.
    #[serde(default)]
    pub chosen: bool,
}

impl BackendTrial {
    /// The chosen trial's request rate over each other measured trial's ("CUDA0 1.31x Vulkan0 at
    /// ngl=33"): (the other, the ratio of their workload seconds).
    pub fn ratios(trials: &[BackendTrial]) -> Vec<(&BackendTrial, &BackendTrial, f64)> {
        let Some(won) = trials.iter().find(|t| t.chosen) else {
            return Vec::new();
        };
        let Some(w) = &won.figures else {
            return Vec::new();
        };
        trials
            .iter()
            .filter(|t| !t.chosen)
            .filter_map(|t| {
                let f = t.figures.as_ref()?;
                (w.score_s > 0.0).then(|| (won, t, f.score_s / w.score_s))
            })
            .collect()
    }

    /// The comparison in one line ("CUDA0 1.31x Vulkan0 at ngl=33"), a trial that was not measured
    /// with its status; `None` without a measured choice.
    pub fn summary(trials: &[BackendTrial]) -> Option<String> {
        let won = trials.iter().find(|t| t.chosen && t.figures.is_some())?;
        let ngl = won.candidate.n_gpu_layers;
        let mut parts: Vec<String> = (Self::ratios(trials).into_iter())
            .map(|(w, o, r)| {
                let at = if o.candidate.n_gpu_layers == ngl {
                    String::new()
                } else {
                    format!(
                        " ({} at ngl={})",
                        o.devices_label(),
                        o.candidate.n_gpu_layers
                    )
                };
                format!(
                    "{} {r:.2}x {} at ngl={ngl}{at}",
                    w.devices_label(),
                    o.devices_label()
                )
            })
            .collect();
        parts.extend(
            (trials.iter())
                .filter(|t| !t.chosen && t.figures.is_none())
                .map(|t| format!("{}: {}", t.devices_label(), t.status)),
        );
        Some(parts.join("; "))
    }

    /// One line per trial: its figures (seconds per request, tg, pp), or its status.
    pub fn detail(&self) -> String {
        let chosen = if self.chosen { ", chosen" } else { "" };
        match &self.figures {
            Some(f) => format!(
                "{} ({} backend, ngl={}): {:.3} s per request, tg {:.1} t/s, pp {:.1} t/s{chosen}",
                self.devices_label(),
                self.backend,
                self.candidate.n_gpu_layers,
                f.score_s,
                f.tg_tps,
                f.pp_tps
            ),
            None => format!(
                "{} ({} backend): {}",
                self.devices_label(),
                self.backend,
                self.status
            ),
        }
    }

    /// The devices this trial's configuration names, as one word (`CUDA0`, `Vulkan0+Vulkan1`).
    pub fn devices_label(&self) -> String {
        let gpus: Vec<&str> = (self.candidate.devices.iter())
            .map(String::as_str)
            .filter(|d| *d != "CPU")
            .collect();
        if gpus.is_empty() {
            self.backend.clone()
        } else {
            gpus.join("+")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trial(backend: &str, device: &str, score_s: Option<f64>, chosen: bool) -> BackendTrial {
        let mut candidate = Candidate::llama_default(8, 33);
        candidate.devices = vec![device.into()];
        BackendTrial {
            backend: backend.into(),
            candidate,
            figures: score_s.map(|score_s| Figures {
                pp_tps: 1000.0,
                tg_tps: 50.0,
                pp_depth_tps: None,
                tg_depth_tps: None,
                ttft_ms: None,
                score_s,
                mem_bytes: 1 << 30,
                pp_ci: None,
                tg_ci: None,
                repetitions: 3,
                estimated: Vec::new(),
            }),
            status: if score_s.is_some() { "ok" } else { "pruned" }.into(),
            chosen,
        }
    }

    #[test]
    fn the_chosen_backend_is_compared_with_each_measured_other() {
        let trials = [
            trial("CUDA", "CUDA0", Some(2.0), true),
            trial("Vulkan", "Vulkan0", Some(2.62), false),
            trial("SYCL", "SYCL0", None, false),
        ];
        let r = BackendTrial::ratios(&trials);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0.devices_label(), "CUDA0");
        assert_eq!(r[0].1.devices_label(), "Vulkan0");
        assert!((r[0].2 - 1.31).abs() < 1e-9, "{}", r[0].2);
        // Nothing chosen, or the chosen one unmeasured: nothing to say.
        assert!(BackendTrial::ratios(&trials[1..]).is_empty());
        assert_eq!(BackendTrial::summary(&trials[1..]), None);
        assert_eq!(
            BackendTrial::summary(&trials).as_deref(),
            Some("CUDA0 1.31x Vulkan0 at ngl=33; SYCL0: pruned")
        );
        assert!(trials[0]
            .detail()
            .ends_with("2.000 s per request, tg 50.0 t/s, pp 1000.0 t/s, chosen"));
        // A backend measured at another placement says which.
        let mut fewer = trials[1].clone();
        fewer.candidate.n_gpu_layers = 30;
        let two = [trials[0].clone(), fewer];
        assert_eq!(
            BackendTrial::summary(&two).as_deref(),
            Some("CUDA0 1.31x Vulkan0 at ngl=33 (Vulkan0 at ngl=30)")
        );
    }

    #[test]
    fn the_trials_round_trip_and_the_winners_device_reaches_the_server() {
        let mut p = crate::example_profile();
        p.winner.devices = vec!["Vulkan0".into()];
        p.backends = vec![
            trial("CUDA", "CUDA0", Some(2.62), false),
            trial("Vulkan", "Vulkan0", Some(2.0), true),
        ];
        p.refresh_server_args();
        let args = p.server_args.join(" ");
        assert!(args.contains("--device Vulkan0"), "{args}");
        p.validate(false).unwrap();
        let text = p.to_toml().unwrap();
        assert!(text.contains("[[backends]]"), "{text}");
        let (back, warnings) = crate::Profile::from_toml(&text).unwrap();
        assert_eq!(back, p);
        assert!(warnings.is_empty(), "{warnings:?}");
        // A trial's figures are held to the same checks as the winner's.
        p.backends[0].figures.as_mut().unwrap().tg_tps = f64::NAN;
        let e = p.validate(false).unwrap_err().to_string();
        assert!(e.contains("backends[0].figures"), "{e}");
    }
}
