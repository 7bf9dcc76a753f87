//! `autotune export` (being written).

use crate::cli::{Cli, ExportArgs};
use crate::exit::{self, Exit};

pub fn run(_cli: &Cli, _args: &ExportArgs) -> anyhow::Result<i32> {
    Err(Exit::new(exit::ERROR, "`autotune export` is not available in this build yet"))
}
