//! Renders a profile for the tools people run llama.cpp with: a shell line, a llama-server
//! `--models-preset` INI section, a llama-swap `models:` entry, an Ollama Modelfile, or JSON.
//!
//! One function per format. All of them are made from `server_options` (the same list as the profile's
//! `server_args`), so an export cannot say something the profile does not.

use crate::error::{ProfileError, Result};
use crate::profile::Profile;
use crate::server_args::shell_quote;
use search_space::{CacheType, Candidate, FlashAttn, HostBuffer, KernelChoice};
use std::fmt;
use std::fmt::Write as _;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExportFormat {
    /// `llama-server` and its arguments on one shell line.
    Args,
    /// An INI section for llama-server's router (`llama-server --models-preset FILE`).
    Presets,
    /// A `models:` entry for llama-swap's config.yaml.
    LlamaSwap,
    /// An Ollama Modelfile (with comments for what Ollama cannot express).
    Ollama,
    /// The whole profile as JSON.
    Json,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 5] = [
        ExportFormat::Args,
        ExportFormat::Presets,
        ExportFormat::LlamaSwap,
        ExportFormat::Ollama,
        ExportFormat::Json,
    ];

    /// Whether one file of this format can hold several profiles (a runner serving several models).
    pub fn takes_several(self) -> bool {
        matches!(
            self,
            ExportFormat::Presets | ExportFormat::LlamaSwap | ExportFormat::Json
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExportFormat::Args => "args",
            ExportFormat::Presets => "presets",
            ExportFormat::LlamaSwap => "llama-swap",
            ExportFormat::Ollama => "ollama",
            ExportFormat::Json => "json",
        }
    }
}

impl fmt::Display for ExportFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown export format '{0}' (expected one of: args, presets, llama-swap, ollama, json)")]
pub struct UnknownExportFormat(pub String);

impl FromStr for ExportFormat {
    type Err = UnknownExportFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "args" | "shell" | "cmd" => Ok(ExportFormat::Args),
            "presets" | "preset" | "ini" | "models-preset" => Ok(ExportFormat::Presets),
            "llama-swap" | "llamaswap" | "llama_swap" => Ok(ExportFormat::LlamaSwap),
            "ollama" | "modelfile" => Ok(ExportFormat::Ollama),
            "json" => Ok(ExportFormat::Json),
            _ => Err(UnknownExportFormat(s.to_string())),
        }
    }
}

/// The profile in format `f`, ending in a newline. Expects a validated profile.
pub fn export(p: &Profile, f: ExportFormat) -> Result<String> {
    match f {
        ExportFormat::Args => Ok(export_args(p)),
        ExportFormat::Presets => Ok(export_presets(p)),
        ExportFormat::LlamaSwap => Ok(export_llama_swap(p)),
        ExportFormat::Ollama => Ok(export_ollama(p)),
        ExportFormat::Json => export_json(p),
    }
}

/// Several profiles in one file of format `f`, for a runner that serves several models: llama-server's
/// router (presets), llama-swap, or a JSON array. One profile gives what [`export`] gives. Formats that
/// hold one profile (args, ollama) refuse several.
pub fn export_many(ps: &[&Profile], f: ExportFormat) -> Result<String> {
    match ps {
        [] => Err(ProfileError::invalid("export", "names no profile")),
        [p] => export(p, f),
        _ if !f.takes_several() => Err(ProfileError::OneProfileOnly {
            format: f.as_str(),
            count: ps.len(),
        }),
        _ => match f {
            ExportFormat::Presets => Ok(presets(ps)),
            ExportFormat::LlamaSwap => Ok(llama_swap(ps)),
            _ => {
                let mut s =
                    serde_json::to_string_pretty(ps).map_err(|e| ProfileError::Serialize {
                        message: e.to_string(),
                    })?;
                s.push('\n');
                Ok(s)
            }
        },
    }
}

fn options(p: &Profile) -> Vec<crate::server_args::ServerOption> {
    p.server_options()
}

fn origin(p: &Profile) -> String {
    format!(
        "autotune profile for {} on {} (llama.cpp {}): {:.1} t/s prompt, {:.1} t/s generation",
        p.model.file_name, p.machine.hostname, p.llama.version, p.figures.pp_tps, p.figures.tg_tps
    )
}

/// `llama-server -m ... -ngl N` on one line.
pub fn export_args(p: &Profile) -> String {
    let mut argv = vec!["llama-server".to_string()];
    argv.extend(p.server_args.iter().cloned());
    format!("{}\n", shell_quote(&argv))
}

/// A section for `llama-server --models-preset FILE`. Keys are llama-server's long option names without
/// dashes; the file has no quoting, and `;` or `#` start a comment anywhere in a value.
pub fn export_presets(p: &Profile) -> String {
    presets(&[p])
}

/// One `--models-preset` file for llama-server's router, a section per profile. Several models get
/// `--models-max 1` in the advice: each profile was measured with the machine to itself, and the
/// router keeps up to 4 models loaded at once unless told otherwise.
fn presets(ps: &[&Profile]) -> String {
    let mut out = String::new();
    let several = ps.len() > 1;
    if !several {
        let _ = writeln!(out, "; {}", origin(ps[0]));
    }
    if several {
        let _ = writeln!(
            out,
            "; use with: llama-server --models-preset FILE --models-max 1\n\
             ; (each profile was measured with the machine to itself: one model loaded at a time)"
        );
    } else {
        let _ = writeln!(out, "; use with: llama-server --models-preset FILE");
    }
    let _ = writeln!(out, "version = 1");
    for (p, name) in ps.iter().zip(section_names(ps)) {
        let model = p.model.path.to_string_lossy();
        let _ = writeln!(out);
        if several {
            let _ = writeln!(out, "; {}", origin(p));
        }
        if model.contains([';', '#']) {
            let _ = writeln!(
                out,
                "; autotune: the model path contains ';' or '#', which this file format reads as a comment: \
                 rename the file or pass -m on the command line"
            );
        }
        let _ = writeln!(out, "[{name}]");
        for o in options(p) {
            let _ = writeln!(out, "{} = {}", o.long, o.value.as_deref().unwrap_or("true"));
        }
    }
    out
}

/// A llama-swap `models:` entry; llama-swap fills in `${PORT}` and splits `cmd` like a shell.
pub fn export_llama_swap(p: &Profile) -> String {
    llama_swap(&[p])
}

/// A llama-swap config's `models:` map, an entry per profile. llama-swap runs one model at a time
/// unless its config groups them, which is how the profiles were measured.
fn llama_swap(ps: &[&Profile]) -> String {
    let mut out = String::new();
    let several = ps.len() > 1;
    if !several {
        let _ = writeln!(out, "# {}", origin(ps[0]));
    }
    let _ = writeln!(out, "models:");
    for (p, name) in ps.iter().zip(section_names(ps)) {
        if several {
            let _ = writeln!(out, "  # {}", origin(p));
        }
        // ${PORT} stays unquoted for llama-swap to substitute it; the rest is quoted where needed.
        let _ = writeln!(
            out,
            "  \"{name}\":\n    cmd: |\n      llama-server --port ${{PORT}} {}",
            shell_quote(&p.server_args)
        );
    }
    out
}

/// The profiles' names in a file of several: each model's stem, with `-2`, `-3`, … after a stem that
/// came before (the same file name in two folders).
fn section_names(ps: &[&Profile]) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(ps.len());
    for p in ps {
        let stem = p.model_stem();
        let mut name = stem.clone();
        let mut n = 1;
        while names.contains(&name) {
            n += 1;
            name = format!("{stem}-{n}");
        }
        names.push(name);
    }
    names
}

/// An Ollama Modelfile. Ollama takes context, threads, batch and GPU layers per model; the KV cache type
/// and flash attention are server-wide environment variables there, and the rest cannot be set: those
/// are written as `# autotune:` comments so nothing measured is silently dropped.
pub fn export_ollama(p: &Profile) -> String {
    let c = &p.winner;
    let mut out = String::new();
    let _ = writeln!(out, "# {}", origin(p));
    let model = p.model.path.to_string_lossy();
    if model.contains(char::is_whitespace) {
        let _ = writeln!(out, "FROM \"{model}\"");
    } else {
        let _ = writeln!(out, "FROM {model}");
    }
    // Ollama's num_ctx is one request's; it allocates that for each of OLLAMA_NUM_PARALLEL.
    let np = p.workload.n_parallel.max(1);
    let _ = writeln!(out, "PARAMETER num_ctx {}", p.workload.n_ctx / np);
    let _ = writeln!(out, "PARAMETER num_thread {}", c.threads);
    let _ = writeln!(out, "PARAMETER num_batch {}", c.n_batch);
    let _ = writeln!(out, "PARAMETER num_gpu {}", c.n_gpu_layers);

    if np > 1 {
        let _ = writeln!(
            out,
            "# autotune: {np} requests at once (llama.cpp -np {np}): set OLLAMA_NUM_PARALLEL={np} for the Ollama server"
        );
    }
    ollama_server_notes(c, &mut out);
    ollama_speculation_notes(p, &mut out);
    out
}

/// The `# autotune:` lines for what Ollama sets server-wide or not at all: KV cache type, flash
/// attention, ubatch, prompt threads, kernels, devices and tensor split.
fn ollama_server_notes(c: &Candidate, out: &mut String) {
    ollama_environment_notes(c, out);
    ollama_unsupported_notes(c, out);
}

/// What Ollama sets server-wide, by environment variable: the KV cache type and flash attention.
fn ollama_environment_notes(c: &Candidate, out: &mut String) {
    let ollama_kv = [CacheType::F16, CacheType::Q8_0, CacheType::Q4_0];
    if c.type_k == c.type_v && ollama_kv.contains(&c.type_k) {
        let _ = writeln!(
            out,
            "# autotune: KV cache {}: set OLLAMA_KV_CACHE_TYPE={} for the Ollama server",
            c.type_k, c.type_k
        );
    } else {
        let _ = writeln!(
            out,
            "# autotune: KV cache K={} V={}: Ollama has one OLLAMA_KV_CACHE_TYPE for K and V (f16, q8_0 or q4_0) \
             and cannot express this",
            c.type_k, c.type_v
        );
    }
    match c.flash_attn {
        FlashAttn::On => {
            let _ = writeln!(out, "# autotune: flash attention on: set OLLAMA_FLASH_ATTENTION=1 for the Ollama server");
        }
        FlashAttn::Off => {
            let _ = writeln!(out, "# autotune: flash attention off: set OLLAMA_FLASH_ATTENTION=0 for the Ollama server");
        }
        FlashAttn::Auto => {
            let _ = writeln!(
                out,
                "# autotune: flash attention auto: leave OLLAMA_FLASH_ATTENTION unset"
            );
        }
    }
}

/// What Ollama cannot set at all: micro-batch, prompt threads, kernels, offload switches, NUMA, devices
/// and tensor split.
fn ollama_unsupported_notes(c: &Candidate, out: &mut String) {
    let _ = writeln!(
        out,
        "# autotune: ubatch {} (llama.cpp -ub): Ollama cannot set this",
        c.n_ubatch
    );
    if let Some(tb) = c.threads_batch {
        let _ = writeln!(
            out,
            "# autotune: {tb} prompt-processing threads (llama.cpp -tb): Ollama uses num_thread for both"
        );
    }
    if c.kernels == KernelChoice::Plain {
        let _ = writeln!(
            out,
            "# autotune: --no-repack (plain CPU kernels): Ollama cannot set this"
        );
    }
    match c.host_buffer {
        HostBuffer::Mapped => {}
        HostBuffer::Pinned => {
            let _ = writeln!(
                out,
                "# autotune: --load-mode none (host weights in the GPU's pinned memory): Ollama cannot set this"
            );
        }
        HostBuffer::Cpu => {
            let _ = writeln!(
                out,
                "# autotune: --no-host (host weights in the CPU's repacked buffers): Ollama cannot set this"
            );
        }
    }
    if !c.kv_offload.is_on() {
        let _ = writeln!(
            out,
            "# autotune: -nkvo (the KV cache in host memory): Ollama cannot set this"
        );
    }
    if !c.op_offload.is_on() {
        let _ = writeln!(
            out,
            "# autotune: --no-op-offload (host layers' prompt batches stay on the CPU): Ollama cannot set this"
        );
    }
    if !c.numa.is_off() {
        let _ = writeln!(
            out,
            "# autotune: --numa {}: Ollama cannot set this (it chooses its NUMA mode itself)",
            c.numa
        );
    }
    if !c.devices.is_empty() {
        let _ = writeln!(
            out,
            "# autotune: devices {}: Ollama picks GPUs itself (limit them with CUDA_VISIBLE_DEVICES or similar)",
            c.devices.join(",")
        );
    }
    if !c.tensor_split.is_empty() {
        let parts: Vec<String> = c.tensor_split.iter().map(|v| v.to_string()).collect();
        let _ = writeln!(
            out,
            "# autotune: tensor split {} (llama.cpp -ts): Ollama splits by free memory itself",
            parts.join(",")
        );
    }
}

/// The `# autotune:` lines for a measured draft model, n-gram or MTP speculation: Ollama runs none.
fn ollama_speculation_notes(p: &Profile, out: &mut String) {
    if let Some(d) = &p.draft {
        let _ = writeln!(
            out,
            "# autotune: draft model {} (speculative decoding, {:.1} vs {:.1} t/s): Ollama cannot run a draft model",
            d.file_name, d.tg_tps, d.baseline_tg_tps
        );
    }
    if let Some(n) = &p.ngram {
        let _ = writeln!(
            out,
            "# autotune: n-gram speculation {} (size n {}, m {}; {:.1} vs {:.1} t/s): Ollama cannot speculate",
            n.spec_type, n.size_n, n.size_m, n.tg_tps, n.baseline_tg_tps
        );
    }
    if let Some(m) = &p.mtp {
        let _ = writeln!(
            out,
            "# autotune: MTP speculation {} (n_max {}; {:.1} vs {:.1} t/s): Ollama cannot speculate",
            crate::DRAFT_MTP, m.n_max, m.tg_tps, m.baseline_tg_tps
        );
    }
}

/// The whole profile as pretty JSON.
pub fn export_json(p: &Profile) -> Result<String> {
    let mut s = serde_json::to_string_pretty(p).map_err(|e| ProfileError::Serialize {
        message: e.to_string(),
    })?;
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example_profile;

    fn cpu_only() -> Profile {
        let mut p = example_profile();
        p.model.path = "/home/me/My Models/tiny it's.gguf".into();
        p.model.file_name = "tiny it's.gguf".into();
        p.winner = search_space::Candidate::llama_default(6, 0);
        p.winner.type_k = CacheType::Q8_0;
        p.refresh_server_args();
        p.validate(false).unwrap();
        p
    }

    #[test]
    fn args_snapshot() {
        insta::assert_snapshot!(
            "args",
            export(&example_profile(), ExportFormat::Args).unwrap()
        );
        insta::assert_snapshot!(
            "args_quoted",
            export(&cpu_only(), ExportFormat::Args).unwrap()
        );
    }

    #[test]
    fn presets_snapshot() {
        insta::assert_snapshot!(
            "presets",
            export(&example_profile(), ExportFormat::Presets).unwrap()
        );
    }

    #[test]
    fn presets_warn_about_comment_characters_in_the_path() {
        let mut p = example_profile();
        p.model.path = "/models/a;b.gguf".into();
        p.refresh_server_args();
        assert!(export_presets(&p).contains("; autotune: the model path contains ';' or '#'"));
        assert!(!export_presets(&example_profile()).contains("autotune:"));
    }

    #[test]
    fn llama_swap_snapshot() {
        insta::assert_snapshot!(
            "llama_swap",
            export(&example_profile(), ExportFormat::LlamaSwap).unwrap()
        );
        insta::assert_snapshot!(
            "llama_swap_quoted",
            export(&cpu_only(), ExportFormat::LlamaSwap).unwrap()
        );
    }

    #[test]
    fn ollama_snapshot() {
        insta::assert_snapshot!(
            "ollama",
            export(&example_profile(), ExportFormat::Ollama).unwrap()
        );
        insta::assert_snapshot!(
            "ollama_cpu",
            export(&cpu_only(), ExportFormat::Ollama).unwrap()
        );
    }

    #[test]
    fn a_numa_strategy_reaches_every_format() {
        let mut p = example_profile();
        p.winner.numa = search_space::Numa::Distribute;
        p.refresh_server_args();
        p.validate(false).unwrap();
        let args = export(&p, ExportFormat::Args).unwrap();
        assert!(args.contains(" --numa distribute"), "{args}");
        let presets = export(&p, ExportFormat::Presets).unwrap();
        assert!(presets.contains("\nnuma = distribute\n"), "{presets}");
        let swap = export(&p, ExportFormat::LlamaSwap).unwrap();
        assert!(swap.contains("--numa distribute"), "{swap}");
        let ollama = export(&p, ExportFormat::Ollama).unwrap();
        assert!(
            ollama.contains("# autotune: --numa distribute: Ollama cannot"),
            "{ollama}"
        );
    }

    #[test]
    fn parallel_slots_reach_every_format() {
        let mut p = example_profile();
        p.workload.n_parallel = 4;
        p.refresh_server_args();
        p.validate(false).unwrap();
        let args = export(&p, ExportFormat::Args).unwrap();
        assert!(args.contains(" -c 8192 -np 4 "), "{args}");
        let presets = export(&p, ExportFormat::Presets).unwrap();
        assert!(presets.contains("\nparallel = 4\n"), "{presets}");
        let ollama = export(&p, ExportFormat::Ollama).unwrap();
        assert!(ollama.contains("PARAMETER num_ctx 2048\n"), "{ollama}");
        assert!(ollama.contains("OLLAMA_NUM_PARALLEL=4"), "{ollama}");
        let json = export(&p, ExportFormat::Json).unwrap();
        let back: Profile = serde_json::from_str(&json).unwrap();
        assert_eq!(back.workload.n_parallel, 4);
        // One request: no -np, and no n_parallel in the file (profiles written before it read the same).
        let one = export(&example_profile(), ExportFormat::Json).unwrap();
        assert!(
            !one.contains("n_parallel") && !one.contains("\"-np\""),
            "{one}"
        );
    }

    #[test]
    fn json_snapshot_and_round_trip() {
        let p = example_profile();
        let json = export(&p, ExportFormat::Json).unwrap();
        let back: Profile = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
        insta::assert_snapshot!("json", json);
    }

    /// The example profile for another model file (`name`, in `dir`), on the CPU.
    fn other(dir: &str, name: &str) -> Profile {
        let mut p = cpu_only();
        p.model.path = format!("{dir}/{name}").into();
        p.model.file_name = name.into();
        p.refresh_server_args();
        p
    }

    #[test]
    fn several_profiles_make_one_router_or_llama_swap_file() {
        let a = example_profile();
        let b = other("/models", "gemma-3-270m.gguf");
        let c = other("/elsewhere", "gemma-3-270m.gguf");
        let ps = [&a, &b, &c];
        let presets = export_many(&ps, ExportFormat::Presets).unwrap();
        insta::assert_snapshot!("presets_several", presets);
        assert_eq!(presets.matches("version = 1").count(), 1, "{presets}");
        assert!(presets.contains("--models-max 1"), "{presets}");
        let swap = export_many(&ps, ExportFormat::LlamaSwap).unwrap();
        insta::assert_snapshot!("llama_swap_several", swap);
        assert_eq!(swap.matches("models:").count(), 1, "{swap}");
        assert_eq!(swap.matches("${PORT}").count(), 3, "{swap}");

        let json = export_many(&ps, ExportFormat::Json).unwrap();
        let back: Vec<Profile> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, vec![a.clone(), b.clone(), c.clone()]);

        // One profile is what `export` writes; formats of one profile refuse several.
        for f in ExportFormat::ALL {
            assert_eq!(export_many(&[&a], f).unwrap(), export(&a, f).unwrap());
        }
        for f in [ExportFormat::Args, ExportFormat::Ollama] {
            let err = export_many(&ps, f).unwrap_err().to_string();
            assert!(
                err.contains(&format!("the {f} format holds one profile, not 3")),
                "{err}"
            );
        }
        assert!(export_many(&[], ExportFormat::Presets).is_err());
    }

    #[test]
    fn formats_round_trip_through_their_names() {
        for f in ExportFormat::ALL {
            assert_eq!(f.to_string().parse::<ExportFormat>().unwrap(), f);
        }
        assert_eq!(
            "Modelfile".parse::<ExportFormat>().unwrap(),
            ExportFormat::Ollama
        );
        let err = "yaml".parse::<ExportFormat>().unwrap_err();
        assert!(err.to_string().contains("llama-swap"), "{err}");
    }
}
