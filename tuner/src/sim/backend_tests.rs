//! The backend axis on simulated landscapes: one GPU seen through two backends (`CUDA0` and
//! `Vulkan0`), the second faster at prompts and slower at generation, or with larger buffers. The
//! workload's objective decides which wins, and the GPU's one budget holds whichever backend a
//! configuration runs through.

use super::harness::{fits, gpus, settings, tune, with_engine, Mode, SimRun};
use super::{Landscape, OtherBackend, Outcome, SimModel, GIB, MIB};
use crate::engine::TuneSettings;
use search_space::Candidate;

/// A dense model of 32 layers on one GPU of `mem` bytes, which Vulkan drives too: `prompt` and
/// `decode` times CUDA's speeds there, `overhead` bytes more in its buffers.
fn landscape(mem: u64, prompt: f64, decode: f64, overhead: i64) -> Landscape {
    let mut land = gpus(1, mem);
    land.model = SimModel::dense(32, 200 * MIB, 128_256);
    land.other_backends = vec![OtherBackend {
        device: 0,
        name: "Vulkan0".into(),
        decode,
        prompt,
        overhead,
    }];
    land
}

/// A long prompt and a few tokens (`prompt_heavy`), else a short prompt and a long answer.
fn workload(land: &Landscape, prompt_heavy: bool) -> TuneSettings {
    let mut s = settings(land, 11);
    s.plan.workload.n_ctx = 8192;
    (s.plan.workload.n_prompt, s.plan.workload.n_gen) =
        if prompt_heavy { (4096, 8) } else { (128, 512) };
    s.ubatch_options = crate::tuning::ubatch_options(&[], &s.plan.workload, true);
    s
}

/// The devices a GPU's configuration names, one word.
fn named(c: &Candidate) -> String {
    c.devices.join("+")
}

/// What the backend axis measured, as `backend: devices, noise-free seconds per request`.
fn trials(run: &SimRun, land: &Landscape, s: &TuneSettings) -> Vec<(String, String, f64, bool)> {
    (run.backends.iter())
        .map(|t| {
            let secs = land.true_seconds(&t.candidate, &s.plan.workload);
            (t.backend.clone(), named(&t.candidate), secs, t.chosen)
        })
        .collect()
}

#[test]
fn the_workload_decides_between_a_faster_prompt_and_a_faster_decode() {
    let land = landscape(24 * GIB, 1.6, 0.8, 0);
    for (prompt_heavy, want) in [(false, "CUDA0"), (true, "Vulkan0")] {
        let s = workload(&land, prompt_heavy);
        let run = tune(land.clone(), s.clone(), None, Mode::Search);
        let t = trials(&run, &land, &s);
        eprintln!("prompt-heavy {prompt_heavy}: {t:?}");
        assert_eq!(t.len(), 2, "both backends measured: {t:?}");
        let chosen: Vec<&str> = t.iter().filter(|x| x.3).map(|x| x.1.as_str()).collect();
        assert_eq!(chosen, [want], "{t:?}");
        // The axis chose the truly faster one, and the search went on through its backend.
        let (fast, slow) = if t[0].1 == want {
            (&t[0], &t[1])
        } else {
            (&t[1], &t[0])
        };
        assert!(fast.2 < slow.2, "{t:?}");
        let win = run.winner.clone().expect("a winner");
        assert_eq!(named(&win), want, "{}", win.label());
        // The same placement through each: only the backend differs where both hold the model.
        let (a, b) = (&run.backends[0].candidate, &run.backends[1].candidate);
        assert_eq!(
            Candidate {
                devices: Vec::new(),
                ..a.clone()
            },
            Candidate {
                devices: Vec::new(),
                ..b.clone()
            }
        );
    }
}

#[test]
fn one_gpu_has_one_budget_through_either_backend() {
    // The whole model fits through CUDA; Vulkan's buffers take 1.5 GiB more, so fewer layers.
    let land = landscape(8 * GIB, 1.6, 0.8, 3 * GIB as i64 / 2);
    let s = workload(&land, true);
    assert_eq!(s.mem_budgets.offload().count(), 1, "one GPU, one budget");
    assert_eq!(s.mem_budgets.of("Vulkan0"), s.mem_budgets.of("CUDA0"));
    assert_eq!(s.backends, ["CUDA", "Vulkan"]);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let t = trials(&run, &land, &s);
    eprintln!("1.5 GiB more through Vulkan: {t:?}");
    let [cuda, vulkan] = [&run.backends[0].candidate, &run.backends[1].candidate];
    assert_eq!(
        (named(cuda).as_str(), named(vulkan).as_str()),
        ("CUDA0", "Vulkan0")
    );
    assert!(fits(&land, &s, cuda) && fits(&land, &s, vulkan), "{t:?}");
    assert!(
        vulkan.n_gpu_layers < cuda.n_gpu_layers,
        "Vulkan holds fewer layers in the same budget: {} vs {}",
        vulkan.label(),
        cuda.label()
    );
    let full = Candidate {
        devices: vec!["Vulkan0".into()],
        ..cuda.clone()
    };
    assert!(
        !fits(&land, &s, &full),
        "CUDA's placement does not fit Vulkan's buffers"
    );
    // Nothing was loaded past the GPU's memory, and no configuration used the GPU twice.
    assert_eq!(run.trace.borrow().count(Outcome::OutOfMemory), 0);
    assert!(
        run.results
            .iter()
            .all(|r| !(r.candidate.devices.iter().any(|d| d == "CUDA0")
                && r.candidate.devices.iter().any(|d| d == "Vulkan0"))),
        "a GPU named twice"
    );
}

#[test]
fn a_restricted_or_single_backend_run_has_no_backend_axis() {
    let land = landscape(24 * GIB, 1.6, 0.8, 0);
    // --backend vulkan: the search runs through Vulkan alone.
    let mut s = workload(&land, false);
    s.backends = vec!["Vulkan".into()];
    let run = tune(land.clone(), s, None, Mode::Search);
    assert!(run.backends.is_empty());
    let win = run.winner.expect("a winner");
    assert_eq!(named(&win), "Vulkan0", "{}", win.label());
    // One backend per GPU: nothing named, nothing compared.
    let plain = gpus(1, 24 * GIB);
    let run = tune(plain.clone(), settings(&plain, 3), None, Mode::Search);
    assert!(run.backends.is_empty());
    assert!(run.results.iter().all(|r| r.candidate.devices.is_empty()));
}

#[test]
fn the_grid_measures_every_combination_through_each_backend() {
    let land = landscape(24 * GIB, 1.6, 0.8, 0);
    let mut s = workload(&land, true);
    // A small grid: the backend is the knob that matters here.
    (s.threads_options, s.plan.kernels) = (vec![16], vec![search_space::KernelChoice::Repack]);
    s.plan.flash_attn = vec![search_space::FlashAttn::Auto];
    s.ubatch_options = vec![512, 2048];
    let (win, names) = with_engine(land, s, |e| {
        let win = e.run_exhaustive();
        let names: std::collections::BTreeSet<String> =
            (e.results.iter()).map(|r| named(&r.candidate)).collect();
        (win, names)
    });
    assert_eq!(names.into_iter().collect::<Vec<_>>(), ["CUDA0", "Vulkan0"]);
    assert_eq!(named(&win.expect("a winner")), "Vulkan0");
}

#[test]
fn a_backend_with_smaller_buffers_is_measured_with_more_layers_where_the_first_held_all_it_could() {
    // The model does not fit a 6 GiB GPU whole; Vulkan's buffers are 256 MiB smaller.
    let land = landscape(6 * GIB, 1.0, 1.0, -(256 * MIB as i64));
    let s = workload(&land, false);
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let t = trials(&run, &land, &s);
    eprintln!("256 MiB less through Vulkan on 6 GiB: {t:?}");
    let [cuda, vulkan] = [&run.backends[0].candidate, &run.backends[1].candidate];
    eprintln!("  {} | {}", cuda.label(), vulkan.label());
    assert!(cuda.n_gpu_layers <= land.model.n_layers, "{}", cuda.label());
    assert!(fits(&land, &s, cuda) && fits(&land, &s, vulkan), "{t:?}");
    assert!(
        vulkan.n_gpu_layers > cuda.n_gpu_layers,
        "{} vs {}",
        vulkan.label(),
        cuda.label()
    );
    // More layers on the GPU at the same speeds: Vulkan is chosen.
    assert_eq!(named(&run.winner.expect("a winner")), "Vulkan0", "{t:?}");
}

#[test]
fn two_gpus_are_measured_through_each_backend_together() {
    let mut land = gpus(2, 12 * GIB);
    land.model = SimModel::dense(32, 600 * MIB, 128_256);
    land.other_backends = (0..2)
        .map(|d| OtherBackend {
            device: d,
            name: format!("Vulkan{d}"),
            decode: 0.8,
            prompt: 1.6,
            overhead: 0,
        })
        .collect();
    let s = workload(&land, true);
    assert_eq!(s.mem_budgets.offload().count(), 2, "two GPUs, two budgets");
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let t = trials(&run, &land, &s);
    eprintln!("two GPUs, prompt-heavy: {t:?}");
    let names: Vec<&str> = t.iter().map(|x| x.1.as_str()).collect();
    assert_eq!(names, ["CUDA0+CUDA1", "Vulkan0+Vulkan1"], "{t:?}");
    let win = run.winner.expect("a winner");
    assert_eq!(named(&win), "Vulkan0+Vulkan1", "{}", win.label());
    // No configuration ran one GPU through two backends at once.
    for r in &run.results {
        for d in 0..2 {
            let both = [format!("CUDA{d}"), format!("Vulkan{d}")];
            assert!(
                !both.iter().all(|n| r.candidate.devices.contains(n)),
                "{}",
                r.candidate.label()
            );
        }
    }
}
