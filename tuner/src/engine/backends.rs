//! The backend axis: one GPU that several loaded modules drive (CUDA0 and Vulkan0 on an NVIDIA
//! machine with both, Vulkan0 and ROCm0 on an AMD one) is one device to llama.cpp, which gives a
//! model each GPU once, through the first module that lists it. Which backend runs a model faster
//! depends on the model, the card and the workload (one may be faster at prompts and slower at
//! generation), so it is measured: the best placement found through the run's first backend, and
//! the best that fits through each other (`--device Vulkan0`, the other not used), paired and
//! interleaved like any axis; the search goes on through the winner's.
//!
//! One GPU has one memory budget whatever backend names it (`profiles::DeviceBudget::same_gpu`),
//! so every dry-run check of a configuration through another backend is held to the same bytes.
//! On such a machine every candidate lists its devices (`--device`), so the profile's server uses
//! the backend that was measured; the split and host searches build their shapes as llama.cpp
//! names the devices by default ([`Engine::plain`]) and run them through the best's backend
//! ([`Engine::like`]).

use crate::engine::group::Group;
use crate::engine::strategy::Once;
use crate::engine::Engine;
use search_space::{Candidate, SplitMode};

/// The backend of a device by its llama.cpp name (`CUDA0` → `CUDA`, `RPC1` → `RPC`).
pub(crate) fn backend_of_device(name: &str) -> &str {
    search_space::backend::of_device(name)
}

impl Engine<'_> {
    /// Whether some GPU of the run shows through several backends: every candidate then names its
    /// devices, as llama.cpp's default would be the first module's.
    pub(crate) fn names_devices(&self) -> bool {
        self.settings.mem_budgets.has_same_gpus()
    }

    /// The offload devices as llama.cpp gives them to a model by default, in its order.
    fn default_devices(&self) -> Vec<String> {
        (self.settings.mem_budgets.offload())
            .map(|b| b.device.clone())
            .collect()
    }

    /// The devices `c` offloads to, listed.
    pub(crate) fn devices_listed(&self, c: &Candidate) -> Vec<String> {
        if c.devices.is_empty() {
            self.default_devices()
        } else {
            c.devices.clone()
        }
    }

    /// `name` as `backend` names the same GPU, where that backend drives it; else `name`.
    fn renamed(&self, name: &str, backend: &str) -> String {
        let Some(b) = self.settings.mem_budgets.entry(name) else {
            return name.to_string();
        };
        (std::iter::once(&b.device).chain(&b.same_gpu))
            .find(|n| backend_of_device(n) == backend)
            .map_or_else(|| name.to_string(), Clone::clone)
    }

    /// `c` through `backend`: each GPU it uses named as `backend` names it where that backend
    /// drives it (the others as they were), every device listed. `c` itself where no GPU shows
    /// through several backends.
    pub(crate) fn on_backend(&self, c: &Candidate, backend: &str) -> Candidate {
        if !self.names_devices() {
            return c.clone();
        }
        let devices = (self.devices_listed(c).iter())
            .map(|n| self.renamed(n, backend))
            .collect();
        Candidate {
            devices,
            ..c.clone()
        }
    }

    /// `c` with its devices named as llama.cpp names them by default, none listed where it uses
    /// all of them: the form the split and host searches build their shapes in.
    pub(crate) fn plain(&self, c: &Candidate) -> Candidate {
        if c.devices.is_empty() {
            return c.clone();
        }
        let b = &self.settings.mem_budgets;
        let devices: Vec<String> = (c.devices.iter())
            .map(|n| b.entry(n).map_or_else(|| n.clone(), |e| e.device.clone()))
            .collect();
        let devices = if devices == self.default_devices() {
            Vec::new()
        } else {
            devices
        };
        Candidate {
            devices,
            ..c.clone()
        }
    }

    /// The backend `c` runs its GPUs through: that of its first device several backends drive;
    /// `None` where it uses none such.
    pub(crate) fn backend_of(&self, c: &Candidate) -> Option<String> {
        let b = &self.settings.mem_budgets;
        (self.devices_listed(c).iter())
            .find(|n| b.entry(n).is_some_and(|e| !e.same_gpu.is_empty()))
            .map(|n| backend_of_device(n).to_string())
    }

    /// `shape` (built in [`Engine::plain`] form) through `like`'s backend; `None` where that
    /// backend cannot run it (`-sm row` is CUDA's).
    pub(crate) fn like(&self, shape: &Candidate, like: &Candidate) -> Option<Candidate> {
        let Some(backend) = self.backend_of(like) else {
            return Some(shape.clone());
        };
        let c = self.on_backend(shape, &backend);
        // An RPC server's rows are its own backend's business; this machine's must split rows.
        let row_elsewhere = c.split_mode == SplitMode::Row
            && (c.devices.iter()).any(|d| {
                let b = search_space::backend::of(backend_of_device(d));
                !b.row_split && b.name != "RPC"
            });
        (!row_elsewhere).then_some(c)
    }

    /// The backend the search starts through (the first of `--backend`, else the first module's).
    pub(crate) fn home_backend(&self) -> Option<&str> {
        self.settings.backends.first().map(String::as_str)
    }

    /// The backend axis from `best` (the placement and split search's winner): `best`, and the
    /// best placement that fits through each other backend of the run ([`Engine::through`]),
    /// measured against each other; the faster is the search's best from here on. Each is
    /// recorded ([`Engine::backend_trials`]) for the report, the profile and `explain`.
    pub(crate) fn compare_backends(&mut self, best: Candidate) -> Candidate {
        if self.out_of_time() {
            return best;
        }
        let tried = self.backends_to_try(&best);
        if tried.len() < 2 {
            return best;
        }
        let group: Vec<Candidate> = tried.iter().map(|(_, c)| c.clone()).collect();
        let won = (self.drive(Once::new(Group::new(group, "backend"), None))).unwrap_or(best);
        self.backend_trials = (tried.into_iter())
            .map(|(backend, candidate)| super::run::BackendTried {
                chosen: candidate == won,
                backend,
                candidate,
            })
            .collect();
        won
    }

    /// The backend axis's candidates: `best` through its backend, then through each other backend
    /// of the run where that differs; fewer than two where there is no other.
    fn backends_to_try(&self, best: &Candidate) -> Vec<(String, Candidate)> {
        let Some(now) = self.backend_of(best) else {
            return Vec::new();
        };
        let others: Vec<String> = (self.settings.backends.iter())
            .filter(|b| **b != now)
            .cloned()
            .collect();
        let mut tried = vec![(now, best.clone())];
        for b in others {
            let c = self.through(best, &b);
            if c != *best && !tried.iter().any(|(_, t)| *t == c) {
                tried.push((b, c));
            }
        }
        tried
    }

    /// `best`'s configuration through `backend`, at the best placement that fits there: its own
    /// where it fits, with more of the model on the GPU where `best` holds all it can and this
    /// backend holds more (its buffers are smaller), with less where it does not fit (they are
    /// larger). Returned unfitted where not even that fits: measuring it records why.
    fn through(&self, best: &Candidate, backend: &str) -> Candidate {
        let c = self.on_backend(&self.plain(best), backend);
        if c == *best || self.settings.n_gpu_layers_pinned() {
            return c;
        }
        if self.check_device_fit(&c).is_ok() {
            let at_limit = self.more_on_device(best).is_none();
            return match at_limit.then(|| self.more_on_device(&c)).flatten() {
                Some(more) => more,
                None => c,
            };
        }
        self.less_on_device(&c).unwrap_or(c)
    }

    /// `c` (which does not fit its devices) with the least of the model moved off them that fits:
    /// the fewest layers' experts or FFNs on the host where it keeps some there, else the most
    /// layers that fit; `None` where nothing does.
    fn less_on_device(&self, c: &Candidate) -> Option<Candidate> {
        if c.n_cpu_ffn > 0 || c.n_cpu_moe > 0 {
            let ffn = c.n_cpu_ffn > 0;
            let at = |n: u32| Candidate {
                n_cpu_ffn: if ffn { n } else { 0 },
                n_cpu_moe: if ffn { 0 } else { n },
                ..c.clone()
            };
            let n = self.fewest_on_host_upto(&at, self.settings.n_layers)?;
            return Some(at(n));
        }
        let n = self.max_fitting_layers(c).filter(|&n| n > 0)?;
        Some(Candidate {
            n_gpu_layers: n,
            ..c.clone()
        })
    }
}
