//! Writes the broken-model corpus (`search_space::testfiles::broken_corpus`) into a folder, one
//! `NAME.gguf` per damaged file, plus the first part of a split model whose sibling parts are
//! missing, for the reliability script and for fuzzer seeds:
//!
//! `cargo run --release -p search-space --example write_broken_corpus -- DIR`
//!
//! Prints one line per file written: its name and the `GgufError` variant autotune must report.

use search_space::testfiles::{broken_corpus, GgufBuilder};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        eprintln!("usage: write_broken_corpus DIR");
        return ExitCode::from(2);
    };
    let dir = PathBuf::from(dir);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("write_broken_corpus: cannot create {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    let mut files: Vec<(String, Vec<u8>, &str)> = broken_corpus()
        .into_iter()
        .map(|b| (format!("{}.gguf", b.name), b.bytes, b.variant))
        .collect();
    // Part 1 of 3, named the way llama-gguf-split names parts, alone in the folder.
    files.push((
        "split-first-part-alone-00001-of-00003.gguf".into(),
        GgufBuilder::tiny_model("llama").split(0, 3, 3).build(),
        "MissingSplitParts",
    ));
    for (name, bytes, variant) in &files {
        let path = dir.join(name);
        if let Err(e) = std::fs::write(&path, bytes) {
            eprintln!("write_broken_corpus: cannot write {}: {e}", path.display());
            return ExitCode::from(1);
        }
        println!("{name} {variant}");
    }
    ExitCode::SUCCESS
}
