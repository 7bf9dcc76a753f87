//! Bad input gets one clear line on stderr, a documented exit code, no panic, and no profile.

mod common;
use common::*;

fn assert_clean_failure(sb: &Sandbox, o: &std::process::Output, code: i32, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "panic: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "'{needle}' in: {err}");
    assert!(sb.stored_profiles().is_empty(), "no profile written");
}

#[test]
fn missing_path() {
    let sb = Sandbox::new();
    let o = sb.run(&["/nonexistent/model.gguf"]);
    assert_clean_failure(&sb, &o, 3, "/nonexistent/model.gguf");
}

#[test]
fn directory() {
    let sb = Sandbox::new();
    let d = sb.dir.path().to_str().unwrap().to_string();
    let o = sb.run(&[&d]);
    assert_clean_failure(&sb, &o, 3, "director");
}

#[test]
fn text_file() {
    let sb = Sandbox::new();
    let f = sb.dir.path().join("notes.gguf");
    std::fs::write(&f, "just some text, not a model\n").unwrap();
    let o = sb.run(&[f.to_str().unwrap()]);
    assert_clean_failure(&sb, &o, 3, "not a GGUF file");
}

#[test]
fn out_of_range_flags_are_usage_errors() {
    let sb = Sandbox::new();
    let model = demo_model();
    let m = model.to_str().unwrap();
    for (args, needle) in [
        (vec![m, "--threads", "0"], "threads"),
        (vec![m, "-tb", "0"], "--threads-batch must be at least 1"),
        (vec![m, "--threads-batch", "100000"], "logical CPUs"),
        (vec![m, "--ctx", "0"], "ctx"),
        (
            vec![m, "--ctx", "2000000000"],
            "--ctx 2000000000 must be between 1 and 1073741824 tokens",
        ),
        (vec![m, "--ctx", "most"], "or max (the most that fits)"),
        (
            vec![m, "--parallel", "0"],
            "--parallel 0 must be between 1 and 256",
        ),
        (
            vec![m, "-np", "300"],
            "--parallel 300 must be between 1 and 256",
        ),
        (
            vec![m, "-np", "8", "-c", "1024", "-p", "512"],
            "does not fit in each of --parallel 8 slots' 256 tokens of --ctx 1024",
        ),
        (
            vec!["draft", m, "--draft", m, "-np", "0"],
            "--parallel 0 must be between 1",
        ),
        (
            vec!["draft", m, "--draft", m, "-np", "32", "-c", "4096"],
            "--ctx 4096 leaves each of --parallel 32 slots under 256 tokens",
        ),
        (
            vec!["measure", m, "-np", "0"],
            "--parallel 0 must be between 1",
        ),
        (vec![m, "--budget", "-5m"], "budget"),
        (vec![m, "--cache-types", "q3_x"], "cache type"),
        (
            vec![m, "--max-kv-kld", "-0.1"],
            "--max-kv-kld -0.1: give a mean KL divergence of 0 or more",
        ),
        (vec![m, "--max-kv-kld", "NaN"], "--max-kv-kld NaN"),
        (
            vec!["measure", m, "--n-cpu-ffn", "40"],
            "--n-cpu-ffn 40: the model has 18 layers; give at most 18",
        ),
        (vec![m, "--max-kv-kld", "lots"], "invalid value 'lots'"),
        (
            vec![m, "--backend", "cuda"],
            "--backend cuda: no GPU of this machine is driven by it",
        ),
        (
            vec![m, "--max-kv-kld", "0.1", "--no-quality-gate"],
            "cannot be used with",
        ),
    ] {
        let o = sb.run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(sb.stored_profiles().is_empty());
}
