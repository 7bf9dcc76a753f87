//! Where the host's weights live beside a GPU with pinned host memory (CUDA, Vulkan): llama.cpp
//! maps the file (pageable memory, its default), reads them into the GPU's pinned memory
//! (`--load-mode none`) or, with `--no-host`, into the CPU's own repacking buffers. On the landscape
//! op offload copies the host's weights over the link for every prompt batch at the link's speed
//! from pinned memory and 60% of it from pageable memory; repacked weights make the CPU's kernels
//! faster but are never offloaded. The CPU kernel choice only matters where weights are in the
//! CPU's own buffers, so it is only measured there.

use super::harness::{gpus, settings, tune, Mode, SimRun};
use super::GIB;
use crate::engine::score_seconds;
use search_space::{HostBuffer, KernelChoice};

/// The measured candidates' (host buffer, kernels), each once: measured in full, or stopped
/// mid-repetition as more than `GIVE_UP_FACTOR` times as slow as the best.
fn measured(run: &SimRun) -> Vec<(HostBuffer, KernelChoice)> {
    let mut v: Vec<_> = (run.results.iter())
        .filter(|r| r.ok() || r.failure.as_ref().is_some_and(|f| f.gave_up()))
        .map(|r| (r.candidate.host_buffer, r.candidate.kernels))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A 70B-class model on one 24 GiB GPU (two thirds of its layers on the host), 4096-token prompts:
/// the prompt's batches bring the host's weights over the link, faster from pinned memory; with
/// them repacked in the CPU's buffers the 16 cores process the prompt, far slower. Pinned wins.
#[test]
fn pinned_memory_wins_a_long_prompt_on_a_partial_offload() {
    let land = gpus(1, 24 * GIB);
    let mut s = settings(&land, 11);
    s.plan.workload.n_prompt = 4096;
    s.plan.workload.n_gen = 16;
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(win.n_gpu_layers <= s.n_layers, "{}", win.label());
    assert_eq!(win.host_buffer, HostBuffer::Pinned, "{}", win.label());
    let kinds = measured(&run);
    for h in [HostBuffer::Mapped, HostBuffer::Cpu] {
        assert!(kinds.iter().any(|k| k.0 == h), "{h} measured: {kinds:?}");
    }
    let w = &s.plan.workload;
    let seconds = |host_buffer| {
        let c = search_space::Candidate {
            host_buffer,
            ..win.clone()
        };
        score_seconds(&land.ideal(&c, w), w)
    };
    assert!(seconds(HostBuffer::Mapped) > 1.1 * seconds(HostBuffer::Pinned));
    assert!(seconds(HostBuffer::Cpu) > 2.0 * seconds(HostBuffer::Pinned));
}

/// Beside pinned memory llama.cpp does not use the CPU's repacked kernels for host weights, so
/// `--no-repack` is only measured with `--no-host`; without such a device (an RPC server) the
/// kernels are measured as before.
#[test]
fn the_cpu_kernels_are_measured_only_where_host_weights_are_in_the_cpus_buffers() {
    let kernels_measured = |host_buffer_device: bool, allowed: Vec<HostBuffer>| {
        let mut land = gpus(1, 24 * GIB);
        land.devices[0].host_buffer = host_buffer_device;
        let mut s = settings(&land, 4);
        s.plan.workload.n_prompt = 16;
        s.plan.workload.n_gen = 256;
        if !host_buffer_device {
            s.host_buffer_devices.clear();
        }
        s.host_buffers = allowed;
        let run = tune(land, s, None, Mode::Search);
        assert!(run.winner.is_some());
        measured(&run)
    };
    let pinned_only = kernels_measured(true, vec![HostBuffer::Mapped, HostBuffer::Pinned]);
    assert!(
        pinned_only.iter().all(|k| k.1 == KernelChoice::Repack),
        "{pinned_only:?}"
    );
    let no_host = kernels_measured(true, vec![HostBuffer::Cpu]);
    assert!(
        no_host.contains(&(HostBuffer::Cpu, KernelChoice::Plain)),
        "{no_host:?}"
    );
    let rpc_like = kernels_measured(false, vec![HostBuffer::Mapped]);
    assert!(
        rpc_like.contains(&(HostBuffer::Mapped, KernelChoice::Plain)),
        "{rpc_like:?}"
    );
}
