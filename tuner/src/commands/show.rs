//! `autotune show`: list the profile store, or print one profile (for a model file on this machine,
//! or a profile file).

use crate::cli::{Cli, ShowArgs};
use crate::exit::{self, Exit};
use profiles::{Store, StoredProfile};
use search_space::identity::ModelIdentity;

pub fn run(cli: &Cli, args: &ShowArgs) -> anyhow::Result<i32> {
    let store = Store::open(Store::default_dir()?)?;
    let Some(target) = &args.target else {
        let entries = store.list()?;
        if args.json {
            let v: Vec<serde_json::Value> = entries
                .iter()
                .map(|e| match &e.result {
                    Ok(s) => serde_json::json!({"path": e.path, "summary": s}),
                    Err(err) => serde_json::json!({"path": e.path, "error": err}),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
            return Ok(exit::OK);
        }
        if entries.is_empty() {
            println!(
                "no profiles in {} yet: run `autotune MODEL.gguf`",
                store.dir().display()
            );
        }
        for e in &entries {
            match &e.result {
                Ok(s) => println!(
                    "{}  {}  pp {:.1} t/s  tg {:.1} t/s{}  {}",
                    s.model_file,
                    s.winner,
                    s.pp_tps,
                    s.tg_tps,
                    versus(s),
                    e.path.display()
                ),
                Err(err) => eprintln!(
                    "autotune: warning: {}: {}",
                    e.path.display(),
                    crate::report::one_line(err)
                ),
            }
        }
        return Ok(exit::OK);
    };
    let here = crate::probe::probe(cli.verbose, &[])?;
    let stored = if target.extension().is_some_and(|e| e == "toml") {
        StoredProfile::read(target).map_err(|e| Exit::new(exit::BAD_PROFILE, e.to_string()))?
    } else {
        crate::session::inspect_model(target)?;
        let id = ModelIdentity::of_file(target)?;
        match store
            .find(&here.machine.fingerprint, &id.fingerprint)
            .map_err(|e| Exit::new(exit::BAD_PROFILE, e.to_string()))?
        {
            Some(p) => p,
            None => {
                return Err(Exit::new(
                    exit::BAD_PROFILE,
                    format!(
                        "{}: no profile for this model on this machine; run `autotune {}` first",
                        target.display(),
                        target.display()
                    ),
                ))
            }
        }
    };
    for w in &stored.warnings {
        eprintln!("autotune: warning: {}: {w}", stored.path.display());
    }
    if let Some(why) = stale(&stored.profile, &here, cli.verbose) {
        eprintln!("autotune: warning: {}: {why}", stored.path.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&stored.profile)?);
    } else {
        println!("# {}", stored.path.display());
        println!("# quality {}", crate::stored::quality_line(&stored.profile));
        print!("{}", stored.profile.to_toml()?);
    }
    Ok(exit::OK)
}

/// Why the profile is stale on this machine (`here`, without RPC servers), if it is: one whose
/// layers live on RPC servers is judged with them connected, and servers that cannot be reached are
/// said as such.
fn stale(p: &profiles::Profile, here: &crate::probe::Probe, verbose: bool) -> Option<String> {
    if p.rpc.is_empty() {
        return crate::stored::stale_note(p, here);
    }
    match crate::probe::probe(verbose, &p.rpc) {
        Ok(with_rpc) => crate::stored::stale_note(p, &with_rpc),
        Err(e) => Some(format!(
            "its RPC servers ({}) cannot be reached: {}",
            p.rpc.join(", "),
            crate::term::error_line(&e)
        )),
    }
}

/// The winner against the defaults in a listing: the run's verdict where the profile records it
/// (a tie is never shown as a gain), else the generation speeds' ratio, named as such.
fn versus(s: &profiles::ProfileSummary) -> String {
    match (&s.versus_defaults, s.tg_speedup) {
        (Some(v), _) => format!(" ({})", v.short()),
        (None, Some(x)) => format!(" (tg {:+.0}% vs defaults)", (x - 1.0) * 100.0),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiles::{Judged, VersusDefaults};

    #[test]
    fn a_tie_is_listed_as_a_tie_whatever_the_medians_say() {
        let mut s = profiles::example_profile().summary();
        s.tg_speedup = Some(1.053);
        s.versus_defaults = Some(VersusDefaults {
            verdict: Judged::Tie,
            ratio: 0.074,
            ci: [-0.02, 0.098],
            noise: 0.02,
        });
        assert_eq!(versus(&s), " (ties with defaults within ±2%)");
        s.versus_defaults.as_mut().unwrap().verdict = Judged::Faster;
        assert_eq!(versus(&s), " (+7% requests/s vs defaults)");
        // A profile written before the verdict was kept: the generation speeds, named as such.
        s.versus_defaults = None;
        assert_eq!(versus(&s), " (tg +5% vs defaults)");
    }
}
