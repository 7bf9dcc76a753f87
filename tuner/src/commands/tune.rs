//! `autotune tune MODEL` (and the short form `autotune MODEL`): check the model, measure
//! configurations in worker processes, print the leaderboard, and save the winner as a profile.

use super::settings;
use crate::cli::{Cli, TuneArgs};
use crate::exit;
use crate::explain::outputs::{self, Asked};
use crate::inputs::{self, Also};
use crate::report::Report;
use crate::tuning::{self, After};
use crate::{session, term};

/// Files named for later stages (quantizations, a reference, drafts) and the files written at the end
/// (`--out`, `--export-markdown`) are checked first, not after minutes of tuning.
fn check_named_files(args: &TuneArgs) -> anyhow::Result<()> {
    session::inspect_model(&args.model)?;
    inputs::model_files("--quants", &args.quants, Also::Folders)?;
    inputs::model_files("--draft", &args.speculative.draft, Also::Auto)?;
    let reference: Vec<_> = args.reference.iter().cloned().collect();
    inputs::model_files("--reference", &reference, Also::Nothing)?;
    inputs::output_file("--out", args.out.as_deref())?;
    inputs::output_file("--export-markdown", args.export_markdown.as_deref())
}

/// What becomes of the winner's profile, from the flags.
fn after(cli: &Cli, args: &TuneArgs) -> anyhow::Result<After> {
    // Draft models when given; n-gram speculation (no draft model) when the workload repeats text;
    // the model's own MTP heads whenever it has some (no second model to load either).
    let workload = args.workload.workload;
    let drafts = !args.speculative.draft.is_empty();
    let ngram = crate::speculative::workload::text_repeats(workload) && !args.speculative.no_ngram;
    let mtp = crate::speculative::mtp::heads(&session::inspect_model(&args.model)?) > 0;
    let wanted = drafts || ngram || mtp;
    let draft = if !wanted {
        None
    } else {
        Some(settings::draft_search(
            &args.speculative,
            &args.trial,
            workload,
        )?)
    };
    Ok(After {
        draft,
        save: !args.no_save,
        out: args.out.clone(),
        explain: Asked {
            plot: args.plot,
            markdown: args.export_markdown.clone(),
            json: args.json,
        },
        quiet: cli.quiet,
    })
}

pub fn run(cli: &Cli, args: &TuneArgs) -> anyhow::Result<i32> {
    check_named_files(args)?;
    let plan = settings::plan(cli, args)?;
    let after = after(cli, args)?;
    let joint = settings::joint(cli, args)?;
    let stop = term::interrupt_flag()?;
    if let Some(joint) = joint {
        return tuning::joint::run(&joint, &plan, &after, &stop);
    }
    let store = session::open_store()?;
    let _lock = session::lock_store(&store, &stop)?;
    let tuned = tuning::tune(&plan, &args.model, &stop)?;
    let mut report = tuning::report_of(&tuned);
    if tuned.interrupted {
        emit(&report, args)?;
        eprintln!(
            "autotune: interrupted; {} measurements kept in {}. Run the same command again (or add --resume) to continue: it reuses them.",
            tuned.appended + tuned.reused,
            tuned.log_path.display()
        );
        return Ok(exit::INTERRUPTED);
    }
    let Some(mut profile) = tuning::profile_from_run(&tuned) else {
        emit(&report, args)?;
        return Err(tuning::nothing_measured(&tuned));
    };
    if let Some(note) = tuning::complete(&mut profile, &tuned, &after, &stop)? {
        report.notes.push(note);
    }
    report.profile_path = tuning::save(&store, &profile, &after)?;
    emit(&report, args)?;
    outputs::after_tune(&after.explain, &profile, report.profile_path.as_deref());
    Ok(exit::OK)
}

fn emit(report: &Report, args: &TuneArgs) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        print!("{}", report.render(args.top));
    }
    Ok(())
}
