//! Multi-token prediction (llama-server's `--spec-type draft-mtp`): a model that carries its own
//! next-token heads (GGUF tensors `blk.N.nextn.*`, as llama.cpp loads them) can draft without a
//! second model. Only such a model is measured ([`super::mtp_search`]: the draft lengths in
//! ascending order, through the worker's [`super::mtp_serve`] loop, against the same baseline and
//! output check as the other kinds); any other is reported as having no MTP heads.

pub use crate::worker::protocol::MtpParams;
use search_space::gguf::GgufInfo;
use serde::Serialize;

/// The name the MTP entry carries (llama-server's `--spec-type`).
pub const DRAFT_MTP: &str = "draft-mtp";

/// The draft lengths tried by default: llama-server's default (3) and around it.
pub const DEFAULT_N_MAX: [u32; 4] = [1, 2, 3, 4];

/// Its settings in words, for a line that already names the entry (`draft-mtp`), as n-gram's do.
pub fn label(p: MtpParams) -> String {
    format!("n_max {}", p.n_max)
}

/// Its settings with its name, for a progress message that stands alone.
pub fn progress_label(p: MtpParams) -> String {
    format!("{} {}", DRAFT_MTP, label(p))
}

/// What the report says about MTP for the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MtpStatus {
    /// Blocks that carry next-token-prediction tensors (0: no MTP heads).
    pub heads: u32,
    /// One sentence for the report.
    pub note: String,
}

/// The blocks with `nextn` tensors.
pub fn heads(info: &GgufInfo) -> u32 {
    let mut blocks: Vec<&str> = info
        .tensors
        .iter()
        .filter(|t| t.name.contains(".nextn."))
        .filter_map(|t| t.name.split('.').nth(1))
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks.len() as u32
}

/// What the report says before any measurement: `measured` when the heads' entry is in the search.
pub fn assess(info: &GgufInfo, measured: bool) -> MtpStatus {
    let n = heads(info);
    let note = if n == 0 {
        "no MTP heads (no blk.N.nextn tensors): draft-mtp not measured".to_string()
    } else if measured {
        format!("{n} MTP head(s): draft-mtp measured (see its entry)")
    } else {
        format!("{n} MTP head(s): draft-mtp not measured (no draft lengths to try)")
    };
    MtpStatus { heads: n, note }
}

#[cfg(test)]
mod tests {
    use super::*;
    use search_space::testfiles::{ggml, GgufBuilder};
    use std::path::Path;

    fn info(bytes: Vec<u8>) -> GgufInfo {
        GgufInfo::from_reader(&bytes[..], bytes.len() as u64, Path::new("m.gguf")).unwrap()
    }

    #[test]
    fn a_model_without_nextn_tensors_has_no_mtp_heads() {
        let plain = info(GgufBuilder::tiny_model("llama").build());
        let s = assess(&plain, false);
        assert_eq!(s.heads, 0);
        assert!(s.note.starts_with("no MTP heads"), "{}", s.note);
        let mtp = info(
            GgufBuilder::tiny_model("llama")
                .tensor("blk.2.nextn.eh_proj.weight", ggml::F32, &[8, 8])
                .tensor("blk.2.nextn.enorm.weight", ggml::F32, &[8])
                .build(),
        );
        assert_eq!(heads(&mtp), 1);
        assert!(assess(&mtp, true).note.contains("draft-mtp measured"));
        assert!(assess(&mtp, false).note.contains("no draft lengths"));
        assert_eq!(label(MtpParams { n_max: 3 }), "n_max 3");
        assert_eq!(progress_label(MtpParams { n_max: 3 }), "draft-mtp n_max 3");
    }
}
