//! Tests of the GGUF inspector: a valid file read back, one crafted input per error, a real model when
//! one is cached, and properties over random and damaged bytes (no panic, ever).

use super::*;
use crate::testfiles::{broken_corpus, ggml, patch_u64, value_type, GgufBuilder};
use proptest::prelude::*;
use std::io::Cursor;

fn read(bytes: &[u8]) -> Result<GgufInfo, GgufError> {
    GgufInfo::from_reader(Cursor::new(bytes), bytes.len() as u64, Path::new("m.gguf"))
}

fn variant(e: &GgufError) -> String {
    format!("{e:?}")
        .split([' ', '{', '('])
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn valid_file_reads_back() {
    let bytes = GgufBuilder::tiny_model("llama").build();
    let info = read(&bytes).unwrap();
    assert_eq!(info.version, 3);
    assert_eq!(info.file_size, bytes.len() as u64);
    assert_eq!(info.architecture, "llama");
    assert_eq!(info.name.as_deref(), Some("tiny test model"));
    assert_eq!(info.file_type, Some(15));
    assert_eq!(info.file_type_name.as_deref(), Some("Q4_K_M"));
    assert_eq!(info.block_count, Some(2));
    assert_eq!(info.context_length, Some(2048));
    assert_eq!(info.embedding_length, Some(256));
    assert_eq!((info.head_count, info.head_count_kv), (Some(4), Some(2)));
    assert_eq!((info.expert_count, info.expert_used_count), (None, None));
    assert!(!info.is_moe());
    assert_eq!(info.vocab_size, Some(4));
    assert_eq!(info.tokenizer_model.as_deref(), Some("llama"));
    assert_eq!(info.split, None);
    assert_eq!(info.tensor_count, 4);
    let names: Vec<_> = info
        .tensors
        .iter()
        .map(|t| (t.name.as_str(), t.type_name.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("token_embd.weight", "q8_0"),
            ("blk.0.attn_q.weight", "q4_K"),
            ("blk.0.attn_norm.weight", "f32"),
            ("output_norm.weight", "f32")
        ]
    );
    let bytes_each: Vec<u64> = info.tensors.iter().map(|t| t.bytes).collect();
    assert_eq!(bytes_each, [8 * 34 * 4, 256 * 144, 1024, 1024]);
    assert_eq!(info.tensors[1].offset, 1088);
    assert_eq!(info.tensors[1].dims, [256, 256]);
    assert_eq!(info.parameter_count, 1024 + 65536 + 256 + 256);
    assert_eq!(info.tensor_bytes, bytes_each.iter().sum::<u64>());
    let json = serde_json::to_string(&info).unwrap();
    assert_eq!(serde_json::from_str::<GgufInfo>(&json).unwrap(), info);
}

#[test]
fn inspect_reads_a_file_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    GgufBuilder::tiny_model("qwen2").write_to(&path).unwrap();
    let info = GgufInfo::inspect(&path).unwrap();
    assert_eq!(info.path, path);
    assert_eq!(info.architecture, "qwen2");
    assert_eq!(info.block_count, Some(2));
}

#[test]
fn integers_of_any_fitting_type_are_accepted() {
    let info = read(
        &GgufBuilder::new("llama")
            .kv_u8("llama.block_count", 32)
            .kv_i64("llama.context_length", 131_072)
            .kv_u64("llama.embedding_length", 4096)
            .kv_raw("llama.expert_count", value_type::I32, &8i32.to_le_bytes())
            .kv_u16("llama.expert_used_count", 2)
            .kv_array_u32("llama.attention.head_count_kv", &[0, 8, 8, 4])
            .build(),
    )
    .unwrap();
    assert_eq!(info.block_count, Some(32));
    assert_eq!(info.context_length, Some(131_072));
    assert_eq!(info.embedding_length, Some(4096));
    assert_eq!(
        (info.expert_count, info.expert_used_count),
        (Some(8), Some(2))
    );
    assert!(info.is_moe());
    assert_eq!(info.head_count_kv, Some(8), "the largest per-layer count");
}

#[test]
fn integers_that_do_not_fit_are_wrong_types() {
    for b in [
        GgufBuilder::new("llama").kv_i32("llama.block_count", -1),
        GgufBuilder::new("llama").kv_u64("llama.block_count", 1 << 32),
        GgufBuilder::new("llama").kv_f32("llama.block_count", 32.0),
        GgufBuilder::new("llama").kv_bool("llama.block_count", true),
        GgufBuilder::new("llama").kv_array_u32("llama.block_count", &[1]),
    ] {
        let e = read(&b.build()).unwrap_err();
        assert!(
            matches!(&e, GgufError::WrongType { key, .. } if key == "llama.block_count"),
            "{e:?}"
        );
    }
}

#[test]
fn wrong_type_names_key_expected_and_found() {
    let e = read(
        &GgufBuilder::new("llama")
            .kv_str("llama.block_count", "32")
            .build(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "m.gguf: metadata key 'llama.block_count' should be an unsigned integer that fits in 32 bits but \
         is a string; the file was written by a broken converter, convert the model again"
    );
    let e = read(
        &GgufBuilder::new("llama")
            .kv_u32("tokenizer.ggml.tokens", 3)
            .build(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::WrongType {
                expected: "an array of strings",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn every_broken_file_gives_its_error() {
    for f in broken_corpus() {
        let e = read(&f.bytes).expect_err(f.name);
        assert_eq!(variant(&e), f.variant, "{}: {e}", f.name);
        assert_eq!(e.kind(), f.kind, "{}", f.name);
        assert!(e.to_string().starts_with("m.gguf: "), "{}: {e}", f.name);
        assert_eq!(e.path(), Path::new("m.gguf"));
    }
}

#[test]
fn messages_name_the_file_and_what_it_is() {
    let e = read(b"PK\x03\x04rest").unwrap_err();
    assert_eq!(
        e.to_string(),
        "m.gguf: not a GGUF file (starts with \"PK\\x03\\x04\"); it looks like a zip archive: extract the \
         .gguf file from it"
    );
    let e = read(b"hello world").unwrap_err();
    assert!(
        e.to_string()
            .contains("(starts with \"hell\"); it looks like a text file"),
        "{e}"
    );
    let e = read(&GgufBuilder::tiny_model("not-a-real-arch").build()).unwrap_err();
    assert!(
        matches!(&e, GgufError::UnsupportedArchitecture { arch, .. } if arch == "not-a-real-arch")
    );
    assert!(
        e.to_string()
            .starts_with("m.gguf: architecture 'not-a-real-arch' is not supported"),
        "{e}"
    );
}

#[test]
fn every_prefix_of_a_valid_file_is_truncated() {
    let bytes = GgufBuilder::tiny_model("llama").build();
    let info = read(&bytes).unwrap();
    let last = info.tensors.last().unwrap();
    let data_start = bytes.len() - (last.offset + last.bytes) as usize;
    for len in 1..bytes.len() {
        let e = read(&bytes[..len]).unwrap_err();
        assert!(matches!(e, GgufError::Truncated { .. }), "at {len}: {e:?}");
        // A reader that ends in the header before the size it was given is truncated too (the data
        // itself is never read, so there only the size counts).
        if len + 32 <= data_start {
            let e = GgufInfo::from_reader(&bytes[..len], bytes.len() as u64, Path::new("m.gguf"))
                .unwrap_err();
            assert!(
                matches!(e, GgufError::Truncated { .. }),
                "reader ending at {len}: {e:?}"
            );
        }
    }
    assert!(matches!(read(&[]), Err(GgufError::Empty { .. })));
}

#[test]
fn truncation_says_what_and_where() {
    let bytes = GgufBuilder::new("llama")
        .tensor("t", ggml::F32, &[8])
        .build();
    let e = read(&bytes[..bytes.len() - 1]).unwrap_err();
    let GgufError::Truncated { what, offset, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(what, "the 32 bytes of data of tensor 't'");
    assert_eq!(*offset, bytes.len() as u64 - 32);
    let e = read(&bytes[..40]).unwrap_err();
    assert!(
        e.to_string()
            .contains("reading the key of metadata key number 1 (at byte 32)"),
        "{e}"
    );
    let e = read(&bytes[..30]).unwrap_err();
    assert!(
        e.to_string()
            .contains("reading the metadata (1 key-value pairs declared) (at byte 24)"),
        "{e}"
    );
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let mut bytes = GgufBuilder::new("llama").build();
    patch_u64(&mut bytes, 8, 2_000_000);
    let e = read(&bytes).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::AbsurdCount {
                count: 2_000_000,
                limit: MAX_TENSOR_COUNT,
                ..
            }
        ),
        "{e:?}"
    );
    let array = [
        &value_type::U8.to_le_bytes()[..],
        &(MAX_ARRAY_COUNT + 1).to_le_bytes(),
    ]
    .concat();
    let e = read(
        &GgufBuilder::new("llama")
            .kv_raw("x", value_type::ARRAY, &array)
            .build(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::AbsurdCount {
                limit: MAX_ARRAY_COUNT,
                ..
            }
        ),
        "{e:?}"
    );
    // An array that is allowed but longer than the file is truncated, not read element by element.
    let array = [
        &value_type::STRING.to_le_bytes()[..],
        &40_000_000u64.to_le_bytes(),
    ]
    .concat();
    let e = read(
        &GgufBuilder::new("llama")
            .kv_raw("x", value_type::ARRAY, &array)
            .build(),
    )
    .unwrap_err();
    assert!(matches!(e, GgufError::Truncated { .. }), "{e:?}");
}

#[test]
fn n_dims_above_four_is_a_bad_tensor() {
    let e = read(
        &GgufBuilder::new("llama")
            .tensor("blk.0.x", ggml::F32, &[1; 9])
            .build(),
    )
    .unwrap_err();
    let GgufError::BadTensor { name, reason, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(name, "blk.0.x");
    assert!(reason.contains("9 dimensions"), "{reason}");
}

#[test]
fn tensor_offset_beyond_the_end_is_truncated() {
    let bytes = GgufBuilder::new("llama")
        .tensor("a", ggml::F16, &[64])
        .tensor_at("b", ggml::F32, &[4], 1 << 40)
        .build();
    let e = read(&bytes).unwrap_err();
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what.contains("tensor 'b'")),
        "{e:?}"
    );
}

#[test]
fn missing_and_directory_and_unreadable() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let e = GgufInfo::inspect(&missing).unwrap_err();
    assert!(matches!(e, GgufError::NotFound { .. }));
    assert_eq!(e.kind(), GgufErrorKind::NotFound);
    assert!(e
        .to_string()
        .starts_with(&format!("{}: no such file", missing.display())));

    let e = GgufInfo::inspect(dir.path()).unwrap_err();
    assert!(matches!(e, GgufError::IsDirectory { .. }), "{e:?}");

    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufInfo::inspect(&empty),
        Err(GgufError::Empty { .. })
    ));

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "some notes\n").unwrap();
    assert!(matches!(
        GgufInfo::inspect(&text),
        Err(GgufError::NotGguf { .. })
    ));

    struct Failing;
    impl Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::new(io::ErrorKind::PermissionDenied, "denied"))
        }
    }
    let e = GgufInfo::from_reader(Failing, 100, Path::new("m.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Unreadable { .. }), "{e:?}");
    assert_eq!(e.kind(), GgufErrorKind::Io);
}

#[test]
fn split_parts_must_sit_together() {
    let dir = tempfile::tempdir().unwrap();
    let part = |k: u16| dir.path().join(format!("model-{k:05}-of-00003.gguf"));
    GgufBuilder::tiny_model("llama")
        .split(0, 3, 12)
        .write_to(&part(1))
        .unwrap();
    std::fs::write(part(2), b"").unwrap();
    let e = GgufInfo::inspect(&part(1)).unwrap_err();
    let GgufError::MissingSplitParts {
        no: 0,
        count: 3,
        missing,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(missing, &[part(3)]);
    assert_eq!(e.kind(), GgufErrorKind::NotFound);
    assert!(e
        .to_string()
        .contains("this is part 1 of a model split into 3 files, but this part is missing"));

    std::fs::write(part(3), b"").unwrap();
    let info = GgufInfo::inspect(&part(1)).unwrap();
    assert_eq!(
        info.split,
        Some(SplitInfo {
            no: 0,
            count: 3,
            tensors_count: Some(12)
        })
    );

    // A later part names the first.
    GgufBuilder::new("llama")
        .split(1, 3, 12)
        .write_to(&part(2))
        .unwrap();
    let e = GgufInfo::inspect(&part(2)).unwrap_err();
    assert!(
        matches!(&e, GgufError::NotFirstSplit { first: Some(p), .. } if *p == part(1)),
        "{e:?}"
    );

    // Files not named like llama.cpp's splits are not checked for siblings.
    let odd = dir.path().join("renamed.gguf");
    GgufBuilder::tiny_model("llama")
        .split(0, 3, 12)
        .write_to(&odd)
        .unwrap();
    assert!(GgufInfo::inspect(&odd).is_ok());
}

#[test]
fn split_paths_follow_llama_cpp_naming() {
    let paths = split_part_paths(Path::new("/m/qwen-00002-of-00002.gguf"), 1, 2).unwrap();
    assert_eq!(
        paths,
        [
            PathBuf::from("/m/qwen-00001-of-00002.gguf"),
            PathBuf::from("/m/qwen-00002-of-00002.gguf")
        ]
    );
    assert_eq!(split_part_paths(Path::new("qwen.gguf"), 0, 2), None);
    assert_eq!(
        split_part_paths(Path::new("-00001-of-00002.gguf"), 0, 2),
        None
    );
}

#[test]
fn tables_are_consistent() {
    assert_eq!(file_type_name(15), Some("Q4_K_M"));
    assert_eq!(file_type_name(4), None);
    assert!(KNOWN_ARCHITECTURES.contains(&"gemma3"));
    assert!(!KNOWN_ARCHITECTURES.contains(&"clip"));
    for t in GGML_TYPES {
        assert!(t.block_size > 0 && t.type_size > 0, "{}", t.name);
        assert_eq!(ggml_type(t.id), Some(t));
    }
}

/// A real model, when the test machine has one cached (the CLI's integration tests download it).
#[test]
fn real_model_when_cached() {
    let path = Path::new("/root/.cache/autotune/models/gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!(
            "note: {} is absent, skipping the real-model check",
            path.display()
        );
        return;
    }
    // Values checked against an independent reading of the header.
    let info = GgufInfo::inspect(path).unwrap();
    assert_eq!(info.architecture, "gemma3");
    assert_eq!(info.name.as_deref(), Some("Gemma 3 270m"));
    assert_eq!(info.block_count, Some(18));
    assert_eq!(info.file_type, Some(15));
    assert_eq!(info.file_type_name.as_deref(), Some("Q4_K_M"));
    assert_eq!(info.context_length, Some(32768));
    assert_eq!(info.embedding_length, Some(640));
    assert_eq!((info.head_count, info.head_count_kv), (Some(4), Some(1)));
    assert_eq!(info.vocab_size, Some(262_144));
    assert_eq!(info.tokenizer_model.as_deref(), Some("llama"));
    assert!(!info.is_moe());
    assert_eq!(info.tensor_count, 236);
    assert_eq!(info.tensors.len(), 236);
    assert_eq!(info.parameter_count, 268_098_176);
    assert!(info.tensor_bytes <= info.file_size);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        claimed in any::<u64>(),
    ) {
        let _ = read(&bytes);
        let _ = GgufInfo::from_reader(&bytes[..], claimed, Path::new("m.gguf"));
        // Random bytes behind a valid start reach the deeper parts of the reader.
        let with_magic = [&b"GGUF\x03\0\0\0"[..], &bytes].concat();
        let _ = read(&with_magic);
    }

    #[test]
    fn damaged_valid_files_never_panic(
        cut in 0usize..2000,
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
    ) {
        let mut bytes = GgufBuilder::tiny_model("llama").build();
        // Flip bytes in the header, where they change what is parsed, not in the zeroed data.
        let header_len = bytes.len().min(800);
        for (at, xor) in flips {
            let i = at.index(header_len);
            bytes[i] ^= xor;
        }
        let _ = read(&bytes);
        bytes.truncate(cut.min(bytes.len()));
        let _ = read(&bytes);
    }
}
