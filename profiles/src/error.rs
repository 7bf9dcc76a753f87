//! `ProfileError`: everything that can go wrong reading, checking, writing or locking profiles.
//!
//! Messages are lower case, name the file where there is one, and end with what to do about it.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// A file-system operation failed.
    #[error("cannot {action} {}: {source}; {}", path.display(), io_hint(action, source))]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The text is not a profile: bad TOML, a value of the wrong type, a missing key.
    #[error(
        "cannot read profile{}: {message}\nfix the file, or delete it and re-run `autotune tune`",
        at(path)
    )]
    Parse {
        path: Option<PathBuf>,
        message: String,
    },

    /// The profile was written by a different (newer or older) autotune.
    #[error(
        "profile{} has schema_version {found}, but this autotune reads schema_version {supported}; \
         re-run `autotune tune` to make a new profile, or use the autotune that wrote it",
        at(path)
    )]
    SchemaVersion {
        path: Option<PathBuf>,
        found: i64,
        supported: u32,
    },

    /// The profile parses but holds a value that must not reach llama-server.
    #[error(
        "invalid profile{}: {field} {reason}; fix it by hand or re-run `autotune tune`",
        at(path)
    )]
    Invalid {
        path: Option<PathBuf>,
        field: String,
        reason: String,
    },

    /// A stored profile could not be read and was renamed so it no longer gets in the way.
    #[error(
        "profile {} could not be read and was moved aside to {}; re-run `autotune tune` to make a new one\n{message}",
        path.display(),
        moved_to.display()
    )]
    Corrupt {
        path: PathBuf,
        moved_to: PathBuf,
        message: String,
    },

    /// The profile could not be turned into TOML (a number TOML cannot hold, a path that is not UTF-8).
    #[error("cannot write the profile as TOML: {message}")]
    Serialize { message: String },

    /// A format that holds one profile was asked for several.
    #[error(
        "the {format} format holds one profile, not {count}; {} take several",
        crate::ExportFormat::several_names()
    )]
    OneProfileOnly {
        format: crate::ExportFormat,
        count: usize,
    },

    /// There is no per-user data folder (no home directory).
    #[error("cannot find a per-user data folder for profiles; set AUTOTUNE_PROFILE_DIR to a writable folder")]
    NoDataDir,
}

/// What to do about a failed file-system operation: a profile named on the command line that is not
/// there is a path to check; anything else is the folder's (the store's, or `--out`'s).
fn io_hint(action: &str, source: &io::Error) -> &'static str {
    if action == "read" && source.kind() == io::ErrorKind::NotFound {
        "check the path"
    } else {
        "check that the folder exists and is writable (or set AUTOTUNE_PROFILE_DIR)"
    }
}

impl ProfileError {
    pub(crate) fn io(action: &'static str, path: &Path, source: io::Error) -> Self {
        ProfileError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ProfileError::Invalid {
            path: None,
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Names the file an error came from, where the error has room for one and none is set yet.
    pub fn with_path(mut self, file: &Path) -> Self {
        match &mut self {
            ProfileError::Parse { path, .. }
            | ProfileError::SchemaVersion { path, .. }
            | ProfileError::Invalid { path, .. }
                if path.is_none() =>
            {
                *path = Some(file.to_path_buf());
            }
            _ => {}
        }
        self
    }
}

fn at(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => format!(" {}", p.display()),
        None => String::new(),
    }
}

pub type Result<T, E = ProfileError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_to_read_asks_for_the_path_not_the_folder() {
        let missing = io::Error::new(io::ErrorKind::NotFound, "no such file");
        let e = ProfileError::io("read", Path::new("/x/p.toml"), missing);
        assert_eq!(
            e.to_string(),
            "cannot read /x/p.toml: no such file; check the path"
        );
        let denied = io::Error::new(io::ErrorKind::PermissionDenied, "denied");
        let e = ProfileError::io("replace", Path::new("/x/p.toml"), denied);
        assert!(
            e.to_string()
                .ends_with("writable (or set AUTOTUNE_PROFILE_DIR)"),
            "{e}"
        );
    }
}
