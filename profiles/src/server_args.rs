//! The llama-server command line a `Candidate` stands for, and shell quoting for showing it.
//!
//! The server is always started with an argv (never through a shell), so `server_args` is the single
//! source of truth; `shell_quote` only renders it for a human to copy.

use crate::workload::Workload;
use search_space::Candidate;
use std::path::Path;

pub use search_space::ServerOption;

/// The options `c` stands for, in the order they are passed: the model and the workload's context,
/// then each knob's ([`search_space::knob::server_options`], the knob table). The one list both
/// the argv and the exported formats are made from, so they cannot drift apart.
///
/// Every knob llama-server takes a value for is passed explicitly, including the ones equal to
/// llama.cpp's defaults: defaults change between llama.cpp releases (`-ngl` became `auto`, `-fa`
/// became `auto`), and a profile must mean the configuration that was measured. Knobs passed in
/// the environment are [`server_env`]'s.
pub fn server_options(c: &Candidate, model: &Path, w: &Workload) -> Vec<ServerOption> {
    let mut opts = vec![
        ServerOption::with_value("-m", "model", model.to_string_lossy()),
        ServerOption::with_value("-c", "ctx-size", w.n_ctx),
        // The slots measured, each with its share of -c and a KV cache of its own (the worker's
        // contexts are not unified): without -np, llama-server picks its slots itself (4 now,
        // sharing one unified pool) and sizes them from -c (llama.cpp #28849).
        ServerOption::with_value("-np", "parallel", w.n_parallel.max(1)),
        ServerOption::flag("-no-kvu", "no-kv-unified"),
    ];
    opts.extend(search_space::knob::server_options(c));
    opts
}

/// Whether `o` is an option a profile written before the server's own choices were pinned lacked
/// ([`server_options`]' `-np 1` and `-no-kvu`, [`crate::Profile::server_options`]' `--spec-type
/// none`): such a profile's `server_args` are read as the same configuration, pinned.
pub(crate) fn pinned_since_v1(o: &ServerOption, n_parallel: u32) -> bool {
    match o.short {
        "-np" => n_parallel <= 1,
        "-no-kvu" => true,
        "--spec-type" => o.value.as_deref() == Some(NO_SPECULATION),
        _ => false,
    }
}

/// The options by which a profile pins what llama-server would otherwise decide itself (its slots,
/// their shared cache, its speculation: defaults that move between builds), each with whether it
/// takes a value. `apply` says where the server's own default differs.
pub const SERVER_CHOICES: [(&str, bool); 3] =
    [("-np", true), ("-no-kvu", false), ("--spec-type", true)];

/// `--spec-type`'s value where the profile does not speculate: llama.cpp is making n-gram
/// speculation the server's default (#28391); what was measured did not speculate.
pub const NO_SPECULATION: &str = "none";

/// The environment variables llama-server needs for `c` beside its argv (the knobs llama.cpp reads
/// from the environment, those at their default left out), as `NAME=VALUE` pairs.
pub fn server_env(c: &Candidate) -> Vec<(String, String)> {
    (search_space::knob::environment_set(c).into_iter())
        .map(|(name, v)| (name.to_string(), v))
        .collect()
}

/// llama-server's arguments (without the program name) for `c` on `model` with the workload's context:
/// `-m PATH -c N_CTX [-np N] -t T -tb T -b B -ub UB -ctk K -ctv V -fa on|off|auto -ngl N [--no-repack]
/// [-lm none | --no-host] [-nkvo] [--no-op-offload] [--device A,B] [-ts A,B] [-sm row] [--numa distribute|isolate]`.
pub fn server_args(c: &Candidate, model: &Path, w: &Workload) -> Vec<String> {
    words(server_options(c, model, w))
}

/// Options as argv words: each flag followed by its value.
pub(crate) fn words(options: Vec<ServerOption>) -> Vec<String> {
    options
        .into_iter()
        .flat_map(|o| std::iter::once(o.short.to_string()).chain(o.value))
        .collect()
}

/// llama-server's speculative-decoding options for a draft model (the names of llama.cpp's
/// `common/arg.cpp`; the older `--draft-max`/`--draft-min` were removed there):
/// `-md PATH --spec-type draft-simple --spec-draft-n-max N --spec-draft-n-min N --spec-draft-p-min P
/// -ngld N -ctkd K -ctvd V [-devd A,B]`.
pub fn draft_options(d: &crate::DraftSettings) -> Vec<ServerOption> {
    let opt = |short, long, value: String| ServerOption {
        short,
        long,
        value: Some(value),
    };
    let mut opts = vec![
        opt(
            "-md",
            "spec-draft-model",
            d.path.to_string_lossy().into_owned(),
        ),
        opt("--spec-type", "spec-type", "draft-simple".into()),
        opt(
            "--spec-draft-n-max",
            "spec-draft-n-max",
            d.n_max.to_string(),
        ),
        opt(
            "--spec-draft-n-min",
            "spec-draft-n-min",
            d.n_min.to_string(),
        ),
        opt("--spec-draft-p-min", "spec-draft-p-min", d.p_min_arg()),
        opt("-ngld", "spec-draft-ngl", d.n_gpu_layers.to_string()),
        opt("-ctkd", "spec-draft-type-k", d.type_k.as_str().into()),
        opt("-ctvd", "spec-draft-type-v", d.type_v.as_str().into()),
    ];
    if !d.devices.is_empty() {
        opts.push(opt("-devd", "spec-draft-device", d.devices.join(",")));
    }
    opts
}

/// `args` as one POSIX shell line, each word quoted only where it needs to be. For display only.
pub fn shell_quote<S: AsRef<str>>(args: &[S]) -> String {
    args.iter()
        .map(|a| quote_word(a.as_ref()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn quote_word(word: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "_-+=:,./@%".contains(c);
    if !word.is_empty() && word.chars().all(safe) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use search_space::{CacheType, FlashAttn, HostBuffer, KernelChoice};

    fn workload() -> Workload {
        Workload {
            n_ctx: 4096,
            n_prompt: 512,
            n_gen: 128,
            depth: 0,
            n_parallel: 1,
            name: "chat".into(),
        }
    }

    #[test]
    fn defaults_are_spelled_out() {
        let c = Candidate::llama_default(8, 0);
        let args = server_args(&c, Path::new("/m/model.gguf"), &workload());
        assert_eq!(
            shell_quote(&args),
            "-m /m/model.gguf -c 4096 -np 1 -no-kvu -t 8 -tb 8 -b 2048 -ub 512 -ctk f16 -ctv f16 -fa auto -ngl 0"
        );
    }

    #[test]
    fn parallel_slots_follow_the_context() {
        let c = Candidate::llama_default(8, 0);
        let w = Workload {
            n_parallel: 4,
            ..workload()
        };
        let args = server_args(&c, Path::new("m.gguf"), &w);
        assert_eq!(args[..6], ["-m", "m.gguf", "-c", "4096", "-np", "4"]);
    }

    #[test]
    fn plain_kernels_and_devices_add_flags() {
        let mut c = Candidate::llama_default(4, 99);
        c.kernels = KernelChoice::Plain;
        c.devices = vec!["CUDA0".into(), "CUDA1".into()];
        c.type_k = CacheType::Q8_0;
        c.type_v = CacheType::Q8_0;
        c.flash_attn = FlashAttn::On;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert_eq!(
            &args[args.len() - 3..],
            ["--no-repack", "--device", "CUDA0,CUDA1"]
        );
        assert!(args.windows(2).any(|w| w == ["-fa", "on"]));
        assert!(args.windows(2).any(|w| w == ["-ctv", "q8_0"]));
    }

    #[test]
    fn host_ffns_and_a_kv_pair_apart_reach_the_server() {
        let mut c = Candidate::llama_default(4, 33);
        c.n_cpu_ffn = 14;
        c.type_k = CacheType::Q8_0;
        c.type_v = CacheType::Q4_0;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert!(
            args.windows(2).any(|w| w == ["--n-cpu-ffn", "14"]),
            "{args:?}"
        );
        assert!(args.windows(2).any(|w| w == ["-ctk", "q8_0"]));
        assert!(args.windows(2).any(|w| w == ["-ctv", "q4_0"]));
        assert_eq!(
            c.label(),
            "ngl=33 cpu-ffn=14 t=4 b=2048/512 kv=q8_0/q4_0 fa=auto repack"
        );
        c.n_cpu_ffn = 0;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert!(!args.iter().any(|a| a == "--n-cpu-ffn"), "{args:?}");
    }

    #[test]
    fn a_host_buffer_adds_llama_servers_flag_for_it() {
        let mut c = Candidate::llama_default(4, 20);
        let mapped = server_args(&c, Path::new("m.gguf"), &workload());
        assert!(
            !mapped.iter().any(|a| a == "-lm" || a == "--no-host"),
            "{mapped:?}"
        );
        c.host_buffer = HostBuffer::Pinned;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert_eq!(&args[args.len() - 2..], ["-lm", "none"]);
        c.host_buffer = HostBuffer::Cpu;
        let options = server_options(&c, Path::new("m.gguf"), &workload());
        let last = options.last().unwrap();
        assert_eq!(
            (last.short, last.long, &last.value),
            ("--no-host", "no-host", &None)
        );
    }

    #[test]
    fn a_numa_strategy_adds_its_flag() {
        let mut c = Candidate::llama_default(4, 0);
        let off = server_args(&c, Path::new("m.gguf"), &workload());
        assert!(!off.iter().any(|a| a == "--numa"), "{off:?}");
        c.numa = search_space::Numa::Isolate;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert_eq!(&args[args.len() - 2..], ["--numa", "isolate"]);
    }

    #[test]
    fn op_and_kv_offload_off_add_their_flags() {
        let mut c = Candidate::llama_default(4, 10);
        c.op_offload = search_space::OpOffload::Off;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert_eq!(args.last().map(String::as_str), Some("--no-op-offload"));
        let on = server_args(
            &Candidate::llama_default(4, 10),
            Path::new("m.gguf"),
            &workload(),
        );
        assert!(!on.iter().any(|a| a.contains("op-offload")), "{on:?}");
        assert!(!on.iter().any(|a| a == "-nkvo"), "{on:?}");
        c.kv_offload = search_space::KvOffload::Off;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert_eq!(&args[args.len() - 2..], ["-nkvo", "--no-op-offload"]);
    }

    #[test]
    fn a_tensor_split_and_row_mode_add_flags() {
        let mut c = Candidate::llama_default(4, 99);
        c.tensor_split = vec![67, 33];
        c.split_mode = search_space::SplitMode::Row;
        let args = server_args(&c, Path::new("m.gguf"), &workload());
        assert_eq!(&args[args.len() - 4..], ["-ts", "67,33", "-sm", "row"]);
    }

    #[test]
    fn quoting_survives_spaces_and_quotes() {
        assert_eq!(
            shell_quote(&["a b", "it's", "", "plain-1.gguf"]),
            r"'a b' 'it'\''s' '' plain-1.gguf"
        );
        assert_eq!(shell_quote(&["$(rm -rf /)"]), "'$(rm -rf /)'");
    }
}
