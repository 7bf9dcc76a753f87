//! One module per subcommand, and [`settings`], which turns their flags into validated settings.

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
mod settings;
pub mod show;
pub mod tune;
pub mod verify;
