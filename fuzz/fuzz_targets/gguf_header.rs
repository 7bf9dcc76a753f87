//! The GGUF header reader on arbitrary bytes: it must return `Ok` or a `GgufError`, never panic,
//! and never allocate beyond its documented limits whatever the counts in the file say.
#![no_main]

use libfuzzer_sys::fuzz_target;
use search_space::gguf::GgufInfo;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let _ = GgufInfo::from_reader(data, data.len() as u64, Path::new("fuzz.gguf"));
    // A file that claims to be longer than the bytes it has (a model cut off while copying).
    let _ = GgufInfo::from_reader(data, (data.len() as u64).saturating_mul(3), Path::new("fuzz.gguf"));
});
