//! The serde default of a count that is 1 unless said (`--parallel`'s sequences, NUMA nodes): written only
//! when it is not 1, so files and cache keys from before the field read the same.

pub fn one() -> u32 {
    1
}

pub fn is_one(n: &u32) -> bool {
    *n == 1
}
