//! One module per subcommand.

pub mod doctor;
pub mod show;
pub mod tune;
