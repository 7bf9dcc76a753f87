//! The commands the docs show still parse: every `autotune …` line of README.md's usage block, and of
//! every ```sh block in README.md and docs/*.md, is given to the real binary with `--help` added.
//! clap checks each flag's name and parses each value as it reads it, and stops at `--help` before
//! anything runs (no model file is opened, nothing is measured): an unknown or renamed flag, a value
//! that no longer parses (`--ctx maxx`, `--budget 15x`) or a subcommand that moved fails here.
//! What clap checks only after the whole line (required arguments, conflicts) is not checked.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary under test: `AUTOTUNE_BIN` (as scripts/test and the benches set it), else cargo's.
fn bin() -> PathBuf {
    std::env::var_os("AUTOTUNE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_autotune")))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// One command shown in a doc: where it is, and its words after `autotune`.
#[derive(Debug)]
struct Shown {
    at: String,
    args: Vec<String>,
}

/// The ```sh blocks of `text`, each as (the line number of its first line, its lines).
fn sh_blocks(text: &str) -> Vec<(usize, Vec<&str>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Vec<&str>)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        if let Some((_, lines)) = open.as_mut() {
            if fence {
                blocks.extend(open.take());
            } else {
                lines.push(line);
            }
        } else if fence && line.trim() == "```sh" {
            open = Some((i + 2, Vec::new()));
        }
    }
    blocks
}

/// A shell line's words up to the end of its first command (quotes grouped, a `#` comment dropped,
/// nothing from an unquoted `&`, `|`, `;` or redirection on): enough for the docs' commands.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for ch in line.chars() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                word.get_or_insert_with(String::new);
            }
            (None, '#') if word.is_none() => break,
            (None, '&' | '|' | ';' | '>' | '<') => break,
            (None, c) if c.is_whitespace() => out.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The `autotune …` commands of the ```sh blocks of `file` (relative to the repository root).
fn commands_in(file: &str) -> Vec<Shown> {
    let text = std::fs::read_to_string(repo_root().join(file)).expect("read the doc");
    let mut out = Vec::new();
    for (first, lines) in sh_blocks(&text) {
        for (k, line) in lines.iter().enumerate() {
            let w = words(line);
            if w.first().map(String::as_str) == Some("autotune") {
                out.push(Shown {
                    at: format!("{file}:{}", first + k),
                    args: w[1..].to_vec(),
                });
            }
        }
    }
    out
}

/// The subcommand whose help `args` must print: the first word, unless it is a model file (the short
/// form `autotune MODEL.gguf …` is `tune`). A misspelled subcommand would parse as a model and print
/// `tune`'s help; naming the word expected keeps it from passing.
fn subcommand_of(args: &[String]) -> &str {
    match args.first() {
        Some(a) if !a.ends_with(".gguf") && !a.starts_with('-') => a.as_str(),
        _ => "tune",
    }
}

/// Runs the shown command with `--help` (before a `--`, after which words are llama-server's) and
/// says what is wrong, if anything.
fn check(shown: &Shown) -> Option<String> {
    let mut args = shown.args.clone();
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    args.insert(end, "--help".into());
    let out = Command::new(bin())
        .args(&args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run autotune");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let usage = format!("Usage: autotune {}", subcommand_of(&shown.args));
    if out.status.success() && stdout.contains(&usage) {
        return None;
    }
    Some(format!(
        "{}: autotune {}\n  exit {:?}, expected {usage:?} on stdout; stderr: {}",
        shown.at,
        shown.args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

fn docs() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let dir = repo_root().join("docs");
    let mut md: Vec<String> = std::fs::read_dir(&dir)
        .expect("read docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    md.sort();
    files.extend(md);
    files
}

#[test]
fn the_readme_usage_block_is_found() {
    let text = std::fs::read_to_string(repo_root().join("README.md")).expect("read README.md");
    let after = text
        .split("\n## Usage\n")
        .nth(1)
        .expect("README.md has a ## Usage section");
    let (_, usage) = sh_blocks(after)
        .into_iter()
        .next()
        .expect("a ```sh block under ## Usage");
    let shown = usage
        .iter()
        .filter(|l| words(l).first().map(String::as_str) == Some("autotune"));
    // The usage block shows every subcommand; far fewer lines means the block was not found whole.
    assert!(
        shown.count() >= 20,
        "README.md's usage block: too few `autotune` lines"
    );
}

#[test]
fn every_command_the_docs_show_parses() {
    let shown: Vec<Shown> = docs().iter().flat_map(|f| commands_in(f)).collect();
    assert!(
        shown.len() >= 40,
        "only {} `autotune` lines found in the docs",
        shown.len()
    );
    let failures: Vec<String> = shown.iter().filter_map(check).collect();
    assert!(
        failures.is_empty(),
        "{} of {} commands shown in the docs do not parse:\n{}",
        failures.len(),
        shown.len(),
        failures.join("\n")
    );
}

#[test]
fn words_split_like_a_shell_line() {
    assert_eq!(
        words(r#"autotune m.gguf --rpc 'a:1' -- "x y"   # a comment"#),
        ["autotune", "m.gguf", "--rpc", "a:1", "--", "x y"]
    );
    assert_eq!(words("# only a comment"), Vec::<String>::new());
    assert_eq!(
        words("autotune rpc-serve --port 50052 &  # in the background"),
        ["autotune", "rpc-serve", "--port", "50052"]
    );
    assert_eq!(
        words("autotune show --json > p.json"),
        ["autotune", "show", "--json"]
    );
}
