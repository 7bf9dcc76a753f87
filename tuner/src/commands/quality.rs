//! `autotune quality MODEL [--quants …]`: the quality table of a model's ladder — KL divergence from
//! the most precise file and top-1 agreement, for every quantization and every KV-cache type.

use super::settings::eval_settings;
use crate::cli::{Cli, QualityArgs};
use crate::exit::{self, Exit};
use crate::inputs::{self, Also};
use crate::measuring::TrialFailure;
use crate::quant::ladder::{self, Ladder};
use crate::quant::quality::{self, Evaluator, QualityTable};
use crate::session::inspect_model;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct QualityReport {
    pub ladder: Ladder,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<QualityTable>,
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
    let reference = quality::choose_reference(&ladder, a.reference.as_deref())
        .map_err(|e| Exit::new(exit::USAGE, e))?;
    let settings = eval_settings(
        a.text.as_deref(),
        a.tokens,
        a.chunk,
        a.threads,
        a.fresh,
        cli,
    )?;
    if !a.json && !cli.quiet {
        eprint!("ladder of {}\n{}", a.model.display(), ladder.describe());
    }
    let stop = crate::term::interrupt_flag()?;
    let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
    let mut evaluator = Evaluator::new(settings, &stopped);
    let table = evaluator.table(&ladder, &reference, &a.kv_types);
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
