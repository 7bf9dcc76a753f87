//! The prompt set speculative decoding is measured on: built in (code, chat, summarisation and
//! repetitive text, from `assets/speculative-prompts.toml`), or a file of the same shape.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The built-in set.
const BUILT_IN: &str = include_str!("../../assets/speculative-prompts.toml");

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    pub name: String,
    /// What kind of text it asks for (`code`, `chat`, `summarisation`, `repetitive`, ...): acceptance is
    /// reported per kind.
    pub kind: String,
    pub text: String,
}

#[derive(Deserialize)]
struct PromptFile {
    prompt: Vec<Prompt>,
}

/// The built-in prompt set.
pub fn built_in() -> Vec<Prompt> {
    parse(BUILT_IN).expect("the built-in prompt set parses")
}

/// A prompt set from a TOML file with `[[prompt]]` tables (`name`, `kind`, `text`).
pub fn from_file(path: &Path) -> Result<Vec<Prompt>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse(text: &str) -> Result<Vec<Prompt>, String> {
    let file: PromptFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let prompts: Vec<Prompt> = file
        .prompt
        .into_iter()
        .map(|p| Prompt {
            text: p.text.trim_start_matches('\n').to_string(),
            ..p
        })
        .filter(|p| !p.text.trim().is_empty())
        .collect();
    if prompts.is_empty() {
        return Err("no prompts (write [[prompt]] tables with name, kind and text)".into());
    }
    Ok(prompts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_set_has_every_kind() {
        let p = built_in();
        for kind in ["code", "chat", "summarisation", "repetitive"] {
            assert!(p.iter().filter(|x| x.kind == kind).count() >= 2, "{kind}");
        }
        assert!(p.iter().all(|x| !x.text.starts_with('\n')));
    }

    #[test]
    fn rejects_an_empty_set() {
        assert!(parse("title = 1\nprompt = []\n").is_err());
    }
}
