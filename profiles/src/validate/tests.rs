//! The profile validation's tests.

use super::*;
use crate::example_profile;
use proptest::prelude::*;
use search_space::Knob;
use search_space::{
    AttnRot, CacheType, Candidate, FlashAttn, HostBuffer, KernelChoice, KvOffload, OpOffload,
};

fn invalid(p: &Profile) -> String {
    let err = p.validate(false).unwrap_err();
    assert!(matches!(err, ProfileError::Invalid { .. }), "{err:?}");
    err.to_string()
}

#[test]
fn the_example_is_valid() {
    example_profile().validate(false).unwrap();
}

#[test]
fn a_smuggled_flag_in_server_args_is_named() {
    let mut p = example_profile();
    p.server_args.push("--foo".into());
    let msg = invalid(&p);
    assert!(
        msg.contains("server_args do not match the winning configuration: unexpected '--foo'"),
        "{msg}"
    );

    let mut p = example_profile();
    let t = p.server_args.iter().position(|a| a == "-t").unwrap();
    p.server_args[t] = "-t; rm".into();
    let msg = invalid(&p);
    assert!(msg.contains("unexpected '-t; rm'"), "{msg}");

    let mut p = example_profile();
    p.server_args.truncate(4);
    assert!(invalid(&p).contains("missing '-np'"));
}

/// A profile written before llama-server's own choices were pinned (its slots, their KV pool,
/// speculation) has `server_args` without `-np 1 -no-kvu` and `--spec-type none`: it reads as the
/// same configuration, pinned; any other difference is still refused.
#[test]
fn a_profile_written_before_the_pins_reads_as_pinned() {
    let mut p = example_profile();
    assert_eq!(p.workload.n_parallel, 1);
    let mut unpinned = Vec::new();
    let mut words = p.server_args.iter().peekable();
    while let Some(w) = words.next() {
        match w.as_str() {
            "-np" | "--spec-type" => {
                words.next();
            }
            "-no-kvu" => {}
            _ => unpinned.push(w.clone()),
        }
    }
    assert_eq!(
        unpinned.len() + 5,
        p.server_args.len(),
        "{:?}",
        p.server_args
    );
    p.server_args = unpinned.clone();
    let (read, _) = Profile::from_toml(&p.to_toml().unwrap()).unwrap();
    assert_eq!(read.server_args, read.expected_server_args());
    read.validate(false).unwrap();
    let tail = &read.server_args[read.server_args.len() - 2..];
    assert_eq!(tail, ["--spec-type", "none"]);

    unpinned.push("--foo".into());
    p.server_args = unpinned;
    let (read, _) = Profile::from_toml(&p.to_toml().unwrap()).unwrap();
    assert!(invalid(&read).contains("unexpected '--foo'"));
}

#[test]
fn rpc_servers_reach_the_server_args_and_must_be_addresses() {
    let mut p = example_profile();
    p.rpc = vec!["127.0.0.1:50052".into(), "[::1]:50053".into()];
    p.refresh_server_args();
    p.validate(false).unwrap();
    let i = p.server_args.iter().position(|a| a == "--rpc").unwrap();
    assert_eq!(p.server_args[i + 1], "127.0.0.1:50052,[::1]:50053");
    for bad in [
        "--rpc",
        "host",
        "a,b:1",
        "h:0",
        "h:99999",
        "h:1 -ngl 0",
        "$(id):1",
    ] {
        p.rpc = vec![bad.into()];
        p.refresh_server_args();
        assert!(invalid(&p).contains("is not a host:port address"), "{bad}");
    }
}

#[test]
fn a_flag_as_a_device_name_is_refused() {
    let mut p = example_profile();
    p.winner.devices = vec!["--rpc".into()];
    p.refresh_server_args();
    let msg = invalid(&p);
    assert!(
        msg.contains("winner.devices[0] '--rpc' is not a device name"),
        "{msg}"
    );

    p.winner.devices = vec!["CUDA0,CUDA1".into()];
    p.refresh_server_args();
    assert!(invalid(&p).contains("is not a device name"));
}

#[test]
fn nul_and_line_breaks_are_refused_anywhere() {
    let mut p = example_profile();
    p.model.path = "/models/a\0.gguf".into();
    let msg = invalid(&p);
    assert!(msg.contains("model.path contains a NUL character"), "{msg}");

    let mut p = example_profile();
    p.machine.devices[1].description = "x\nLD_PRELOAD=evil.so".into();
    let msg = invalid(&p);
    assert!(
        msg.contains("machine.devices[1].description contains a line break"),
        "{msg}"
    );

    let mut p = example_profile();
    p.server_args[1] = "m.gguf\r".into();
    assert!(invalid(&p).contains("server_args[1] contains a carriage return"));
}

#[test]
fn numbers_out_of_range_are_refused() {
    type Edit = fn(&mut Profile);
    let cases: [(Edit, &str); 11] = [
        (
            |p| p.winner.threads = 0,
            "winner.threads must be between 1 and 1024 (found 0)",
        ),
        (
            |p| p.winner.threads_batch = Some(0),
            "winner.threads_batch must be between 1 and 1024 (found 0)",
        ),
        (
            |p| p.winner.threads = 5000,
            "winner.threads must be between 1 and 1024",
        ),
        (|p| p.winner.n_batch = 0, "winner.n_batch must be between 1"),
        (
            |p| p.winner.n_ubatch = (1 << 20) + 1,
            "winner.n_ubatch must be between 1 and 1048576",
        ),
        (
            |p| p.winner.n_ubatch = 4096,
            "winner.n_ubatch (4096) must not exceed n_batch (2048)",
        ),
        (
            |p| p.winner.n_gpu_layers = 10_001,
            "winner.n_gpu_layers must be between 0 and 10000",
        ),
        (|p| p.workload.n_ctx = 0, "workload.n_ctx must be between 1"),
        (
            |p| p.workload.n_parallel = 0,
            "workload.n_parallel must be between 1 and 256 (found 0)",
        ),
        (
            |p| p.workload.n_parallel = 257,
            "workload.n_parallel must be between 1 and 256",
        ),
        (
            |p| p.workload.n_ctx = (1 << 30) + 1,
            "workload.n_ctx must be between 1 and 1073741824",
        ),
    ];
    for (edit, expected) in cases {
        let mut p = example_profile();
        edit(&mut p);
        p.refresh_server_args();
        let msg = invalid(&p);
        assert!(msg.contains(expected), "{msg} (expected {expected})");
    }
}

/// A profile as read from its file: `p` written as TOML and parsed back, then validated.
fn read_back(p: &Profile) -> Result<()> {
    let (back, _) = Profile::from_toml(&p.to_toml().unwrap()).unwrap();
    back.validate(false)
}

#[test]
fn the_op_offload_threshold_is_held_to_its_knobs_bounds() {
    let bounds = knob::OpOffloadMinBatch.bounds().unwrap();
    for ok in [bounds.min, 64, bounds.max] {
        let mut p = example_profile();
        p.winner.op_offload_min_batch = Some(ok);
        p.refresh_server_args();
        read_back(&p).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for bad in [0, bounds.max + 1, u32::MAX] {
        let mut p = example_profile();
        p.winner.op_offload_min_batch = Some(bad);
        p.refresh_server_args();
        let err = read_back(&p).unwrap_err();
        assert!(matches!(err, ProfileError::Invalid { .. }), "{err:?}");
        let expected = format!(
            "winner.op_offload_min_batch must be between {} and {} (found {bad})",
            bounds.min, bounds.max
        );
        assert!(err.to_string().contains(&expected), "{err}");
    }
}

#[test]
fn candidate_rules_apply_too() {
    let mut p = example_profile();
    p.winner.flash_attn = FlashAttn::Off;
    p.refresh_server_args();
    assert!(invalid(&p).contains("needs flash attention"));
}

#[test]
fn fingerprints_and_paths_are_checked() {
    let mut p = example_profile();
    p.model.fingerprint = "abc".into();
    assert!(invalid(&p).contains("model.fingerprint must be 64 hex digits"));

    let mut p = example_profile();
    p.machine.fingerprint = "../../etc".into();
    assert!(invalid(&p).contains("machine.fingerprint contains '.'"));

    let mut p = example_profile();
    p.model.path = "-rf.gguf".into();
    p.refresh_server_args();
    assert!(invalid(&p).contains("starts with '-'"));

    let p = example_profile();
    p.validate(false).unwrap();
    let msg = invalid_with_paths(&p);
    assert!(msg.contains("does not exist"), "{msg}");

    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"GGUF").unwrap();
    let mut p = example_profile();
    p.model.path = model;
    p.refresh_server_args();
    p.validate(true).unwrap();
}

fn invalid_with_paths(p: &Profile) -> String {
    p.validate(true).unwrap_err().to_string()
}

#[test]
fn figures_must_be_finite() {
    let mut p = example_profile();
    p.figures.tg_tps = f64::NAN;
    assert!(invalid(&p).contains("figures.tg_tps must be a finite number"));
}

fn candidate() -> impl Strategy<Value = Candidate> {
    let cache = proptest::sample::select(CacheType::ALL.to_vec());
    let flash = proptest::sample::select(vec![FlashAttn::Off, FlashAttn::On, FlashAttn::Auto]);
    let kernels = proptest::sample::select(vec![KernelChoice::Repack, KernelChoice::Plain]);
    let host = proptest::sample::select(vec![
        HostBuffer::Mapped,
        HostBuffer::Pinned,
        HostBuffer::Cpu,
    ]);
    let device = "[A-Za-z][A-Za-z0-9_.:/-]{0,12}";
    (
        0..=MAX_GPU_LAYERS,
        proptest::collection::vec(device, 0..3),
        kernels,
        1..=MAX_THREADS,
        1..=MAX_BATCH,
        any::<u32>(),
        (cache.clone(), cache, flash, any::<bool>(), any::<bool>()),
        host,
    )
        .prop_map(
            |(
                ngl,
                devices,
                kernels,
                threads,
                n_batch,
                ub,
                (type_k, type_v, flash_attn, op, kv),
                host_buffer,
            )| {
                let flash_attn = if type_v.is_quantized() && flash_attn == FlashAttn::Off {
                    FlashAttn::On
                } else {
                    flash_attn
                };
                Candidate {
                    n_gpu_layers: ngl,
                    n_cpu_moe: 0,
                    n_cpu_ffn: ngl / 2,
                    devices,
                    tensor_split: Vec::new(),
                    split_mode: Default::default(),
                    kernels,
                    host_buffer,
                    threads,
                    threads_batch: None,
                    n_batch,
                    n_ubatch: 1 + ub % n_batch,
                    type_k,
                    type_v,
                    flash_attn,
                    op_offload: if op { OpOffload::On } else { OpOffload::Off },
                    kv_offload: if kv { KvOffload::On } else { KvOffload::Off },
                    numa: Default::default(),
                    // The environment knobs from the values drawn above.
                    op_offload_min_batch: (ub % 3 == 0).then_some(64 + ub % 1000),
                    attn_rot: if kv == op { AttnRot::On } else { AttnRot::Off },
                }
            },
        )
}

proptest! {
    #[test]
    fn any_valid_candidate_round_trips_and_validates(c in candidate(), n_ctx in 1..=MAX_CTX) {
        let mut p = example_profile();
        p.winner = c;
        p.workload.n_ctx = n_ctx;
        p.refresh_server_args();
        p.validate(false).unwrap();
        let (back, warnings) = Profile::from_toml(&p.to_toml().unwrap()).unwrap();
        prop_assert!(warnings.is_empty());
        back.validate(false).unwrap();
        prop_assert_eq!(back, p);
    }
}

fn words(s: &str) -> Vec<String> {
    s.split(' ').map(String::from).collect()
}

#[test]
fn mismatch_names_the_extra_the_missing_and_the_moved_word() {
    let exp = words("-m a -t 4");
    assert_eq!(
        describe_mismatch(&exp, &words("-m a -t 4 --foo")),
        "unexpected '--foo' (after '4')"
    );
    assert_eq!(
        describe_mismatch(&exp, &words("-m a -t; 4")),
        "unexpected '-t;' (after 'a')"
    );
    assert_eq!(
        describe_mismatch(&exp, &words("-m a 4")),
        "missing '-t' (after 'a')"
    );
    assert_eq!(
        describe_mismatch(&exp, &words("-t 4 -m a")),
        "'-t' where '-m' was expected (argument 1)"
    );
}

#[test]
fn device_names() {
    for ok in [
        "CUDA0",
        "Vulkan1",
        "Metal",
        "CPU",
        "RPC[10.0.0.2:50052]",
        "SYCL0",
        "BLAS",
    ] {
        assert!(is_device_name(ok), "{ok}");
    }
    for bad in ["", "--rpc", "-x", "CUDA0,CUDA1", "a b", "x;y", "$(id)"] {
        assert!(!is_device_name(bad), "{bad}");
    }
}
