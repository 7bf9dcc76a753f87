//! The per-user profile store: one TOML file per (model, machine), written atomically, found by
//! fingerprint, listed without ever failing on one bad file, and locked so two tuning runs do not
//! measure each other.

use crate::error::{ProfileError, Result};
use crate::profile::{Profile, ProfileSummary};
use fs4::fs_std::FileExt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Overrides where profiles are kept (useful for tests, containers and shared machines).
pub const PROFILE_DIR_ENV: &str = "AUTOTUNE_PROFILE_DIR";

/// How many characters of each fingerprint go into a file name: enough to tell machines and models apart
/// in a listing; the full fingerprints inside the file are what `find` compares.
const FINGERPRINT_CHARS: usize = 12;

/// A folder of profiles.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A profile read from a file, with the warnings reading it produced (unknown keys).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredProfile {
    pub path: PathBuf,
    pub profile: Profile,
    pub warnings: Vec<String>,
}

/// One file in the store: its summary, or why it could not be used (a corrupt file has been moved aside
/// by the time it is listed, and the message says where to).
#[derive(Debug)]
pub struct StoreEntry {
    pub path: PathBuf,
    pub result: Result<ProfileSummary, String>,
}

/// What the store holds for one machine: the newest profile of each model, and the files that could not
/// be read, with why.
#[derive(Debug)]
pub struct MachineProfiles {
    pub profiles: Vec<StoredProfile>,
    pub unreadable: Vec<(PathBuf, ProfileError)>,
}

/// Held while a tuning run uses the machine; dropping it lets the next run start.
#[derive(Debug)]
pub struct StoreLock {
    file: File,
    path: PathBuf,
}

impl StoreLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        // Closing the file releases the lock too; unlocking first makes the order explicit.
        let _ = FileExt::unlock(&self.file);
    }
}

impl StoredProfile {
    /// Reads and validates (without checking paths) a profile file. Nothing is moved aside: this is for
    /// files the user names, e.g. `autotune apply --profile FILE`.
    pub fn read(path: &Path) -> Result<StoredProfile> {
        let text = read_text(path)?;
        let (profile, warnings) = Profile::from_toml(&text).map_err(|e| e.with_path(path))?;
        profile.validate(false).map_err(|e| e.with_path(path))?;
        Ok(StoredProfile {
            path: path.to_path_buf(),
            profile,
            warnings,
        })
    }
}

impl Store {
    /// `$AUTOTUNE_PROFILE_DIR` if set, else the per-user data folder's `profiles` (e.g.
    /// `~/.local/share/autotune/profiles` on Linux).
    pub fn default_dir() -> Result<PathBuf> {
        if let Some(dir) = std::env::var_os(PROFILE_DIR_ENV).filter(|d| !d.is_empty()) {
            return Ok(PathBuf::from(dir));
        }
        directories::ProjectDirs::from("", "", "autotune")
            .map(|d| d.data_dir().join("profiles"))
            .ok_or(ProfileError::NoDataDir)
    }

    /// The store in `dir`, creating the folder if needed.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store> {
        let dir = dir.into();
        fs::create_dir_all(&dir)
            .map_err(|e| ProfileError::io("create the profile folder", &dir, e))?;
        Ok(Store { dir })
    }

    /// The store in [`Store::default_dir`].
    pub fn open_default() -> Result<Store> {
        Store::open(Store::default_dir()?)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<model stem>--<machine fp, 12>--<model fp, 12>.toml`.
    pub fn file_name(p: &Profile) -> String {
        format!(
            "{}--{}--{}.toml",
            p.model_stem(),
            short_fingerprint(&p.machine.fingerprint),
            short_fingerprint(&p.model.fingerprint)
        )
    }

    pub fn path_for(&self, p: &Profile) -> PathBuf {
        self.dir.join(Store::file_name(p))
    }

    /// Validates and writes the profile atomically, replacing the one for the same model and machine.
    pub fn save(&self, p: &Profile) -> Result<PathBuf> {
        p.validate(false)?;
        let path = self.path_for(p);
        write_atomic(&path, &p.to_toml()?)?;
        Ok(path)
    }

    /// The profile for this machine and model, if there is one (the newest, should there be several).
    ///
    /// A matching file that cannot be parsed is moved aside and reported as [`ProfileError::Corrupt`];
    /// one that parses but fails validation is reported with its path and left for the user to fix.
    pub fn find(&self, machine_fp: &str, model_fp: &str) -> Result<Option<StoredProfile>> {
        let suffix = format!(
            "--{}--{}.toml",
            short_fingerprint(machine_fp),
            short_fingerprint(model_fp)
        );
        let mut best: Option<StoredProfile> = None;
        for path in self
            .profile_files()?
            .into_iter()
            .filter(|p| file_name_of(p).ends_with(&suffix))
        {
            let found = self.read_or_set_aside(&path)?;
            let p = &found.profile;
            if p.machine.fingerprint != machine_fp || p.model.fingerprint != model_fp {
                continue;
            }
            if best
                .as_ref()
                .is_none_or(|b| p.created_unix > b.profile.created_unix)
            {
                best = Some(found);
            }
        }
        Ok(best)
    }

    /// Every readable profile of this model, from any machine, newest first (to tell a user that a profile
    /// exists but was made elsewhere). Unreadable files are skipped here; `list` reports them.
    pub fn find_for_model(&self, model_fp: &str) -> Result<Vec<StoredProfile>> {
        let suffix = format!("--{}.toml", short_fingerprint(model_fp));
        let mut found: Vec<StoredProfile> = self
            .profile_files()?
            .into_iter()
            .filter(|p| file_name_of(p).ends_with(&suffix))
            .filter_map(|p| StoredProfile::read(&p).ok())
            .filter(|s| s.profile.model.fingerprint == model_fp)
            .collect();
        found.sort_by_key(|s| std::cmp::Reverse(s.profile.created_unix));
        Ok(found)
    }

    /// The newest profile of each model measured on this machine, by model file name (a runner's config
    /// for every model tuned here). A file that cannot be parsed is moved aside, as `find` does, and
    /// listed with the others that cannot be used.
    pub fn for_machine(&self, machine_fp: &str) -> Result<MachineProfiles> {
        let infix = format!("--{}--", short_fingerprint(machine_fp));
        let mut found = MachineProfiles {
            profiles: Vec::new(),
            unreadable: Vec::new(),
        };
        for path in self
            .profile_files()?
            .into_iter()
            .filter(|p| file_name_of(p).contains(&infix))
        {
            let stored = match self.read_or_set_aside(&path) {
                Ok(stored) => stored,
                Err(e) => {
                    found.unreadable.push((path, e));
                    continue;
                }
            };
            let p = &stored.profile;
            if p.machine.fingerprint != machine_fp {
                continue;
            }
            let same_model = found
                .profiles
                .iter_mut()
                .find(|s| s.profile.model.fingerprint == p.model.fingerprint);
            match same_model {
                Some(s) if s.profile.created_unix >= p.created_unix => {}
                Some(s) => *s = stored,
                None => found.profiles.push(stored),
            }
        }
        found.profiles.sort_by(|a, b| {
            (&a.profile.model.file_name, &a.path).cmp(&(&b.profile.model.file_name, &b.path))
        });
        Ok(found)
    }

    /// Every `.toml` file in the store with its summary or the reason it cannot be used. Never fails
    /// because of one file: an unparseable one is moved aside (to `<name>.corrupt-<unix time>`) and
    /// reported as such.
    pub fn list(&self) -> Result<Vec<StoreEntry>> {
        let mut entries = Vec::new();
        for path in self.profile_files()? {
            let result = match self.read_or_set_aside(&path) {
                Ok(s) => Ok(s.profile.summary()),
                Err(e) => Err(e.to_string()),
            };
            entries.push(StoreEntry { path, result });
        }
        Ok(entries)
    }

    /// Takes the store's lock if no other run holds it (`None` if one does).
    pub fn try_lock(&self) -> Result<Option<StoreLock>> {
        let (file, path) = self.lock_file()?;
        match file.try_lock_exclusive() {
            Ok(true) => Ok(Some(StoreLock { file, path })),
            Ok(false) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(ProfileError::io("lock", &path, e)),
        }
    }

    /// Takes the store's lock, waiting for another run to finish. Call [`Store::try_lock`] first to tell
    /// the user why nothing happens.
    pub fn lock(&self) -> Result<StoreLock> {
        let (file, path) = self.lock_file()?;
        file.lock_exclusive()
            .map_err(|e| ProfileError::io("lock", &path, e))?;
        Ok(StoreLock { file, path })
    }

    fn lock_file(&self) -> Result<(File, PathBuf)> {
        let path = self.dir.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| ProfileError::io("open the lock file", &path, e))?;
        Ok((file, path))
    }

    /// The store's profile files, sorted by name (no hidden files, temporary files or set-aside files).
    fn profile_files(&self) -> Result<Vec<PathBuf>> {
        let read = match fs::read_dir(&self.dir) {
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ProfileError::io("list the profile folder", &self.dir, e)),
        };
        let mut files = Vec::new();
        for entry in read {
            let entry =
                entry.map_err(|e| ProfileError::io("list the profile folder", &self.dir, e))?;
            let path = entry.path();
            let name = file_name_of(&path);
            if name.ends_with(".toml") && !name.starts_with('.') && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        Ok(files)
    }

    /// Reads a store file; if it cannot be parsed at all, renames it out of the way.
    fn read_or_set_aside(&self, path: &Path) -> Result<StoredProfile> {
        match StoredProfile::read(path) {
            Err(ProfileError::Parse { message, .. }) => {
                let moved_to = set_aside(path)?;
                Err(ProfileError::Corrupt {
                    path: path.to_path_buf(),
                    moved_to,
                    message,
                })
            }
            other => other,
        }
    }
}

/// Writes `text` to `path` so that readers see the old file or the new one, never half of one: a
/// temporary file in the same folder is written, flushed to disk and renamed over `path`. Keeps the
/// permissions of a file it replaces. Also used for `--out FILE`.
pub fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        ProfileError::io(
            "write",
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "not a file name"),
        )
    })?;
    let prefix = format!(".{}.", name.to_string_lossy());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // Like any new file: 0666 less the umask (tempfile's own default is 0600).
        builder.permissions(fs::Permissions::from_mode(0o666));
    }
    let mut tmp = builder
        .tempfile_in(dir)
        .map_err(|e| ProfileError::io("create a temporary file in", dir, e))?;
    if let Ok(meta) = fs::metadata(path) {
        let _ = tmp.as_file().set_permissions(meta.permissions());
    }
    tmp.write_all(text.as_bytes())
        .map_err(|e| ProfileError::io("write", tmp.path(), e))?;
    tmp.as_file()
        .sync_all()
        .map_err(|e| ProfileError::io("flush", tmp.path(), e))?;
    tmp.persist(path)
        .map_err(|e| ProfileError::io("replace", path, e.error))?;
    // The rename itself is only durable once the folder is flushed (not possible on Windows).
    #[cfg(unix)]
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn read_text(path: &Path) -> Result<String> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(ProfileError::Parse {
            path: Some(path.to_path_buf()),
            message: "not UTF-8 text".into(),
        }),
        Err(e) => Err(ProfileError::io("read", path, e)),
    }
}

/// Renames `path` to `<name>.corrupt-<unix time>` (with `-N` added if that exists) and returns the new path.
fn set_aside(path: &Path) -> Result<PathBuf> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{}.corrupt-{now}", file_name_of(path));
    let mut target = path.with_file_name(&base);
    let mut n = 1;
    while target.exists() {
        target = path.with_file_name(format!("{base}-{n}"));
        n += 1;
    }
    fs::rename(path, &target).map_err(|e| ProfileError::io("move aside", path, e))?;
    Ok(target)
}

fn short_fingerprint(fp: &str) -> String {
    fp.chars()
        .filter(char::is_ascii_alphanumeric)
        .take(FINGERPRINT_CHARS)
        .collect::<String>()
        .to_ascii_lowercase()
}

fn file_name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
