//! A folder of envoyproxy/ratelimit YAML files is read as the peer reads its runtime
//! directory: subfolders included, in path order, hidden entries (editor swap files, a mounted
//! Kubernetes ConfigMap's `..data` and timestamped folders) skipped, links to files followed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use tollgate_envoy::{envoy_config_files, load_envoy_config_dir};

fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("envoy-dir-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, rel: &str, domain: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("domain: {domain}\n")).unwrap();
}

#[test]
fn subfolders_are_read_and_hidden_entries_skipped() {
    let dir = temp_dir("tree");
    write(&dir, "b.yaml", "b");
    write(&dir, "a/z.yml", "az");
    write(&dir, "a/deeper/c.yaml", "c");
    write(&dir, ".b.yaml.swp.yaml", "swap");
    write(&dir, ".hidden/d.yaml", "hidden");
    std::fs::write(dir.join("notes.txt"), "not configuration").unwrap();
    let files = envoy_config_files(&dir).unwrap();
    let rel: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&dir).unwrap().display().to_string())
        .collect();
    assert_eq!(rel, ["a/deeper/c.yaml", "a/z.yml", "b.yaml"]);
    let names: Vec<String> = load_envoy_config_dir(&dir)
        .unwrap()
        .iter()
        .map(|d| d.name().to_owned())
        .collect();
    assert_eq!(names, ["c", "az", "b"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(unix)]
#[test]
fn a_mounted_configmap_is_read_once_through_its_links() {
    // What the kubelet mounts: the real files in a timestamped hidden folder, `..data` linking
    // to it, and one link per key at the top.
    let dir = temp_dir("configmap");
    write(&dir, "..2024_01_01_00_00_00.1/edge.yaml", "edge");
    std::os::unix::fs::symlink("..2024_01_01_00_00_00.1", dir.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/edge.yaml", dir.join("edge.yaml")).unwrap();
    let names: Vec<String> = load_envoy_config_dir(&dir)
        .unwrap()
        .iter()
        .map(|d| d.name().to_owned())
        .collect();
    assert_eq!(names, ["edge"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_folder_or_a_bad_file_is_named() {
    let dir = temp_dir("bad");
    let missing = dir.join("nope");
    let err = load_envoy_config_dir(&missing).unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(
        dir.join("sub/broken.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
    )
    .unwrap();
    let err = load_envoy_config_dir(&dir).unwrap_err().to_string();
    assert!(
        err.contains("sub/broken.yaml") && err.contains("d.k") && err.contains("fortnight"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
