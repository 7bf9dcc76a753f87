//! `autotune quality MODEL [--quants …]`: the quality table of a model's ladder — KL divergence from
//! the most precise file and top-1 agreement, for every quantization and every KV-cache type.

use crate::cli::{Cli, QualityArgs};
use crate::commands::tune::{cache_dir, inspect_model};
use crate::exit::{self, Exit};
use crate::inputs::{self, Also};
use crate::quant::ladder::{self, Ladder};
use crate::quant::quality::{self, EvalSettings, Evaluator, QualityTable};
use crate::trial::TrialFailure;
use anyhow::Context as _;
use search_space::CacheType;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct QualityReport {
    pub ladder: Ladder,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualityTable>,
}

/// Physical cores, as llama.cpp's default thread count.
pub fn default_threads() -> u32 {
    crate::machine::Machine::probe(Vec::new())
        .physical_cores
        .max(1)
}

/// The evaluation settings shared by `quality` and `tune --max-kld`.
pub fn eval_settings(
    text: Option<&std::path::Path>,
    max_tokens: Option<u32>,
    chunk: u32,
    threads: Option<u32>,
    fresh: bool,
    quiet: bool,
) -> anyhow::Result<EvalSettings> {
    let usage = |m: String| Exit::new(exit::USAGE, m);
    if chunk < 16 {
        return Err(usage(format!(
            "--chunk {chunk}: use at least 16 tokens (512 is usual)"
        )));
    }
    if max_tokens == Some(0) {
        return Err(usage("the token limit must be at least 1".into()));
    }
    let text = match text {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("--text {}: cannot read", p.display()))?,
        None => quality::EVAL_TEXT.to_string(),
    };
    if text.trim().is_empty() {
        return Err(usage("the evaluation text is empty".into()));
    }
    Ok(EvalSettings {
        text,
        max_tokens,
        chunk,
        threads: threads.unwrap_or_else(default_threads),
        fresh,
        cache_dir: cache_dir(),
        quiet,
    })
}

pub fn run(cli: &Cli, a: &QualityArgs) -> anyhow::Result<i32> {
    inspect_model(&a.model)?;
    inputs::model_files("--quants", &a.quants, Also::Folders)?;
    let ladder = ladder::discover(&a.model, &a.quants)
        .map_err(|e| Exit::new(exit::BAD_MODEL, e.to_string()))?;
    if a.list {
        if a.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&QualityReport {
                    ladder,
                    quality: None
                })?
            );
        } else {
            print!("ladder of {}\n{}", a.model.display(), ladder.describe());
        }
        return Ok(exit::OK);
    }
    let kv_types = a
        .kv_types
        .iter()
        .map(|s| s.parse::<CacheType>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Exit::new(exit::USAGE, format!("--kv-types: {e}")))?;
    let reference = quality::choose_reference(&ladder, a.reference.as_deref())
        .map_err(|e| Exit::new(exit::USAGE, e))?;
    let settings = eval_settings(
        a.text.as_deref(),
        a.tokens,
        a.chunk,
        a.threads,
        a.fresh,
        cli.quiet,
    )?;
    if !a.json && !cli.quiet {
        eprint!("ladder of {}\n{}", a.model.display(), ladder.describe());
    }
    let stop = crate::quant::interrupt_flag()?;
    let mut evaluator = Evaluator::new(settings, &stop);
    let table = evaluator.table(&ladder, &reference, &kv_types);
    evaluator.shutdown();
    let table = match table {
        Ok(t) => t,
        Err(TrialFailure::Interrupted) => {
            return Err(Exit::new(
                exit::INTERRUPTED,
                "interrupted; finished evaluations are cached",
            ))
        }
        Err(f) => return Err(anyhow::anyhow!("{f}")),
    };
    let failed = table
        .weights
        .iter()
        .chain(&table.kv)
        .filter(|r| r.figures.is_none())
        .count();
    let total = table.weights.len() + table.kv.len();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&QualityReport {
                ladder,
                quality: Some(table)
            })?
        );
    } else {
        print!("{}", table.render(None));
    }
    if failed == total {
        return Err(Exit::new(
            exit::NOTHING_MEASURED,
            "no evaluation succeeded (see the table)",
        ));
    }
    if failed > 0 {
        return Err(Exit::new(
            exit::ERROR,
            format!("{failed} of {total} evaluations failed (see the table)"),
        ));
    }
    Ok(exit::OK)
}
