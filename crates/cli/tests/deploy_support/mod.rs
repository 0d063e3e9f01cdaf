//! What the container image and Kubernetes manifest tests share: the manifests of
//! `deploy/kubernetes/`, read as JSON (PyYAML, from the `kubernetes-validate` venv that
//! `scripts/test.sh` installs), and an example's configuration laid out on disk the way its
//! Deployment mounts its ConfigMaps, so that `tollgate validate` and the image can run on it.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// The version of `kubernetes-validate` that `scripts/test.sh` installs.
pub const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cargo target folder this test was built into (`BIN` is `<target>/debug/tollgate`).
pub fn target_dir() -> PathBuf {
    Path::new(BIN)
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf()
}

/// The venv `scripts/test.sh` installs `kubernetes-validate` into (with PyYAML), next to the
/// test build.
pub fn venv_bin(program: &str) -> PathBuf {
    let venv = target_dir().join("k8s-venv");
    let path = venv.join("bin").join(program);
    assert!(
        path.exists(),
        "{} is missing: scripts/test.sh installs it, or run\n  python3 -m venv {} && {}/bin/pip install {KUBERNETES_VALIDATE}",
        path.display(),
        venv.display(),
        venv.display()
    );
    path
}

/// Runs a Python snippet from the venv that prints JSON, and parses it.
fn python_json(script: &str, file: &Path) -> Value {
    let out = Command::new(venv_bin("python"))
        .args(["-c", script])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python on {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every YAML document of a file, as JSON.
pub fn yaml_docs(file: &Path) -> Vec<Value> {
    let script = "import json, sys, yaml\n\
                  print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))";
    match python_json(script, file) {
        Value::Array(docs) => docs,
        other => panic!("{}: not a list of documents: {other}", file.display()),
    }
}

/// A TOML file as JSON (Python's tomllib).
pub fn toml_value(file: &Path) -> Value {
    python_json(
        "import json, sys, tomllib\nprint(json.dumps(tomllib.load(open(sys.argv[1], 'rb'))))",
        file,
    )
}

/// The example folders under `deploy/kubernetes/`, by name.
pub const EXAMPLES: [&str; 3] = ["tollgate", "redis", "envoy"];

/// The `*.yaml` files of an example folder, sorted.
pub fn manifest_files(example: &str) -> Vec<PathBuf> {
    let dir = repo_root().join("deploy/kubernetes").join(example);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    files
}

/// Every document of an example folder.
pub fn manifests(example: &str) -> Vec<Value> {
    manifest_files(example)
        .iter()
        .flat_map(|f| yaml_docs(f))
        .collect()
}

/// The document of `kind` named `name`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name:?}"))
}

/// The string at a JSON pointer.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v}"))
}

/// An example's Tollgate as its Deployment runs it: the ConfigMaps it mounts, written under a
/// temporary root at their mount paths (`<root>/etc/tollgate/tollgate.toml`, ...).
pub struct Example {
    pub docs: Vec<Value>,
    pub deployment: Value,
    /// The `tollgate` container of the Deployment.
    pub container: Value,
    /// The container's arguments (`serve --config /etc/tollgate/tollgate.toml`).
    pub args: Vec<String>,
    /// Each mounted ConfigMap: the folder written here, and where the container mounts it.
    pub mounts: Vec<(PathBuf, String)>,
    /// The container's environment, secrets given a stand-in value.
    pub env: Vec<(String, String)>,
    root: tempfile::TempDir,
}

impl Example {
    pub fn load(name: &str) -> Example {
        let docs = manifests(name);
        let deployment = find(&docs, "Deployment", "tollgate").clone();
        let spec = &deployment["spec"]["template"]["spec"];
        let container = spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "tollgate")
            .expect("a container named tollgate")
            .clone();
        let args = container["args"]
            .as_array()
            .expect("the container's args")
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let root = tempfile::tempdir().unwrap();
        // The container's user (not root) must read what is mounted.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut mounts = Vec::new();
        for mount in container["volumeMounts"].as_array().unwrap() {
            let volume = spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap_or_else(|| panic!("no volume for {mount}"));
            let map_name = str_at(volume, "/configMap/name");
            let map = find(&docs, "ConfigMap", map_name);
            let at = str_at(mount, "/mountPath").to_owned();
            let dir = root.path().join(at.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            for (key, text) in map["data"].as_object().unwrap() {
                let file = dir.join(key);
                std::fs::write(&file, text.as_str().unwrap()).unwrap();
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            }
            let mut d = dir.clone();
            while d != root.path() {
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
                d = d.parent().unwrap().to_path_buf();
            }
            mounts.push((dir, at));
        }
        let env = container["env"]
            .as_array()
            .map(|vars| {
                vars.iter()
                    .map(|v| {
                        let value = match v["value"].as_str() {
                            Some(s) => s.to_owned(),
                            None => format!(
                                "stand-in-for-{}",
                                str_at(v, "/valueFrom/secretKeyRef/name")
                            ),
                        };
                        (str_at(v, "/name").to_owned(), value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Example {
            docs,
            deployment,
            container,
            args,
            mounts,
            env,
            root,
        }
    }

    /// The path the container's `--config` names, inside the container.
    pub fn config_in_container(&self) -> &str {
        let at = self
            .args
            .iter()
            .position(|a| a == "--config")
            .expect("the container runs with --config");
        &self.args[at + 1]
    }

    /// The same file, written here.
    pub fn config(&self) -> PathBuf {
        self.root
            .path()
            .join(self.config_in_container().trim_start_matches('/'))
    }

    /// The port a container port is named after.
    pub fn port(&self, name: &str) -> u16 {
        self.container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("no container port named {name}"))
    }
}
