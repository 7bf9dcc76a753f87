//! Long-context retrieval (`autotune verify`): a short fact placed at 90% of a context filled to the
//! server's size with autotune's evaluation text, asked for at the end, answered greedily by the
//! model as the profile runs it. A quantized K cache can keep perplexity close and still lose such
//! a fact deep in the cache (a failure another tuner's stress check caught where perplexity alone
//! did not); where the profile's cache is quantized, the same facts are asked with f16 caches
//! too, so a miss is pinned on the cache, not on the model.

use super::quality::EVAL_TEXT;
use crate::llama::{ContextSettings, ModelSettings};
use crate::measuring::TrialFailure;
pub use crate::worker::protocol::{Fact, RetrievalRequest};
use crate::worker::{Request, Response, Worker};
use serde::Serialize;
use std::time::Duration;

/// Where in the context each fact is placed.
pub const DEPTH: f64 = 0.9;
/// Tokens the model may answer with.
const N_GEN: u32 = 12;

/// The facts asked: numbers the text does not hold, so only the fact can give them.
pub fn facts() -> Vec<Fact> {
    [
        ("the blue locker", "4817"),
        ("the night ferry's cabin", "2093"),
        ("the archive room", "7356"),
    ]
    .into_iter()
    .map(|(what, code)| Fact {
        sentence: format!("Remember this: the code of {what} is {code}."),
        question: format!("Question: what is the code of {what}? Answer: the code of {what} is"),
        answer: code.to_string(),
    })
    .collect()
}

/// What one configuration's caches retrieved.
#[derive(Debug, Clone, Serialize)]
pub struct Retrieved {
    /// `q8_0/q8_0`.
    pub kv: String,
    /// The facts whose answer was given, of all asked.
    pub found: usize,
    pub asked: usize,
    /// What the model said after each question.
    pub answers: Vec<String>,
}

impl Retrieved {
    /// "kv=q8_0/q8_0: 3 of 3 facts retrieved".
    pub fn describe(&self) -> String {
        format!(
            "kv={}: {} of {} facts retrieved",
            self.kv, self.found, self.asked
        )
    }
}

/// Asks every fact of [`facts`] of the model with `settings` and `context`, in a worker.
pub fn retrieve(
    model: &std::path::Path,
    settings: &ModelSettings,
    context: &ContextSettings,
    stop: &dyn Fn() -> bool,
) -> Result<Retrieved, String> {
    let facts = facts();
    let request = Request::Retrieval(Box::new(RetrievalRequest {
        model: model.to_path_buf(),
        settings: settings.clone(),
        context: context.clone(),
        filler: EVAL_TEXT.to_string(),
        facts: facts.clone(),
        depth: DEPTH,
        n_gen: N_GEN,
    }));
    let mut worker = Worker::spawn().map_err(|e| format!("cannot start a worker: {e}"))?;
    let answer = worker.call(&request, Duration::from_secs(6 * 3600), stop);
    worker.quit();
    let answers = match answer {
        Ok(Response::Retrieved(a)) => a.answers,
        Ok(_) => return Err("unexpected answer from the worker".into()),
        Err(TrialFailure::Interrupted) => return Err("interrupted".into()),
        Err(f) => return Err(crate::report::one_line(&f.to_string())),
    };
    let found = (facts.iter().zip(&answers))
        .filter(|(f, a)| gives(a, &f.answer))
        .count();
    Ok(Retrieved {
        kv: format!("{}/{}", context.type_k, context.type_v),
        found,
        asked: facts.len(),
        answers,
    })
}

/// Whether an answer gives `code`: its first number is it (digits spread over tokens joined).
pub fn gives(answer: &str, code: &str) -> bool {
    let digits: String = answer
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .filter(|c| !c.is_whitespace())
        .take_while(char::is_ascii_digit)
        .collect();
    digits == code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_gives_the_code_when_its_first_number_is_it() {
        assert!(gives(" 4817.", "4817"));
        assert!(gives(" 4 8 1 7, as said", "4817"));
        assert!(!gives(" 4818.", "4817"));
        assert!(!gives(" 48170", "4817"));
        assert!(!gives(" unknown", "4817"));
    }

    #[test]
    fn the_facts_are_not_in_the_text_they_are_hidden_in() {
        for f in facts() {
            assert!(!EVAL_TEXT.contains(&f.answer), "{}", f.answer);
            assert!(f.question.ends_with(" is") && f.sentence.contains(&f.answer));
        }
    }
}
