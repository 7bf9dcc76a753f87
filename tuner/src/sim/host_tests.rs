//! The host's RAM as a budget beside the GPUs': a model whose layers left on the host must fit in
//! what RAM is available, so too few layers offloaded is pruned (it would page from disk or be killed
//! for memory), while the search for the most layers a GPU holds is not misled by it.

use super::harness::{fits, gpus, max_fit, settings, tune, Mode};
use super::{Outcome, GIB};
use search_space::{Candidate, Numa};

/// Bytes the host holds for `c` by the landscape's dry run.
fn host_bytes(land: &super::Landscape, c: &Candidate, n_ctx: u32) -> u64 {
    land.footprint(c, n_ctx)
        .per_device
        .iter()
        .find(|d| d.device == "CPU")
        .map_or(0, |d| d.bytes)
}

/// A 70B-class model (about 38 GiB) on one 24 GiB GPU, with 24 GiB of RAM available: every layer
/// on the host does not fit in RAM, the most layers the GPU holds leave a host part that does. The
/// search still starts at the most layers the GPU holds and wins there; nothing it loads needs more
/// RAM than the budget, and the placements that would are pruned with the host named.
#[test]
fn too_few_layers_offloaded_for_the_rest_to_fit_in_ram_are_pruned_not_the_search() {
    let land = gpus(1, 24 * GIB);
    let mut s = settings(&land, 5);
    let host_budget = 24 * GIB;
    s.mem_budgets.0.push(profiles::DeviceBudget {
        device: "CPU".into(),
        bytes: host_budget,
        given: true,
        same_gpu: Vec::new(),
    });
    let n_ctx = s.plan.workload.n_ctx;
    let base = Candidate::llama_default(16, 81);
    let all_on_host = Candidate {
        n_gpu_layers: 0,
        ..base.clone()
    };
    assert!(
        host_bytes(&land, &all_on_host, n_ctx) > host_budget,
        "the model alone is larger than the RAM budget"
    );
    // The most layers the GPU holds, whatever the host (max_fit checks every budget, so drop the
    // host's for it).
    let mut gpu_only = s.clone();
    gpu_only.mem_budgets.0.retain(|b| b.device != "CPU");
    let max = max_fit(&land, &gpu_only, &base).unwrap();
    let at_max = Candidate {
        n_gpu_layers: max,
        ..base.clone()
    };
    assert!(
        fits(&land, &s, &at_max),
        "at {max} layers the rest fits in RAM"
    );

    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert!(fits(&land, &s, &win), "{}", win.label());
    assert!(win.n_gpu_layers + 1 >= max, "{} of {max}", win.label());
    let trace = run.trace.borrow();
    for (c, outcome, _) in &trace.calls {
        if *outcome == Outcome::Measured {
            assert!(
                host_bytes(&land, c, n_ctx) <= host_budget,
                "{} loaded with more than the RAM budget on the host",
                c.label()
            );
        }
    }
    let pruned_on_host: Vec<&str> = (run.results.iter())
        .filter_map(|r| r.skipped.as_deref())
        .filter(|why| why.contains("on CPU (host RAM), budget"))
        .collect();
    assert!(
        !pruned_on_host.is_empty(),
        "the CPU-only placement is pruned by the host's budget: {:?}",
        run.results
            .iter()
            .map(|r| (r.candidate.label(), r.skipped.clone()))
            .collect::<Vec<_>>()
    );
    // The leaderboard marks what did not fit, for explain: the rows pruned as over a budget, and
    // no other.
    let board = crate::engine::ranking::leaderboard(&run.results, &s.plan.workload, 0.02, 1);
    for e in &board {
        assert_eq!(
            e.did_not_fit,
            e.status.starts_with("pruned: needs"),
            "{}: {}",
            e.candidate.label(),
            e.status
        );
    }
    assert!(board.iter().any(|e| e.did_not_fit));
}

/// Two NUMA nodes (a dual-socket server): with the weights on the node that loaded them llama.cpp's
/// default reads little more than one node's bandwidth, and `--numa distribute` reaches both. The
/// search measures the strategies on the host and keeps distribute; on one node, where llama.cpp
/// treats them all as off, it measures off alone (the default options there).
#[test]
fn on_two_numa_nodes_the_search_keeps_distribute() {
    let mut land = gpus(0, 0);
    land.host.numa_nodes = 2;
    let mut s = settings(&land, 11);
    s.numa = vec![Numa::Off, Numa::Distribute, Numa::Isolate];
    // A 70B on the host: minutes a repetition; time for every axis.
    s.time_budget = std::time::Duration::from_secs(24 * 3600);
    let run = tune(land, s, None, Mode::Search);
    let win = run.winner.clone().expect("a winner");
    assert_eq!(win.numa, Numa::Distribute, "{}", win.label());
    let trace = run.trace.borrow();
    let measured =
        |numa| (trace.calls.iter()).any(|(c, o, _)| *o == Outcome::Measured && c.numa == numa);
    assert!(
        measured(Numa::Off) && measured(Numa::Isolate),
        "each strategy measured"
    );

    let land = gpus(0, 0);
    let s = settings(&land, 11);
    assert_eq!(s.numa, [Numa::Off]);
    let run = tune(land, s, None, Mode::Search);
    assert!(run
        .trace
        .borrow()
        .calls
        .iter()
        .all(|(c, _, _)| c.numa == Numa::Off));
}

/// An integrated GPU (or llvmpipe) whose memory is the host's RAM: each of its budget and the
/// host's is that RAM, so a placement that fits each alone can need more than the RAM together. It
/// is held to the host's budget once, together; a discrete GPU's memory is its own.
#[test]
fn a_gpu_that_shares_the_hosts_memory_is_budgeted_with_it_once() {
    let ram = 40 * GIB;
    let land = gpus(1, ram);
    let mut s = settings(&land, 3);
    s.mem_budgets.0.push(profiles::DeviceBudget {
        device: "CPU".into(),
        bytes: ram,
        given: true,
        same_gpu: Vec::new(),
    });
    // Half the 70B-class model's 80 layers on each side: about 19 GiB each, 38 GiB together.
    let half = Candidate::llama_default(16, 40);
    let bytes = |d: &str| {
        (land
            .footprint(&half, s.plan.workload.n_ctx)
            .per_device
            .iter())
        .find(|x| x.device == d)
        .map_or(0, |x| x.bytes)
    };
    let (host, gpu) = (bytes("CPU"), bytes("CUDA0"));
    assert!(
        host < ram && gpu < ram && host + gpu > ram - 8 * GIB,
        "{host} {gpu}"
    );
    let mut tight = s.clone();
    let budget = host + gpu - GIB;
    tight.mem_budgets.0.last_mut().unwrap().bytes = budget;
    let apart =
        super::harness::with_engine(land.clone(), tight.clone(), |e| e.check_fit(&half).is_ok());
    assert!(apart, "a discrete GPU: each side fits its own budget");
    tight.host_memory_devices = vec!["CUDA0".into()];
    let why = super::harness::with_engine(land, tight, |e| e.check_fit(&half).err());
    let why = why.expect("one memory: pruned together").why;
    assert!(why.contains("on CPU and CUDA0 together"), "{why}");
}

/// A 70B-class model (about 38 GiB) on a host alone with 24 GiB of RAM: llama.cpp runs it from
/// its mapping, paging the weights the RAM cannot hold, so the run measures it (plain kernels:
/// repacked weights are a copy in RAM and do not fit) and says it pages, where before nothing fit.
/// A budget the user gave (`--mem-budget CPU=`) still counts every byte.
#[test]
fn a_model_larger_than_the_ram_pages_on_the_host_alone_within_a_budget_of_the_ram() {
    let land = gpus(0, 0);
    let mut s = settings(&land, 8);
    s.plan.workload.n_gen = 16;
    s.mem_budgets.0.push(profiles::DeviceBudget {
        device: "CPU".into(),
        bytes: 24 * GIB,
        given: false,
        same_gpu: Vec::new(),
    });
    let base = Candidate::llama_default(16, 0);
    assert!(!fits(&land, &s, &base), "larger than the RAM");
    let run = tune(land.clone(), s.clone(), None, Mode::Search);
    let win = run.winner.clone().expect("measured, paging");
    assert_eq!(
        win.kernels,
        search_space::KernelChoice::Plain,
        "{}",
        win.label()
    );
    let report = land.footprint(&win, s.plan.workload.n_ctx);
    let (need, budget) = crate::engine::placement::pages(&s, &report).expect("it pages");
    assert!(need > budget && budget == 24 * GIB, "{need} {budget}");
    // The defaults (repacked) were pruned on the RAM, their private copy named.
    let pruned = run.results.iter().find(|r| r.candidate == base).unwrap();
    assert!(pruned.over_budget, "{:?}", pruned.skipped);

    s.mem_budgets.0.last_mut().unwrap().given = true;
    let run = tune(land, s, None, Mode::Search);
    assert!(
        run.winner.is_none(),
        "a given budget counts the mapped weights too"
    );
}
