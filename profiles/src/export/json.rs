//! The `json` format: the whole profile (its `server_env` with its `server_args`) as pretty JSON,
//! an array of them for several.

use super::exporter::Exporter;
use crate::error::{ProfileError, Result};
use crate::profile::Profile;

pub struct Json;

impl Exporter for Json {
    fn takes_several(&self) -> bool {
        true
    }

    fn export(&self, ps: &[&Profile]) -> Result<String> {
        let text = match ps {
            [p] => serde_json::to_string_pretty(p),
            _ => serde_json::to_string_pretty(ps),
        };
        let mut s = text.map_err(|e| ProfileError::Serialize {
            message: e.to_string(),
        })?;
        s.push('\n');
        Ok(s)
    }
}
