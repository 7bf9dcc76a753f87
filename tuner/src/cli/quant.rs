//! `quantize`'s and `quality`'s flags: a quantization ladder and its drift.

use clap::Args;
use search_space::CacheType;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    /// The source GGUF file (ideally F16/BF16/F32; a quantized one needs --allow-requantize)
    pub src: PathBuf,
    /// Quantizations to write, comma separated (llama-quantize's names: f16, bf16, q8_0, q6_k,
    /// q5_k_m, q4_k_m, q4_0, …)
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "f16,q8_0,q6_k,q5_k_m,q4_k_m,q4_0"
    )]
    pub types: Vec<String>,
    /// Folder to write them to (default: a folder per source under $AUTOTUNE_CACHE_DIR/ladder/)
    #[arg(long = "out-dir")]
    pub out_dir: Option<PathBuf>,
    /// Quantize from an already quantized source: every file then carries the source's rounding too
    /// (an F16 made from it holds the source's weights to within F16 rounding: the highest precision
    /// available)
    #[arg(long = "allow-requantize")]
    pub allow_requantize: bool,
    /// Threads the quantizer uses (default: all CPUs)
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Write files again that already exist
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct QualityArgs {
    /// A GGUF model: its ladder (the other quantizations beside it, or --quants) is evaluated
    pub model: PathBuf,
    /// Quantizations of the model to evaluate instead of those found beside it: files or folders
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub quants: Vec<PathBuf>,
    /// The file to compare against (default: the most precise of the ladder)
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// KV-cache types to evaluate (on the reference's weights), comma separated
    #[arg(
        long = "kv-types",
        value_delimiter = ',',
        default_value = "f16,q8_0,q4_0"
    )]
    pub kv_types: Vec<CacheType>,
    /// Evaluate only the first N tokens of the text (faster, noisier)
    #[arg(long)]
    pub tokens: Option<u32>,
    /// Chunk length: the context each chunk of the text is evaluated in
    #[arg(long, default_value_t = 512)]
    pub chunk: u32,
    /// Evaluation text (default: the English prose, code and dialogue built into autotune)
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Threads (default: the physical cores)
    #[arg(short = 't', long)]
    pub threads: Option<u32>,
    /// Only list the ladder: which files were considered and why others were not (runs nothing)
    #[arg(long)]
    pub list: bool,
    /// Evaluate again even when a cached result exists
    #[arg(long)]
    pub fresh: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}
