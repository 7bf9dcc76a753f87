//! One module per subcommand.

pub mod apply;
pub mod doctor;
pub mod draft;
pub mod explain;
pub mod export;
pub mod fit;
pub mod measure;
pub mod quality;
pub mod quantize;
pub mod rpc_serve;
pub mod show;
pub mod tune;
