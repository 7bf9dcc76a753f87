//! `autotune apply` (being written).

use crate::cli::{Cli, ApplyArgs};
use crate::exit::{self, Exit};

pub fn run(_cli: &Cli, _args: &ApplyArgs) -> anyhow::Result<i32> {
    Err(Exit::new(exit::ERROR, "`autotune apply` is not available in this build yet"))
}
