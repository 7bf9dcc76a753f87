//! A model file's identity: a fingerprint that tells files apart without reading them whole, so tuning
//! results can be tied to the exact file they were measured on, even when it is renamed or moved.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes hashed from the start of the file: the GGUF header, metadata and first tensors.
const HEAD_BYTES: u64 = 8 * 1024 * 1024;
/// Bytes hashed from the end of the file: the last tensors.
const TAIL_BYTES: u64 = 1024 * 1024;

/// Which model file a result belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelIdentity {
    /// SHA-256, in lower-case hex (64 digits), of the file size (u64, little-endian), the first 8 MiB and
    /// the last 1 MiB of the file (the two ranges do not overlap; a file under 9 MiB is hashed whole).
    ///
    /// This identifies a file without reading it all, so it takes milliseconds even for a 100 GB model.
    /// It is not a checksum of the whole file: two files that differ only in the middle have the same
    /// fingerprint. For model files that is not a practical concern (a different quantisation or version
    /// changes the header and the sizes), and it is not meant to detect corruption.
    pub fingerprint: String,
    pub size_bytes: u64,
    /// The file name without its directory, for display.
    pub file_name: String,
}

impl ModelIdentity {
    /// Fingerprints the file at `path`, reading at most 9 MiB of it.
    pub fn of_file(path: &Path) -> io::Result<Self> {
        let mut file = File::open(path)?;
        let size = file.metadata()?.len();
        let mut hasher = Sha256::new();
        hasher.update(size.to_le_bytes());
        let head = size.min(HEAD_BYTES);
        copy_exact(&mut file, head, &mut hasher)?;
        let tail_start = size.saturating_sub(TAIL_BYTES).max(head);
        file.seek(SeekFrom::Start(tail_start))?;
        copy_exact(&mut file, size - tail_start, &mut hasher)?;
        Ok(ModelIdentity {
            fingerprint: hex::encode(hasher.finalize()),
            size_bytes: size,
            file_name: path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        })
    }

    /// The first 12 hex digits of the fingerprint, for names and messages.
    pub fn short(&self) -> &str {
        self.fingerprint.get(..12).unwrap_or(&self.fingerprint)
    }
}

/// Feeds exactly `n` bytes of `file` to the hasher; a file that shrinks meanwhile is an error.
fn copy_exact(file: &mut File, n: u64, hasher: &mut Sha256) -> io::Result<()> {
    let copied = io::copy(&mut file.by_ref().take(n), hasher)?;
    if copied != n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the file changed while it was read",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = dir.join(name);
        File::create(&path).unwrap().write_all(bytes).unwrap();
        path
    }

    #[test]
    fn small_file_is_hashed_whole_with_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "m.gguf", b"hello");
        let id = ModelIdentity::of_file(&path).unwrap();
        let mut h = Sha256::new();
        h.update(5u64.to_le_bytes());
        h.update(b"hello");
        assert_eq!(id.fingerprint, hex::encode(h.finalize()));
        assert_eq!(id.size_bytes, 5);
        assert_eq!(id.file_name, "m.gguf");
        assert_eq!(id.short(), &id.fingerprint[..12]);
        assert_eq!(id.fingerprint.len(), 64);
    }

    #[test]
    fn head_and_tail_matter_middle_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let size = (HEAD_BYTES + TAIL_BYTES + 4096) as usize;
        let base = vec![7u8; size];
        let id = |name: &str, bytes: &[u8]| {
            ModelIdentity::of_file(&write(dir.path(), name, bytes)).unwrap()
        };
        let a = id("a", &base);
        let mut middle = base.clone();
        middle[HEAD_BYTES as usize + 10] = 0;
        let mut head = base.clone();
        head[10] = 0;
        let mut tail = base.clone();
        tail[size - 10] = 0;
        assert_eq!(a.fingerprint, id("b", &middle).fingerprint);
        assert_ne!(a.fingerprint, id("c", &head).fingerprint);
        assert_ne!(a.fingerprint, id("d", &tail).fingerprint);
        assert_ne!(a.fingerprint, id("e", &base[..size - 1]).fingerprint);
    }

    #[test]
    fn missing_file_is_an_error() {
        assert!(ModelIdentity::of_file(Path::new("/nonexistent/model.gguf")).is_err());
    }
}
