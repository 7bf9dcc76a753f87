//! The model file read once into the operating system's page cache before anything is measured.
//! llama.cpp maps the file: on a cold cache the first load's warm-up and first repetitions read it
//! from disk as they touch it, so the defaults, measured first, were measured slower than they
//! run (a 7B Q4_K_M on a 2-core VM after the cache was emptied: a 33.6-s load and a 32.6-s warm-up
//! against 3-7 s and 20-28 s warm; its confirmed median 10% above its first visit's), and the time
//! said up front priced every later load and warm-up at those cold figures (the 10-minute budget
//! ended at 5 minutes with two configurations measured). Read first, every load finds the same
//! cache, as a server started on a machine that has used the file does.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

/// The largest share of the RAM available the file may take to be read: the rest is for what a
/// load allocates beside it (a repacked copy of the weights, the KV cache, compute buffers). A file
/// larger than that would push its own first pages out, or the load's memory, as it is read.
const MAX_SHARE_OF_AVAILABLE: f64 = 0.5;

/// Reads `path` through to the page cache where it takes at most [`MAX_SHARE_OF_AVAILABLE`] of
/// `available` bytes, stopping early where `stop` says so. The seconds it took, or `None` where
/// the file was not read (too large for the RAM, unreadable: the loads then read it as before).
pub fn read_through(path: &Path, available: u64, stop: &dyn Fn() -> bool) -> Option<f64> {
    let mut file = File::open(path).ok()?;
    let size = file.metadata().ok()?.len();
    if size as f64 > available as f64 * MAX_SHARE_OF_AVAILABLE {
        return None;
    }
    let started = Instant::now();
    let mut buf = vec![0u8; 16 << 20];
    loop {
        if stop() {
            return None;
        }
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_where_it_fits_half_the_ram_available() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, vec![7u8; 40 << 20]).unwrap();
        assert!(read_through(&path, 100 << 20, &|| false).is_some());
        assert!(
            read_through(&path, 60 << 20, &|| false).is_none(),
            "too large"
        );
        assert!(
            read_through(&path, 100 << 20, &|| true).is_none(),
            "stopped"
        );
        assert!(read_through(&dir.path().join("none"), 100 << 20, &|| false).is_none());
    }
}
