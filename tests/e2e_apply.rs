//! End to end: `autotune apply` and `autotune export` on a tuned demo model (being written).

mod common;
