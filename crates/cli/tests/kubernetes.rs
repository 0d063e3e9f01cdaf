//! The Kubernetes manifests of `deploy/kubernetes/` (docs/deploy.md): each folder validates
//! against Kubernetes' own schemas, offline (`kubernetes-validate`, strict: an unknown or
//! misspelt field fails), for the oldest release they support (1.30, for `preStop.sleep`) and a
//! recent one; the configuration each Deployment mounts passes `tollgate validate`; and the
//! manifests agree with each other and with the image (user, ports, probes, names).
//!
//! Needs the venv `<target>/k8s-venv` with `kubernetes-validate` (`scripts/test.sh` installs
//! it).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![cfg(unix)]

mod deploy_support;

use std::process::Command;

use deploy_support::*;
use serde_json::Value;

/// The oldest Kubernetes the manifests are for (the `sleep` preStop action is beta and on by
/// default from 1.30), and the newest `kubernetes-validate` carries.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.30.0", "1.37.0"];

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    for example in EXAMPLES {
        let files = manifest_files(example);
        let documents: usize = files.iter().map(|f| yaml_docs(f).len()).sum();
        for version in KUBERNETES_VERSIONS {
            let out = Command::new(venv_bin("kubernetes-validate"))
                .args(["--strict", "--kubernetes-version", version])
                .args(&files)
                .output()
                .unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                out.status.success(),
                "{example}, Kubernetes {version}:\n{text}"
            );
            // Every document was validated, none skipped as unknown.
            assert_eq!(
                text.matches(" passed for resource ").count(),
                documents,
                "{example}, Kubernetes {version}:\n{text}"
            );
        }
    }
}

#[test]
fn the_configuration_each_deployment_mounts_passes_tollgate_validate() {
    for example in EXAMPLES {
        let ex = Example::load(example);
        let out = Command::new(BIN)
            .arg("validate")
            .arg(ex.config())
            .envs(ex.env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: tollgate validate {}:\n{}",
            ex.config().display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        if example == "envoy" {
            assert!(printed.contains("envoy domain \"edge\""), "{printed}");
        } else {
            assert!(
                printed.starts_with("default: sliding_window_counter limit=100"),
                "{printed}"
            );
        }
    }
}

/// The image's user, from the Containerfile (scripts/image.sh builds its last stage).
fn image_user() -> (u64, u64) {
    let text = std::fs::read_to_string(repo_root().join("Containerfile")).unwrap();
    let user = text
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER line");
    let (uid, gid) = user.trim().split_once(':').unwrap();
    (uid.parse().unwrap(), gid.parse().unwrap())
}

/// The restricted Pod Security Standard, and then some, for every Deployment.
fn assert_locked_down(example: &str, deployment: &Value) {
    let name = str_at(deployment, "/metadata/name");
    let spec = &deployment["spec"]["template"]["spec"];
    let at = format!("{example}: Deployment {name}");
    assert_eq!(spec["automountServiceAccountToken"], false, "{at}");
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{at}");
    assert_eq!(
        spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{at}"
    );
    assert!(
        spec["securityContext"]["runAsUser"].as_u64().unwrap() > 0,
        "{at}"
    );
    for c in spec["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{at}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{at}");
        assert_eq!(sc["runAsNonRoot"], true, "{at}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{at}"
        );
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{at}: a memory limit"
        );
    }
}

/// `host:port` of a listen address.
fn port_of(listen: &str) -> u64 {
    listen.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn the_deployments_are_locked_down_and_probe_the_admin_listener() {
    let (uid, gid) = image_user();
    for example in EXAMPLES {
        let ex = Example::load(example);
        for d in ex.docs.iter().filter(|d| d["kind"] == "Deployment") {
            assert_locked_down(example, d);
        }
        let spec = &ex.deployment["spec"]["template"]["spec"];
        // The image's own user, by number (runAsNonRoot can only check a number).
        assert_eq!(
            spec["securityContext"]["runAsUser"].as_u64(),
            Some(uid),
            "{example}"
        );
        assert_eq!(
            spec["securityContext"]["runAsGroup"].as_u64(),
            Some(gid),
            "{example}"
        );
        assert_eq!(
            str_at(&ex.container, "/image"),
            format!("localhost/tollgate:{}", env!("CARGO_PKG_VERSION")),
            "{example}: the image scripts/image.sh tags"
        );
        // SIGTERM drains for up to 30 s, after the preStop pause: Kubernetes must wait longer
        // before it kills.
        let pause = ex.container["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or(0);
        let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
        assert!(
            grace > pause + 30,
            "{example}: grace {grace} s, preStop {pause} s"
        );

        // The ports and probes match the listeners of the configuration it mounts.
        let config = toml_value(&ex.config());
        assert_eq!(
            u64::from(ex.port("http")),
            port_of(str_at(&config, "/server/listen"))
        );
        assert_eq!(
            u64::from(ex.port("admin")),
            port_of(str_at(&config, "/admin/listen"))
        );
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &ex.container[probe]["httpGet"];
            assert_eq!(get["path"], path, "{example}: {probe}");
            assert_eq!(get["port"], "admin", "{example}: {probe}");
        }
        for listen in ["/server/listen", "/admin/listen"] {
            assert!(
                str_at(&config, listen).starts_with("0.0.0.0:"),
                "{example}: {listen} must be reachable from outside the pod"
            );
        }

        // Services and the PodDisruptionBudget select the Deployment's pods, on its ports.
        let labels = &ex.deployment["spec"]["template"]["metadata"]["labels"];
        let names: Vec<&str> = ex.container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| str_at(p, "/name"))
            .collect();
        for s in ex.docs.iter().filter(|d| d["kind"] == "Service") {
            let Some(selector) = s["spec"]["selector"].as_object() else {
                continue;
            };
            if selector.iter().any(|(k, v)| &labels[k] != v) {
                continue; // another Deployment's (Redis, Envoy)
            }
            for p in s["spec"]["ports"].as_array().unwrap() {
                let target = str_at(p, "/targetPort");
                assert!(names.contains(&target), "{example}: Service port {target}");
                assert_ne!(
                    target, "admin",
                    "{example}: the admin listener stays off Services"
                );
            }
        }
        if example != "envoy" {
            let pdb = find(&ex.docs, "PodDisruptionBudget", "tollgate");
            let selector = pdb["spec"]["selector"]["matchLabels"].as_object().unwrap();
            assert!(
                selector.iter().all(|(k, v)| &labels[k] == v),
                "{example}: PDB selector"
            );
        }
    }
}

#[test]
fn the_redis_example_shares_one_redis_under_one_key_secret() {
    let ex = Example::load("redis");
    let config = toml_value(&ex.config());
    assert_eq!(config["store"]["kind"], "redis");
    let url = str_at(&config, "/store/url");
    let redis = find(&ex.docs, "Service", "tollgate-redis");
    let port = redis["spec"]["ports"][0]["port"].as_u64().unwrap();
    assert_eq!(url, format!("redis://tollgate-redis:{port}"));
    let secret_env = str_at(&config, "/store/key_secret_env");
    assert!(
        ex.env.iter().any(|(k, _)| k == secret_env),
        "the Deployment sets {secret_env}"
    );
    assert!(ex.deployment["spec"]["replicas"].as_u64().unwrap() > 1);
}

#[test]
fn the_envoy_example_points_envoy_at_tollgates_grpc_listener() {
    let ex = Example::load("envoy");
    let config = toml_value(&ex.config());
    let grpc = port_of(str_at(&config, "/server/grpc_listen"));
    assert_eq!(u64::from(ex.port("grpc")), grpc);
    // The descriptors folder is the one the Deployment mounts.
    let config_dir = ex
        .config()
        .parent()
        .unwrap()
        .join(str_at(&config, "/envoy/config_dir"));
    let (dir, _) = ex
        .mounts
        .iter()
        .find(|(dir, _)| dir.canonicalize().ok() == config_dir.canonicalize().ok())
        .expect("[envoy] config_dir is a mounted ConfigMap");
    let descriptors = yaml_docs(&dir.join("edge.yaml"));
    let domain = str_at(&descriptors[0], "/domain");

    // Envoy's configuration: the ratelimit filter's domain, and its cluster on the gRPC Service.
    let envoy_map = find(&ex.docs, "ConfigMap", "envoy");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), str_at(envoy_map, "/data/envoy.yaml")).unwrap();
    let envoy = yaml_docs(file.path()).remove(0);
    let listener = &envoy["static_resources"]["listeners"][0];
    let hcm = &listener["filter_chains"][0]["filters"][0]["typed_config"];
    let filter = hcm["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the ratelimit filter");
    assert_eq!(str_at(filter, "/typed_config/domain"), domain);
    let cluster_name = str_at(
        filter,
        "/typed_config/rate_limit_service/grpc_service/envoy_grpc/cluster_name",
    );
    let cluster = envoy["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == cluster_name)
        .expect("the rate limit service's cluster");
    let address = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
        ["socket_address"];
    let service = find(&ex.docs, "Service", str_at(address, "/address"));
    let port = &service["spec"]["ports"][0];
    assert_eq!(address["port_value"], port["port"]);
    assert_eq!(port["targetPort"], "grpc");
    // gRPC is HTTP/2: Envoy must speak it to the cluster.
    assert!(
        cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            ["explicit_http_config"]["http2_protocol_options"]
            .is_object()
    );
}
