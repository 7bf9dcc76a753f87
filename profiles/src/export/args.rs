//! The `args` format: `llama-server` and its arguments on one POSIX shell line, the environment
//! variables the profile's knobs need in front of it (`NAME=VALUE llama-server ...`).

use super::exporter::{env_assignments, Exporter};
use crate::error::Result;
use crate::profile::Profile;
use crate::server_args::shell_quote;

pub struct Args;

impl Exporter for Args {
    fn takes_several(&self) -> bool {
        false
    }

    fn export(&self, ps: &[&Profile]) -> Result<String> {
        let p = ps[0];
        let mut argv = vec!["llama-server".to_string()];
        argv.extend(p.server_args.iter().cloned());
        let env = env_assignments(&p.server_env);
        let sep = if env.is_empty() { "" } else { " " };
        Ok(format!("{env}{sep}{}\n", shell_quote(&argv)))
    }
}
