//! Whether a draft model can serve a target: the vocabulary check of llama.cpp's speculative decoding
//! (`common_speculative_are_compatible`), so a draft autotune accepts is one llama-server accepts.
//!
//! The rules: the same vocabulary type; the same BOS handling (add-BOS flag, and the BOS id when it is
//! added) and EOS handling; vocabulary sizes within [`SPEC_VOCAB_MAX_SIZE_DIFFERENCE`] tokens; and the
//! same text for every token from id [`SPEC_VOCAB_CHECK_START_TOKEN_ID`] on (the first ids are control
//! tokens that conversions number differently). Two tiers: [`precheck`] reads only GGUF headers (the
//! tokenizer and the vocabulary size, so a hopeless file never reaches llama.cpp), and [`check`] runs
//! the full rules on vocabularies llama.cpp loaded (`vocab_only`, in a worker).

pub use crate::worker::protocol::{Incompatibility, SPEC_VOCAB_MAX_SIZE_DIFFERENCE};
use search_space::gguf::GgufInfo;

/// llama.cpp's `SPEC_VOCAB_CHECK_START_TOKEN_ID`.
pub const SPEC_VOCAB_CHECK_START_TOKEN_ID: i32 = 5;

/// What the check reads from a vocabulary; implemented by a loaded llama.cpp model (and by test fakes).
pub trait Vocabulary {
    fn vocab_type(&self) -> u32;
    fn n_tokens(&self) -> i32;
    fn bos(&self) -> i32;
    fn eos(&self) -> i32;
    fn add_bos(&self) -> bool;
    fn add_eos(&self) -> bool;
    fn text(&self, id: i32) -> &[u8];
}

impl Vocabulary for crate::llama::Model {
    fn vocab_type(&self) -> u32 {
        crate::llama::Model::vocab_type(self)
    }
    fn n_tokens(&self) -> i32 {
        self.n_vocab()
    }
    fn bos(&self) -> i32 {
        crate::llama::Model::bos(self)
    }
    fn eos(&self) -> i32 {
        crate::llama::Model::eos(self)
    }
    fn add_bos(&self) -> bool {
        crate::llama::Model::add_bos(self)
    }
    fn add_eos(&self) -> bool {
        crate::llama::Model::add_eos(self)
    }
    fn text(&self, id: i32) -> &[u8] {
        self.token_text(id)
    }
}

/// llama.cpp's name of a vocabulary type number.
pub fn vocab_type_name(t: u32) -> String {
    match t {
        0 => "none".into(),
        1 => "SPM".into(),
        2 => "BPE".into(),
        3 => "WPM".into(),
        4 => "UGM".into(),
        5 => "RWKV".into(),
        6 => "PLaMo2".into(),
        n => format!("type {n}"),
    }
}

/// The header-only part of the check: the tokenizer model and the vocabulary size.
pub fn precheck(target: &GgufInfo, draft: &GgufInfo) -> Result<(), Incompatibility> {
    if let (Some(t), Some(d)) = (&target.tokenizer_model, &draft.tokenizer_model) {
        if t != d {
            return Err(Incompatibility::Tokenizer {
                target: t.clone(),
                draft: d.clone(),
            });
        }
    }
    let Some(d) = draft.vocab_size else {
        return Err(Incompatibility::NoVocabulary);
    };
    if let Some(t) = target.vocab_size {
        let difference = t.abs_diff(d);
        if difference > SPEC_VOCAB_MAX_SIZE_DIFFERENCE {
            return Err(Incompatibility::VocabSize {
                target: t,
                draft: d,
                difference,
            });
        }
    }
    Ok(())
}

/// The full check, in the order llama.cpp makes it.
pub fn check(target: &dyn Vocabulary, draft: &dyn Vocabulary) -> Result<(), Incompatibility> {
    if target.vocab_type() != draft.vocab_type() {
        return Err(Incompatibility::VocabType {
            target: vocab_type_name(target.vocab_type()),
            draft: vocab_type_name(draft.vocab_type()),
        });
    }
    if target.add_bos() != draft.add_bos() || (target.add_bos() && target.bos() != draft.bos()) {
        return Err(Incompatibility::Bos {
            target_add: target.add_bos(),
            target: target.bos(),
            draft_add: draft.add_bos(),
            draft: draft.bos(),
        });
    }
    if target.add_eos() != draft.add_eos() || (target.add_eos() && target.eos() != draft.eos()) {
        return Err(Incompatibility::Eos {
            target_add: target.add_eos(),
            target: target.eos(),
            draft_add: draft.add_eos(),
            draft: draft.eos(),
        });
    }
    let (nt, nd) = (target.n_tokens(), draft.n_tokens());
    let difference = u64::from(nt.abs_diff(nd));
    if difference > SPEC_VOCAB_MAX_SIZE_DIFFERENCE {
        return Err(Incompatibility::VocabSize {
            target: nt.max(0) as u64,
            draft: nd.max(0) as u64,
            difference,
        });
    }
    for id in SPEC_VOCAB_CHECK_START_TOKEN_ID..nt.min(nd) {
        let (a, b) = (target.text(id), draft.text(id));
        if a != b {
            let show = |s: &[u8]| {
                String::from_utf8_lossy(s)
                    .chars()
                    .take(40)
                    .collect::<String>()
            };
            return Err(Incompatibility::TokenText {
                id,
                target: show(a),
                draft: show(b),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Fake {
        kind: u32,
        bos: i32,
        eos: i32,
        add_bos: bool,
        add_eos: bool,
        texts: Vec<Vec<u8>>,
    }

    impl Vocabulary for Fake {
        fn vocab_type(&self) -> u32 {
            self.kind
        }
        fn n_tokens(&self) -> i32 {
            self.texts.len() as i32
        }
        fn bos(&self) -> i32 {
            self.bos
        }
        fn eos(&self) -> i32 {
            self.eos
        }
        fn add_bos(&self) -> bool {
            self.add_bos
        }
        fn add_eos(&self) -> bool {
            self.add_eos
        }
        fn text(&self, id: i32) -> &[u8] {
            &self.texts[id as usize]
        }
    }

    fn vocab(n: usize) -> Fake {
        Fake {
            kind: 1,
            bos: 2,
            eos: 1,
            add_bos: true,
            add_eos: false,
            texts: (0..n).map(|i| format!("tok{i}").into_bytes()).collect(),
        }
    }

    #[test]
    fn same_vocabulary_is_compatible() {
        assert_eq!(check(&vocab(300), &vocab(300)), Ok(()));
    }

    #[test]
    fn a_few_extra_tokens_are_allowed_but_not_many() {
        assert_eq!(check(&vocab(300), &vocab(300 + 128)), Ok(()));
        let e = check(&vocab(300), &vocab(300 + 129)).unwrap_err();
        assert_eq!(
            e,
            Incompatibility::VocabSize {
                target: 300,
                draft: 429,
                difference: 129
            }
        );
        assert!(e.to_string().contains("differ by 129 tokens"), "{e}");
    }

    #[test]
    fn token_texts_count_from_id_5() {
        let mut d = vocab(300);
        d.texts[4] = b"<other control>".to_vec();
        assert_eq!(
            check(&vocab(300), &d),
            Ok(()),
            "ids below 5 are not compared"
        );
        d.texts[17] = b"hello".to_vec();
        let e = check(&vocab(300), &d).unwrap_err();
        assert!(
            matches!(e, Incompatibility::TokenText { id: 17, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("token 17 differs"), "{e}");
    }

    #[test]
    fn type_bos_and_eos_must_agree() {
        let t = vocab(50);
        let d = Fake {
            kind: 2,
            ..t.clone()
        };
        assert!(matches!(
            check(&t, &d),
            Err(Incompatibility::VocabType { .. })
        ));
        let d = Fake {
            bos: 7,
            ..t.clone()
        };
        assert!(matches!(check(&t, &d), Err(Incompatibility::Bos { .. })));
        let d = Fake {
            add_bos: false,
            ..t.clone()
        };
        assert!(matches!(check(&t, &d), Err(Incompatibility::Bos { .. })));
        // EOS ids only matter when EOS is added, as in llama.cpp.
        let d = Fake {
            eos: 9,
            ..t.clone()
        };
        assert_eq!(check(&t, &d), Ok(()));
        let (t2, d2) = (
            Fake {
                add_eos: true,
                ..t.clone()
            },
            Fake {
                add_eos: true,
                eos: 9,
                ..t.clone()
            },
        );
        assert!(matches!(check(&t2, &d2), Err(Incompatibility::Eos { .. })));
    }
}
