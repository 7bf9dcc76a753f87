//! The exporters' tests: a snapshot of each format, the knobs passed in the environment in each,
//! Ollama's notes made from the knob table, files of several profiles, and the format names.

use super::*;
use crate::example_profile;
use search_space::{AttnRot, CacheType};

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
    let presets = |p: &Profile| export(p, ExportFormat::Presets).unwrap();
    assert!(presets(&p).contains("; autotune: the model path contains ';' or '#'"));
    assert!(!presets(&example_profile()).contains("autotune:"));
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
        ollama.contains("# autotune: NUMA distribute (llama.cpp --numa distribute): Ollama cannot"),
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
    // One request: -np 1 pinned in the argv, and no n_parallel in the file (profiles written
    // before it read the same).
    let one = export(&example_profile(), ExportFormat::Json).unwrap();
    assert!(!one.contains("n_parallel"), "{one}");
    assert!(one.contains("\"-np\",\n    \"1\""), "{one}");
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
    for &f in ExportFormat::all() {
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
fn formats_round_trip_through_their_names_and_aliases() {
    for &f in ExportFormat::all() {
        assert_eq!(ExportFormat::from_str(&f.to_string(), false), Ok(f));
    }
    let by = |s: &str| ExportFormat::from_str(s, true);
    assert_eq!(by("Modelfile"), Ok(ExportFormat::Ollama));
    assert_eq!(by("shell"), Ok(ExportFormat::Args));
    assert_eq!(by("models-preset"), Ok(ExportFormat::Presets));
    assert_eq!(by("llamaswap"), Ok(ExportFormat::LlamaSwap));
    assert!(by("yaml").is_err());
    assert_eq!(
        ExportFormat::several_names(),
        "presets, llama-swap and json"
    );
}

/// `--help` says which formats take several profiles: each format's doc says "several" exactly
/// when its exporter takes several, so the help cannot drift from what `export_many` accepts.
#[test]
fn the_help_says_which_formats_take_several() {
    for &f in ExportFormat::all() {
        let v = f.to_possible_value().unwrap();
        let help = v.get_help().map(ToString::to_string).unwrap_or_default();
        assert_eq!(help.contains("several"), f.takes_several(), "{f}: {help}");
    }
}

/// The example profile with both knobs passed in the environment moved from llama.cpp's
/// defaults: a higher op-offload threshold and the quantized cache's rotation off.
fn with_env() -> Profile {
    let mut p = example_profile();
    p.winner.op_offload_min_batch = Some(128);
    p.winner.attn_rot = AttnRot::Off;
    p.refresh_server_args();
    p.validate(false).unwrap();
    p
}

#[test]
fn environment_knobs_reach_every_format() {
    let p = with_env();
    assert_eq!(p.server_env.len(), 2, "{:?}", p.server_env);
    let args = export(&p, ExportFormat::Args).unwrap();
    insta::assert_snapshot!("args_env", args);
    let presets = export(&p, ExportFormat::Presets).unwrap();
    insta::assert_snapshot!("presets_env", presets);
    // A key llama-server does not know makes it refuse the whole file.
    let keys = presets.lines().filter(|l| !l.starts_with(';'));
    assert!(
        !keys
            .into_iter()
            .any(|l| l.contains("GGML_") || l.contains("LLAMA_")),
        "{presets}"
    );
    insta::assert_snapshot!(
        "llama_swap_env",
        export(&p, ExportFormat::LlamaSwap).unwrap()
    );
    insta::assert_snapshot!("ollama_env", export(&p, ExportFormat::Ollama).unwrap());
    let json = export(&p, ExportFormat::Json).unwrap();
    let back: Profile = serde_json::from_str(&json).unwrap();
    assert_eq!(back.server_env, p.server_env);
}

#[test]
fn a_router_file_starts_the_router_with_the_environment_its_models_share() {
    let a = with_env();
    let mut b = with_env();
    b.model.path = "/models/gemma-3-270m.gguf".into();
    b.model.file_name = "gemma-3-270m.gguf".into();
    b.refresh_server_args();
    let same = export_many(&[&a, &b], ExportFormat::Presets).unwrap();
    assert!(
        same.contains(
            "; use with: GGML_OP_OFFLOAD_MIN_BATCH=128 LLAMA_ATTN_ROT_DISABLE=1 llama-server \
             --models-preset FILE --models-max 1\n"
        ),
        "{same}"
    );
    assert!(!same.contains("this model was measured with"), "{same}");

    // Models that need different environments cannot share one router: the one that needs some says so.
    let c = other("/models", "tiny.gguf");
    let apart = export_many(&[&a, &c], ExportFormat::Presets).unwrap();
    assert!(
        apart.contains("; use with: llama-server --models-preset FILE --models-max 1\n"),
        "{apart}"
    );
    let note = "; autotune: this model was measured with GGML_OP_OFFLOAD_MIN_BATCH=128 \
                LLAMA_ATTN_ROT_DISABLE=1 in llama-server's environment, which a preset cannot set";
    assert_eq!(apart.matches(note).count(), 1, "{apart}");
    let before_a = &apart[..apart.find("[Qwen3-4B-Q4_K_M]").unwrap()];
    assert!(before_a.contains(note), "{apart}");

    // llama-swap sets an environment for each model's command.
    let swap = export_many(&[&a, &c], ExportFormat::LlamaSwap).unwrap();
    assert_eq!(swap.matches("    env:\n").count(), 1, "{swap}");
    assert!(
        swap.contains("    env:\n      - \"GGML_OP_OFFLOAD_MIN_BATCH=128\"\n      - \"LLAMA_ATTN_ROT_DISABLE=1\"\n"),
        "{swap}"
    );
}

/// Every knob of the table at a value other than llama.cpp's default reaches the Modelfile: as
/// Ollama's own setting (or a line of its own) for the six it takes, as an `# autotune:` note
/// naming the knob, its value and llama.cpp's flag or variable for every other (a knob added to
/// the table included).
#[test]
fn every_knob_ollama_does_not_take_gets_a_note() {
    let taken = [
        "threads",
        "micro-batch",
        "batch",
        "GPU layers",
        "KV cache",
        "flash attention",
    ];
    let mut noted = 0;
    for k in search_space::KNOBS.iter() {
        let choices = k.choices();
        let values = if choices.is_empty() {
            vec!["7"]
        } else {
            choices
        };
        for v in values {
            let mut c = search_space::knob::llama_defaults(4, 0);
            if k.set(&mut c, v).is_err() || k.is_default(&c) {
                continue;
            }
            let mut p = example_profile();
            p.winner = c.clone();
            p.refresh_server_args();
            let text = export(&p, ExportFormat::Ollama).unwrap();
            let note = format!("\n# autotune: {} {} (", k.name(), k.value(&c));
            // A knob Ollama takes may have a line of its own (the batch does), never a second.
            let lines = text.matches(&note).count();
            let want = if taken.contains(&k.name()) {
                0..=1
            } else {
                1..=1
            };
            assert!(want.contains(&lines), "{}={v}:\n{text}", k.name());
            noted += usize::from(!taken.contains(&k.name()));
        }
    }
    assert!(noted >= 13, "only {noted} notes");
}
