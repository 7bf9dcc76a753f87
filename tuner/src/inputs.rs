//! Checks of what the user named on the command line that clap cannot make: files that must be GGUF
//! models, thread counts this machine can run. Done before anything is measured, so a typo costs a
//! one-line error (exit 2 or 3), not a run that ends in a footnote.

use crate::exit::{self, Exit};
use search_space::gguf::GgufInfo;
use std::path::{Path, PathBuf};

/// What a flag accepts besides GGUF files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Also {
    /// Only GGUF files.
    Nothing,
    /// A folder too (searched for GGUF files, e.g. `--quants DIR`).
    Folders,
    /// The word `auto` too (`--draft auto`).
    Auto,
}

/// Every path given to `flag` must be a readable GGUF model (or what `also` allows): exit 3 otherwise,
/// naming the flag and the file.
pub fn model_files(flag: &str, paths: &[PathBuf], also: Also) -> anyhow::Result<()> {
    for p in paths {
        if also == Also::Auto && p.as_os_str() == "auto" {
            continue;
        }
        if also == Also::Folders && p.is_dir() {
            continue;
        }
        check_model(flag, p)?;
    }
    Ok(())
}

fn check_model(flag: &str, p: &Path) -> anyhow::Result<()> {
    GgufInfo::inspect(p)
        .map(|_| ())
        .map_err(|e| Exit::new(exit::BAD_MODEL, format!("{flag} {}: {e}", p.display())))
}

/// Logical CPUs this process may run on (its affinity and cgroup quota, as the OS reports them).
pub fn logical_cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// A thread count must be at least 1 and at most this machine's logical CPUs: llama.cpp would start
/// more, and they would only wait for each other (exit 2).
pub fn threads(flag: &str, values: &[u32], cpus: u32) -> anyhow::Result<()> {
    for &t in values {
        if t == 0 {
            return Err(Exit::new(exit::USAGE, format!("{flag} must be at least 1")));
        }
        if t > cpus {
            return Err(Exit::new(
                exit::USAGE,
                format!(
                    "{flag} {t}: this machine has {cpus} logical CPUs; more threads than CPUs only wait for each other"
                ),
            ));
        }
    }
    Ok(())
}

/// A file written at the end of a run (`-o`, `--export-markdown`): its folder must exist and be
/// writable before anything is measured, so a typo costs a one-line error (exit 2), not a finished
/// run whose result cannot be written.
pub fn output_file(flag: &str, path: Option<&Path>) -> anyhow::Result<()> {
    let Some(p) = path else {
        return Ok(());
    };
    let bad = |why: String| {
        Err(Exit::new(
            exit::USAGE,
            format!("{flag} {}: {why}", p.display()),
        ))
    };
    if p.is_dir() {
        return bad("is a folder; name a file in it".into());
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return bad(format!(
            "the folder {} does not exist; create it first",
            dir.display()
        ));
    }
    if !writable(dir) {
        return bad(format!("the folder {} is not writable", dir.display()));
    }
    Ok(())
}

/// Whether this process may create files in `dir` (access(2) with W_OK).
fn writable(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path; access only reads it.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: anyhow::Result<()>) -> i32 {
        r.unwrap_err().downcast_ref::<Exit>().unwrap().code
    }

    #[test]
    fn thread_counts_beyond_the_cpus_are_usage_errors() {
        assert!(threads("--threads", &[1, 2], 2).is_ok());
        assert_eq!(code(threads("--threads", &[1, 1000], 2)), exit::USAGE);
        assert_eq!(code(threads("--threads", &[0], 2)), exit::USAGE);
        let msg = threads("-t", &[3], 2).unwrap_err().to_string();
        assert!(
            msg.contains("-t 3") && msg.contains("2 logical CPUs"),
            "{msg}"
        );
    }

    #[test]
    fn named_files_must_be_gguf_models() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("passwd");
        std::fs::write(&text, "root:x:0:0:root:/root:/bin/bash\n").unwrap();
        let missing = dir.path().join("nonexistent.gguf");
        assert_eq!(
            code(model_files(
                "--draft",
                std::slice::from_ref(&text),
                Also::Auto
            )),
            exit::BAD_MODEL
        );
        assert_eq!(
            code(model_files("--quants", &[missing], Also::Folders)),
            exit::BAD_MODEL
        );
        // A folder is a folder of quantizations for --quants, and not a model for --draft.
        assert!(model_files("--quants", &[dir.path().to_path_buf()], Also::Folders).is_ok());
        assert_eq!(
            code(model_files(
                "--draft",
                &[dir.path().to_path_buf()],
                Also::Auto
            )),
            exit::BAD_MODEL
        );
        assert!(model_files("--draft", &["auto".into()], Also::Auto).is_ok());
        let msg = model_files("--draft", &[text], Also::Auto)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("--draft ") && msg.contains("passwd"),
            "{msg}"
        );
    }

    #[test]
    fn an_output_file_needs_an_existing_writable_folder() {
        let dir = std::env::temp_dir();
        let file = dir.join("autotune-output-file-check.toml");
        assert!(output_file("-o", None).is_ok());
        assert!(output_file("-o", Some(&file)).is_ok());
        assert!(output_file("-o", Some(Path::new("profile.toml"))).is_ok());
        let missing = dir.join("autotune-no-such-folder").join("p.toml");
        let r = output_file("-o", Some(&missing));
        let msg = r.as_ref().unwrap_err().to_string();
        assert!(
            msg.starts_with("-o ") && msg.contains("does not exist"),
            "{msg}"
        );
        assert_eq!(code(r), exit::USAGE);
        let msg = output_file("--export-markdown", Some(&dir))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("is a folder"), "{msg}");
    }
}
