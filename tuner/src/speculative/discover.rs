//! Candidate drafts found beside a target: smaller GGUF files in the same folder (a quantization
//! ladder, or a family's small sibling) whose headers say the vocabulary could match. The full
//! vocabulary check ([`super::compat::check`]) still runs on each before anything is measured.

use super::compat;
use search_space::gguf::GgufInfo;
use std::path::{Path, PathBuf};

/// At most `limit` files beside `target`, smaller than it and with a compatible-looking vocabulary,
/// smallest first (a draft pays by being fast).
pub fn beside(target: &Path, target_info: &GgufInfo, limit: usize) -> Vec<PathBuf> {
    let Some(dir) = target.parent() else {
        return Vec::new();
    };
    let target_real = std::fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    let mut seen: Vec<PathBuf> = vec![target_real];
    for e in entries.flatten() {
        let path = e.path();
        if path
            .extension()
            .is_none_or(|x| !x.eq_ignore_ascii_case("gguf"))
        {
            continue;
        }
        // A symlink in a ladder folder points at a file that may also be there under its own name.
        let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.contains(&real) {
            continue;
        }
        let Ok(info) = GgufInfo::inspect(&path) else {
            continue;
        };
        if info.file_size >= target_info.file_size || compat::precheck(target_info, &info).is_err()
        {
            continue;
        }
        seen.push(real);
        found.push((info.file_size, path));
    }
    found.sort();
    found.into_iter().take(limit).map(|(_, p)| p).collect()
}
