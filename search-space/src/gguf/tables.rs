//! Tables copied from the llama.cpp this workspace links (llama-cpp-sys-2 0.1.161): ggml tensor types,
//! llama file types and architecture names. Regenerate them when the vendored llama.cpp is upgraded.

/// How a ggml tensor type lays out its data: `block_size` elements take `type_size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    pub id: u32,
    /// ggml's own name (`ggml_type_name`), e.g. `q4_K`.
    pub name: &'static str,
    pub block_size: u64,
    pub type_size: u64,
}

const fn t(id: u32, name: &'static str, block_size: u64, type_size: u64) -> GgmlType {
    GgmlType {
        id,
        name,
        block_size,
        type_size,
    }
}

/// From `type_traits` in ggml/src/ggml.c; the byte sizes are `sizeof(block_*)` from ggml-common.h, printed by
/// a C program compiled against those headers. Removed types (4, 5, 31–33, 36–38) are absent on purpose:
/// llama.cpp refuses them, and so do we.
pub const GGML_TYPES: &[GgmlType] = &[
    t(0, "f32", 1, 4),
    t(1, "f16", 1, 2),
    t(2, "q4_0", 32, 18),
    t(3, "q4_1", 32, 20),
    t(6, "q5_0", 32, 22),
    t(7, "q5_1", 32, 24),
    t(8, "q8_0", 32, 34),
    t(9, "q8_1", 32, 36),
    t(10, "q2_K", 256, 84),
    t(11, "q3_K", 256, 110),
    t(12, "q4_K", 256, 144),
    t(13, "q5_K", 256, 176),
    t(14, "q6_K", 256, 210),
    t(15, "q8_K", 256, 292),
    t(16, "iq2_xxs", 256, 66),
    t(17, "iq2_xs", 256, 74),
    t(18, "iq3_xxs", 256, 98),
    t(19, "iq1_s", 256, 50),
    t(20, "iq4_nl", 32, 18),
    t(21, "iq3_s", 256, 110),
    t(22, "iq2_s", 256, 82),
    t(23, "iq4_xs", 256, 136),
    t(24, "i8", 1, 1),
    t(25, "i16", 1, 2),
    t(26, "i32", 1, 4),
    t(27, "i64", 1, 8),
    t(28, "f64", 1, 8),
    t(29, "iq1_m", 256, 56),
    t(30, "bf16", 1, 2),
    t(34, "tq1_0", 256, 54),
    t(35, "tq2_0", 256, 66),
    t(39, "mxfp4", 32, 17),
    t(40, "nvfp4", 64, 36),
    t(41, "q1_0", 128, 18),
    t(42, "q2_0", 64, 18),
];

/// The layout of ggml type `id`, or `None` for an unknown or removed type.
pub fn ggml_type(id: u32) -> Option<&'static GgmlType> {
    GGML_TYPES.iter().find(|t| t.id == id)
}

/// The `llama_ftype` enum of include/llama.h, named as the enum spells it without `LLAMA_FTYPE_MOSTLY_`
/// (what model file names use, e.g. `Q4_K_M`). `LLAMA_FTYPE_ALL_F32` is written `F32`.
const FILE_TYPES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (21, "Q2_K_S"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (32, "BF16"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
    (39, "NVFP4"),
    (40, "Q1_0"),
    (41, "Q2_0"),
];

/// The name of a `general.file_type` value, or `None` when llama.cpp has no name for it.
pub fn file_type_name(file_type: u32) -> Option<&'static str> {
    FILE_TYPES
        .iter()
        .find(|(n, _)| *n == file_type)
        .map(|(_, name)| *name)
}

/// Every architecture llama.cpp can load: the strings of `LLM_ARCH_NAMES` in src/llama-arch.cpp, in its
/// order, extracted with `awk '/LLM_ARCH_NAMES = \{/,/^};/' src/llama-arch.cpp | grep -o '"[^"]*"'`.
/// Left out: `(unknown)`, and `clip`, which names a multimodal projector (mmproj) rather than a model
/// llama.cpp can load on its own.
#[rustfmt::skip]
pub const KNOWN_ARCHITECTURES: &[&str] = &[
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
    "starcoder", "refact", "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert",
    "jina-bert-v2", "jina-bert-v3", "eurobert", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe",
    "qwen2vl", "qwen3", "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe",
    "clef", "qwen4exp", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3", "codeshell", "orion",
    "internlm2", "minicpm", "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n", "gemma4",
    "gemma4-assistant", "gemma-embedding", "starcoder2", "mamba", "mamba2", "maple", "jamba",
    "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo", "olmo2", "olmoe",
    "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2", "deepseek2-ocr", "deepseek32",
    "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet", "t5", "t5encoder", "jais",
    "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4", "exaone-moe", "rwkv6",
    "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe", "granitehybrid", "graniteswitch",
    "granite_swa", "chameleon", "wavtokenizer-dec", "plm", "bailingmoe", "bailingmoe2",
    "bailingmoe3", "dots1", "dots3note", "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe",
    "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3", "hy_v4", "smollm3", "gpt-oss", "lfm2",
    "lfm2moe", "dream", "smallthinker", "llada", "llada-moe", "seed_oss", "grovemoe", "apertus",
    "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1", "pangu-embedded",
    "mistral3", "eagle3", "dflash", "mistral4", "paddleocr", "mimo2", "step35", "spark2_5",
    "llama-embed", "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie", "mellum",
    "nanbeige", "qwen3tts", "pockettts",
];
