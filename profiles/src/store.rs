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
mod tests {
    use super::*;
    use crate::example_profile;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| file_name_of(&e.unwrap().path()))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn file_names_carry_model_and_fingerprints() {
        assert_eq!(
            Store::file_name(&example_profile()),
            "Qwen3-4B-Q4_K_M--9b1c9b1c9b1c--3f2a3f2a3f2a.toml"
        );
    }

    #[test]
    fn save_then_find() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("profiles")).unwrap();
        let p = example_profile();
        let path = store.save(&p).unwrap();
        assert_eq!(names(store.dir()), [Store::file_name(&p)]);

        let found = store
            .find(&p.machine.fingerprint, &p.model.fingerprint)
            .unwrap()
            .unwrap();
        assert_eq!(found.path, path);
        assert_eq!(found.profile, p);
        assert!(found.warnings.is_empty());

        assert!(store
            .find(&"0".repeat(64), &p.model.fingerprint)
            .unwrap()
            .is_none());
        assert_eq!(store.find_for_model(&p.model.fingerprint).unwrap().len(), 1);
        assert!(store.find_for_model(&"0".repeat(64)).unwrap().is_empty());
    }

    #[test]
    fn for_machine_gives_the_newest_profile_of_each_model_measured_here() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = example_profile();
        store.save(&a).unwrap();
        // The same model under another file name, measured later: it replaces `a`.
        let mut newer = a.clone();
        newer.model.file_name = "renamed.gguf".into();
        newer.created_unix += 60;
        store.save(&newer).unwrap();
        let mut b = a.clone();
        b.model.fingerprint = "7".repeat(64);
        b.model.file_name = "other.gguf".into();
        store.save(&b).unwrap();
        let mut elsewhere = b.clone();
        elsewhere.machine.fingerprint = "5".repeat(64);
        store.save(&elsewhere).unwrap();
        let corrupt = dir
            .path()
            .join(Store::file_name(&a).replace("Qwen3", "broken"));
        fs::write(&corrupt, "not = [a profile").unwrap();

        let here = store.for_machine(&a.machine.fingerprint).unwrap();
        let files: Vec<&str> = here
            .profiles
            .iter()
            .map(|s| s.profile.model.file_name.as_str())
            .collect();
        assert_eq!(files, ["other.gguf", "renamed.gguf"]);
        assert_eq!(here.unreadable.len(), 1);
        assert_eq!(here.unreadable[0].0, corrupt);
        assert!(matches!(here.unreadable[0].1, ProfileError::Corrupt { .. }));
        assert!(!corrupt.exists(), "moved aside");
        assert!(store
            .for_machine(&"0".repeat(64))
            .unwrap()
            .profiles
            .is_empty());
    }

    #[test]
    fn save_refuses_an_invalid_profile() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut p = example_profile();
        p.server_args.push("--foo".into());
        assert!(matches!(store.save(&p), Err(ProfileError::Invalid { .. })));
        assert!(names(store.dir()).is_empty());
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.toml");
        write_atomic(&path, "a = 1\n").unwrap();
        write_atomic(&path, "a = 2\n").unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "a = 2\n");
        assert_eq!(names(dir.path()), ["out.toml"]);

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
            write_atomic(&path, "a = 3\n").unwrap();
            assert_eq!(
                fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o640
            );
        }

        let missing = dir.path().join("no-such-dir").join("x.toml");
        let err = write_atomic(&missing, "x").unwrap_err();
        assert!(err.to_string().contains("no-such-dir"), "{err}");
        assert_eq!(names(dir.path()), ["out.toml"]);
    }

    #[test]
    fn a_corrupt_entry_is_set_aside_and_listed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let p = example_profile();
        store.save(&p).unwrap();
        let mut other = example_profile();
        other.model.fingerprint = "ab".repeat(32);
        other.model.file_name = "Other.gguf".into();
        let broken = store.path_for(&other);
        fs::write(&broken, "schema_version = 1\nthis is not toml").unwrap();

        let entries = store.list().unwrap();
        assert_eq!(entries.len(), 2);
        let bad = entries.iter().find(|e| e.path == broken).unwrap();
        let msg = bad.result.as_ref().unwrap_err();
        assert!(
            msg.contains("could not be read") && msg.contains(".corrupt-"),
            "{msg}"
        );
        let good = entries.iter().find(|e| e.path != broken).unwrap();
        assert_eq!(
            good.result.as_ref().unwrap().model_file,
            "Qwen3-4B-Q4_K_M.gguf"
        );

        let names = names(store.dir());
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("Other--") && n.contains(".toml.corrupt-")),
            "{names:?}"
        );
        // Once set aside, it is no longer listed.
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn find_sets_aside_a_corrupt_match_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let p = example_profile();
        let path = store.path_for(&p);
        let text = p
            .to_toml()
            .unwrap()
            .replacen("threads = 8", "threads = \"4; rm -rf /\"", 1);
        fs::write(&path, text).unwrap();

        let err = store
            .find(&p.machine.fingerprint, &p.model.fingerprint)
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ProfileError::Corrupt { .. }), "{err:?}");
        assert!(
            msg.contains("winner.threads") && msg.contains("moved aside"),
            "{msg}"
        );
        assert!(store
            .find(&p.machine.fingerprint, &p.model.fingerprint)
            .unwrap()
            .is_none());
    }

    #[test]
    fn an_invalid_match_is_reported_with_its_path_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let p = example_profile();
        let path = store.path_for(&p);
        let text = p.to_toml().unwrap().replacen(
            "\"--device\", \"CUDA0\"]",
            "\"--device\", \"CUDA0\", \"--foo\"]",
            1,
        );
        fs::write(&path, text).unwrap();

        let err = store
            .find(&p.machine.fingerprint, &p.model.fingerprint)
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&path.display().to_string()) && msg.contains("unexpected '--foo'"),
            "{msg}"
        );
        assert!(path.exists());
        let listed = store.list().unwrap();
        assert!(listed[0]
            .result
            .as_ref()
            .unwrap_err()
            .contains("unexpected '--foo'"));
    }

    #[test]
    fn another_schema_version_is_not_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let p = example_profile();
        let path = store.path_for(&p);
        fs::write(
            &path,
            p.to_toml()
                .unwrap()
                .replacen("schema_version = 1", "schema_version = 7", 1),
        )
        .unwrap();
        let err = store
            .find(&p.machine.fingerprint, &p.model.fingerprint)
            .unwrap_err();
        assert!(
            matches!(err, ProfileError::SchemaVersion { found: 7, .. }),
            "{err:?}"
        );
        assert!(path.exists());
    }

    #[test]
    fn unknown_keys_come_back_as_warnings() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let p = example_profile();
        let path = store.path_for(&p);
        fs::write(
            &path,
            p.to_toml()
                .unwrap()
                .replacen("[workload]\n", "[workload]\nbogus = 1\n", 1),
        )
        .unwrap();
        let found = store
            .find(&p.machine.fingerprint, &p.model.fingerprint)
            .unwrap()
            .unwrap();
        assert_eq!(found.warnings, ["unknown key `workload.bogus` ignored"]);
    }

    #[test]
    fn the_lock_is_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let held = store.try_lock().unwrap().expect("free at first");
        assert!(store.try_lock().unwrap().is_none());
        drop(held);
        let again = store.lock().unwrap();
        assert!(store.try_lock().unwrap().is_none());
        assert_eq!(again.path(), dir.path().join(".lock"));
        drop(again);
        assert!(
            store.list().unwrap().is_empty(),
            "the lock file is not a profile"
        );
    }

    #[test]
    fn the_environment_overrides_the_default_folder() {
        // The only test that touches this variable, so setting it does not race with others.
        std::env::set_var(PROFILE_DIR_ENV, "/tmp/autotune-profiles-test");
        assert_eq!(
            Store::default_dir().unwrap(),
            Path::new("/tmp/autotune-profiles-test")
        );
        std::env::remove_var(PROFILE_DIR_ENV);
        let dir = Store::default_dir().unwrap();
        assert!(dir.ends_with("profiles"), "{}", dir.display());
    }
}
