//! Multi-token prediction (llama-server's `--spec-type draft-mtp`): a model that carries its own
//! next-token heads (GGUF tensors `blk.N.nextn.*`, as llama.cpp loads them) can draft without a
//! second model. Only such a model can be measured; any other is reported as having no MTP heads.
//! Measuring `draft-mtp` itself (llama-cpp-2's `MtpSpeculative`) is not built yet: a model with heads
//! is reported as such, not measured.

use search_space::gguf::GgufInfo;
use serde::Serialize;

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

pub fn assess(info: &GgufInfo) -> MtpStatus {
    let n = heads(info);
    let note = if n == 0 {
        "no MTP heads (no blk.N.nextn tensors): draft-mtp not measured".to_string()
    } else {
        format!(
            "{n} MTP head(s): draft-mtp could draft {n} token(s) per round, but autotune does not measure it yet"
        )
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
        let s = assess(&plain);
        assert_eq!(s.heads, 0);
        assert!(s.note.starts_with("no MTP heads"), "{}", s.note);
        let mtp = info(
            GgufBuilder::tiny_model("llama")
                .tensor("blk.2.nextn.eh_proj.weight", ggml::F32, &[8, 8])
                .tensor("blk.2.nextn.enorm.weight", ggml::F32, &[8])
                .build(),
        );
        assert_eq!(heads(&mtp), 1);
    }
}
