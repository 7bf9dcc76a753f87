//! Tests of the profile store: saving, finding, listing, locking, atomic writes.

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
        "\"--spec-type\", \"none\"]",
        "\"--spec-type\", \"none\", \"--foo\"]",
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
