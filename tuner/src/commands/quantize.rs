//! `autotune quantize SRC --types f16,q8_0,…`: write a ladder of quantizations of one model with
//! llama.cpp's quantizer (linked, in a worker process per file), into a folder of its own.

use crate::cli::{Cli, QuantizeArgs};
use crate::exit::{self, Exit};
use crate::measuring::TrialFailure;
use crate::quant::make::{self, Made, MakeSettings};
use crate::session::{cache_dir, inspect_model};
use anyhow::Context as _;
use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use search_space::identity::ModelIdentity;
use search_space::size::format_size;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Serialize)]
pub struct QuantizeReport {
    pub source: PathBuf,
    pub source_type: Option<String>,
    pub out_dir: PathBuf,
    pub requantized: bool,
    pub files: Vec<Made>,
}

pub fn run(cli: &Cli, a: &QuantizeArgs) -> anyhow::Result<i32> {
    let info = inspect_model(&a.src)?;
    let src = std::fs::canonicalize(&a.src)
        .with_context(|| format!("{}: cannot resolve path", a.src.display()))?;
    let types =
        make::parse_types(&a.types).map_err(|e| Exit::new(exit::USAGE, format!("--types: {e}")))?;
    let src_type = info.file_type_name.clone();
    let quantized_source = !src_type.as_deref().is_some_and(make::is_float);
    let needs_work = types.iter().any(|t| Some(t.ftype) != info.file_type);
    if quantized_source && needs_work && !a.allow_requantize {
        return Err(Exit::new(
            exit::USAGE,
            format!(
                "{} is already quantized ({}): the other quantizations would be made from its rounded weights. \
                 Pass --allow-requantize to do it anyway, or start from an F16/BF16 file",
                src.display(),
                src_type.as_deref().unwrap_or("unknown type")
            ),
        ));
    }
    if quantized_source && needs_work {
        eprintln!(
            "autotune: warning: re-quantizing {} ({}): every file made from it carries its rounding. An F16 made from it \
             holds its weights to within F16 rounding (the highest precision available); the other types add their \
             own rounding on top.",
            src.display(),
            src_type.as_deref().unwrap_or("?")
        );
    }
    let out_dir = out_dir_for(&src, src_type.as_deref(), a.out_dir.as_ref())?;
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;
    let settings = MakeSettings {
        src: &src,
        src_info: &info,
        out_dir: &out_dir,
        allow_requantize: a.allow_requantize,
        threads: a.threads.unwrap_or(0),
        force: a.force,
        timeout: Duration::from_secs(6 * 3600),
    };
    // The source belongs to its ladder: linked into the folder so `--ladder` finds every rung there.
    let _ = make::link_source(&settings);
    let files = make_all(&settings, &types, cli.quiet)?;
    let report = QuantizeReport {
        source: src,
        source_type: src_type,
        out_dir,
        requantized: quantized_source && needs_work,
        files,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    let failed: Vec<&str> = report
        .files
        .iter()
        .filter(|m| m.failed())
        .map(|m| m.file_type.as_str())
        .collect();
    if !failed.is_empty() {
        return Err(Exit::new(
            exit::ERROR,
            format!("could not make {} (see the table)", failed.join(", ")),
        ));
    }
    Ok(exit::OK)
}

/// Where the ladder goes: `--out-dir`, else a folder per source under the cache's `ladder/`.
fn out_dir_for(
    src: &std::path::Path,
    src_type: Option<&str>,
    explicit: Option<&PathBuf>,
) -> anyhow::Result<PathBuf> {
    Ok(match explicit {
        Some(d) => d.clone(),
        None => {
            let id = ModelIdentity::of_file(src)
                .with_context(|| format!("{}: cannot read", src.display()))?;
            let name = src
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            cache_dir().join("ladder").join(format!(
                "{}-{}",
                make::base_name(&name, src_type),
                &id.short()[..8]
            ))
        }
    })
}

/// Makes every type in turn, each with its progress bar; a failed one is a row, an interrupt the
/// command's end.
fn make_all(
    settings: &MakeSettings,
    types: &[make::QuantType],
    quiet: bool,
) -> anyhow::Result<Vec<Made>> {
    let stop = crate::term::interrupt_flag()?;
    let mut files = Vec::new();
    for (i, t) in types.iter().enumerate() {
        let bar = crate::term::bar(
            quiet,
            "{spinner} [{elapsed_precise}] {prefix} {bar:30} {pos}/{len} tensors",
        );
        if let Some(b) = &bar {
            b.set_prefix(format!("{} ({}/{})", t.name, i + 1, types.len()));
        }
        let made = make::make_one(settings, t, bar.as_ref(), &stop);
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        match made {
            Ok(m) => {
                if m.failed() {
                    eprintln!("autotune: {}: {}", m.file_type, m.status);
                }
                files.push(m);
            }
            Err(TrialFailure::Interrupted) => {
                return Err(Exit::new(
                    exit::INTERRUPTED,
                    "interrupted; the files finished so far are kept, run again to make the rest",
                ));
            }
            Err(f) => files.push(Made {
                file_type: t.name.into(),
                path: PathBuf::new(),
                status: format!("failed: {f}"),
                size_bytes: 0,
                seconds: 0.0,
            }),
        }
    }
    Ok(files)
}

fn render(r: &QuantizeReport) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["type", "file", "size", "time", "status"]);
    for m in &r.files {
        t.add_row([
            m.file_type.clone(),
            m.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            if m.size_bytes > 0 {
                format_size(m.size_bytes)
            } else {
                "-".into()
            },
            if m.seconds > 0.0 {
                format!("{:.0} s", m.seconds)
            } else {
                "-".into()
            },
            m.status.clone(),
        ]);
    }
    format!(
        "source  {} ({})\nfolder  {}\n{t}\nnext    autotune quality {} --list\n",
        r.source.display(),
        r.source_type.as_deref().unwrap_or("?"),
        r.out_dir.display(),
        r.files
            .iter()
            .find(|m| !m.failed())
            .map(|m| m.path.display().to_string())
            .unwrap_or_else(|| r.source.display().to_string())
    )
}
