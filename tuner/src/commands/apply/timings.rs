//! What llama-server says of one completion's speed (the `timings` of its answer), read by the
//! server check, the report and the speculation check alike.

use serde::{Deserialize, Serialize};

/// `timings` of a `/completion` answer (llama-server's names).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Timings {
    #[serde(default)]
    pub prompt_n: u64,
    #[serde(default)]
    pub prompt_per_second: f64,
    #[serde(default)]
    pub predicted_n: u64,
    #[serde(default)]
    pub predicted_per_second: f64,
    /// Tokens drafted and accepted by speculative decoding (llama-server leaves both out when it
    /// drafted none).
    #[serde(default)]
    pub draft_n: u64,
    #[serde(default)]
    pub draft_n_accepted: u64,
}
