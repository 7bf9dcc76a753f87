//! One module per subcommand.

pub mod apply;
pub mod doctor;
pub mod export;
pub mod measure;
pub mod rpc_serve;
pub mod show;
pub mod tune;
