//! What llama-server would decide itself where the profile pins it ([`profiles::SERVER_CHOICES`]):
//! its slots, their shared cache and its speculation have defaults that move between builds
//! (llama.cpp #28849 made the slots 4 sharing one cache; #28391 makes n-gram speculation the
//! default). `apply` reads this build's defaults from `llama-server --help` and says which the
//! profile overrides, so that a user who compares with a bare `llama-server -m MODEL` knows why.

/// The profile's pinned options whose value differs from this server's default, each as
/// `OPTION [VALUE] (this llama-server's default: …)`. A flag (no value) is listed with its default
/// wherever the help gives one: its default is a rule (`enabled if number of slots is auto`), not a
/// value to compare.
pub fn overridden(argv: &[String], help: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (name, takes_value) in profiles::SERVER_CHOICES {
        let Some(at) = argv.iter().position(|a| a == name) else {
            continue;
        };
        let Some(default) = default_of(help, name) else {
            continue;
        };
        let value = argv.get(at + 1).filter(|_| takes_value);
        let first = default.split(',').next().unwrap_or_default().trim();
        if value.is_some_and(|v| v == first) {
            continue;
        }
        let shown = value.map_or(name.to_string(), |v| format!("{name} {v}"));
        out.push(format!("{shown} (this llama-server's default: {default})"));
    }
    out
}

/// The `(default: …)` text of `name`'s entry in llama-server's help: the entry whose first line
/// names it among its spellings, its lines joined.
fn default_of(help: &str, name: &str) -> Option<String> {
    let mut entry: Option<String> = None;
    for line in help.lines() {
        let starts_entry = line.starts_with('-');
        if starts_entry {
            if let Some(e) = entry.take() {
                return default_in(&e);
            }
            let spellings = line.split_whitespace().map(|w| w.trim_end_matches(','));
            if spellings
                .take_while(|w| w.starts_with('-'))
                .any(|w| w == name)
            {
                entry = Some(line.to_string());
            }
        } else if let Some(e) = entry.as_mut() {
            e.push(' ');
            e.push_str(line.trim());
        }
    }
    entry.and_then(|e| default_in(&e))
}

/// The text inside `(default: …)`, its own parentheses kept.
fn default_in(entry: &str) -> Option<String> {
    let start = entry.find("(default:")? + "(default:".len();
    let mut depth = 1;
    for (i, ch) in entry[start..].char_indices() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return Some(entry[start..start + i].trim().to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of llama-server's `--help` (llama-cpp-sys-2 0.1.161's build).
    const HELP: &str = "\
-np,   --parallel N                     number of server slots (default: -1, -1 = auto)
                                        (env: LLAMA_ARG_N_PARALLEL)
-cb,   --cont-batching, -nocb, --no-cont-batching
                                        whether to enable continuous batching (default: enabled)
-kvu,  --kv-unified, -no-kvu, --no-kv-unified
                                        use single unified KV buffer shared across all sequences (default:
                                        enabled if number of slots is auto)
--kv-unified-per-slot N                 context limit per parallel slot (default: unset, behavior unchanged).
--spec-type none,draft-simple,ngram-simple
                                        comma-separated list of types of speculative decoding to use (default:
                                        none)
";

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_servers_own_choices_the_profile_overrides_are_named_with_their_defaults() {
        let pinned = argv(&["-m", "m.gguf", "-np", "1", "-no-kvu", "--spec-type", "none"]);
        assert_eq!(
            overridden(&pinned, HELP),
            [
                "-np 1 (this llama-server's default: -1, -1 = auto)",
                "-no-kvu (this llama-server's default: enabled if number of slots is auto)",
            ]
        );
        // A build whose default speculates: the profile's `none` overrides it.
        let speculating = HELP.replace(
            "                                        none)",
            "                                        ngram-mod)",
        );
        let said = overridden(&pinned, &speculating);
        assert_eq!(said.len(), 3, "{said:?}");
        assert_eq!(
            said[2],
            "--spec-type none (this llama-server's default: ngram-mod)"
        );
        // A server whose default is the profile's value, or a help without the option: nothing.
        let four = argv(&["-np", "-1"]);
        assert!(overridden(&four, HELP).is_empty());
        assert!(overridden(&pinned, "-c, --ctx-size N  size (default: 0)").is_empty());
    }
}
