//! A fixed, valid profile for tests (here and in other crates, with the `test-support` feature): every
//! timestamp and fingerprint is constant so snapshots of it are stable.

use crate::profile::{
    DeviceRef, Figures, Judged, LeaderboardEntry, LlamaBuild, MachineRef, ModelRef, Profile,
    VersusDefaults, Workload, SCHEMA_VERSION,
};
use search_space::{CacheType, Candidate, FlashAttn, KernelChoice};

/// A profile for a small model on a one-GPU machine, with a baseline and a four-row leaderboard.
pub fn example_profile() -> Profile {
    let winner = winner();
    let figures = winner_figures();
    let baseline = baseline_figures();
    let mut profile = Profile {
        schema_version: SCHEMA_VERSION,
        created_unix: 1_760_000_000,
        autotune_version: "0.1.0".into(),
        server_args: Vec::new(),
        server_env: Default::default(),
        rpc: Vec::new(),
        notes: vec!["flash attention on is required for the q8_0 V cache".into()],
        model: ModelRef {
            path: "/models/Qwen3-4B-Q4_K_M.gguf".into(),
            file_name: "Qwen3-4B-Q4_K_M.gguf".into(),
            fingerprint: "3f2a".repeat(16),
            size_bytes: 2_497_280_256,
            architecture: "qwen3".into(),
            file_type: Some("Q4_K_M".into()),
        },
        machine: machine(),
        llama: LlamaBuild {
            version: "b6100".into(),
            commit: "0123abc".into(),
            backends: vec!["CPU".into(), "CUDA".into()],
            cpu_variant: Some("zen4".into()),
            system_info: "CUDA : ARCHS = 890 | CPU : AVX512 = 1 | REPACK = 1 |".into(),
        },
        workload: Workload {
            n_ctx: 8192,
            n_prompt: 512,
            n_gen: 128,
            depth: 4096,
            n_parallel: 1,
            name: "chat".into(),
        },
        winner: winner.clone(),
        figures: figures.clone(),
        baseline: Some(baseline.clone()),
        baseline_placement: None,
        versus_defaults: Some(VersusDefaults {
            verdict: Judged::Faster,
            ratio: 0.154,
            ci: [0.13, 0.18],
            noise: 0.02,
        }),
        roofline: None,
        draft: None,
        ngram: None,
        mtp: None,
        quality: None,
        quality_unreadable: None,
        budgets: Default::default(),
        hosts: Vec::new(),
        backends: Vec::new(),
        leaderboard: leaderboard(winner, figures, baseline),
    };
    profile.refresh_server_args();
    profile
}

/// The winner: every layer on the GPU, a q8_0 cache with flash attention.
fn winner() -> Candidate {
    Candidate {
        n_gpu_layers: 99,
        n_cpu_moe: 0,
        n_cpu_ffn: 0,
        devices: vec!["CUDA0".into()],
        tensor_split: Vec::new(),
        split_mode: Default::default(),
        kernels: KernelChoice::Plain,
        host_buffer: Default::default(),
        threads: 8,
        threads_batch: None,
        n_batch: 2048,
        n_ubatch: 1024,
        type_k: CacheType::Q8_0,
        type_v: CacheType::Q8_0,
        flash_attn: FlashAttn::On,
        op_offload: Default::default(),
        kv_offload: Default::default(),
        numa: Default::default(),
        ..Candidate::llama_default(8, 99)
    }
}

fn winner_figures() -> Figures {
    Figures {
        pp_tps: 4210.5,
        tg_tps: 118.25,
        pp_depth_tps: Some(3120.5),
        tg_depth_tps: Some(97.5),
        ttft_ms: Some(121.0),
        score_s: 1.625,
        mem_bytes: 3_221_225_472,
        pp_ci: Some([4180.0, 4240.0]),
        tg_ci: Some([117.5, 119.0]),
        repetitions: 5,
        estimated: Vec::new(),
    }
}

/// llama.cpp's defaults on the same machine.
fn baseline_figures() -> Figures {
    Figures {
        pp_tps: 3650.0,
        tg_tps: 104.0,
        pp_depth_tps: Some(2650.0),
        tg_depth_tps: Some(80.25),
        ttft_ms: Some(140.5),
        score_s: 1.875,
        mem_bytes: 3_758_096_384,
        pp_ci: Some([3600.0, 3700.0]),
        tg_ci: Some([103.0, 105.0]),
        repetitions: 5,
        estimated: Vec::new(),
    }
}

/// A one-GPU desktop: a 16-core Ryzen and an RTX 4090.
fn machine() -> MachineRef {
    MachineRef {
        fingerprint: "9b1c".repeat(16),
        hostname: "bench-01".into(),
        cpu: "AMD Ryzen 9 7950X 16-Core Processor".into(),
        physical_cores: 16,
        logical_cpus: 32,
        ram_bytes: 68_719_476_736,
        os: "linux".into(),
        numa_nodes: 1,
        devices: vec![
            DeviceRef {
                name: "CUDA0".into(),
                description: "NVIDIA GeForce RTX 4090".into(),
                kind: "gpu".into(),
                backend: "CUDA".into(),
                memory_total: 25_757_220_864,
            },
            DeviceRef {
                name: "CPU".into(),
                description: "AMD Ryzen 9 7950X 16-Core Processor".into(),
                kind: "cpu".into(),
                backend: "CPU".into(),
                memory_total: 68_719_476_736,
            },
        ],
        gpus: vec!["NVIDIA GeForce RTX 4090".into()],
    }
}

/// The winner, the baseline, one configuration that ran out of memory and one that was pruned.
fn leaderboard(winner: Candidate, figures: Figures, baseline: Figures) -> Vec<LeaderboardEntry> {
    let baseline_candidate = Candidate::llama_default(8, 99);
    let mut failed = winner.clone();
    failed.n_ubatch = 2048;
    let mut pruned = winner.clone();
    pruned.type_v = CacheType::Q4_0;
    pruned.flash_attn = FlashAttn::Off;
    vec![
        LeaderboardEntry {
            rank: 1,
            tie_with_previous: false,
            status: "ok".into(),
            did_not_fit: false,
            candidate: winner,
            figures: Some(figures),
            kv_kld: None,
        },
        LeaderboardEntry {
            rank: 2,
            tie_with_previous: false,
            status: "ok".into(),
            did_not_fit: false,
            candidate: baseline_candidate,
            figures: Some(baseline),
            kv_kld: None,
        },
        LeaderboardEntry {
            rank: 3,
            tie_with_previous: false,
            status: "failed: out of memory on CUDA0".into(),
            did_not_fit: true,
            candidate: failed,
            figures: None,
            kv_kld: None,
        },
        LeaderboardEntry {
            rank: 4,
            tie_with_previous: false,
            status: "pruned: a quantized V cache needs flash attention".into(),
            did_not_fit: false,
            candidate: pruned,
            figures: None,
            kv_kld: None,
        },
    ]
}
