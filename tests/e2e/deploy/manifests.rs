//! deploy/compose.yaml, deploy/kubernetes/ and deploy/systemd/: every variable and flag they
//! set is one the binary reads, the ports agree and cannot collide, the keyring reaches only
//! the processes that seal or open, and a stopping worker gets the time it takes to hand its
//! runs back.

use std::collections::{BTreeMap, BTreeSet};

use countersign_e2e::{binary, database_url, workspace_file};
use yaml_rust2::{Yaml, YamlLoader};

use super::{entries, port_of, process, scalar, strings, yaml, Process};

/// How long a stopping worker may still take after its grace period (one lease time to
/// live): the time it gives itself to hand the remaining runs back (`RELEASE_TIMEOUT` in
/// crates/worker/src/service.rs).
const HAND_BACK_SECS: u64 = 10;

/// The binaries that seal or open, and so hold the keyring.
const KEY_HOLDERS: [&str; 4] = [
    "countersign",
    "countersign-api",
    "countersign-coordinator",
    "countersign-worker",
];

/// The ports of systemd worker instances (the instance name is the port): none of them is
/// another unit's.
const SYSTEMD_WORKER_PORTS: std::ops::RangeInclusive<u16> = 9470..=9499;

fn assert_all_known(processes: &[Process]) {
    let unknown: Vec<String> = processes
        .iter()
        .flat_map(Process::unknown_settings)
        .collect();
    assert!(
        unknown.is_empty(),
        "set but not read by the binary (not in its --help): {unknown:#?}"
    );
}

// ---- compose ----------------------------------------------------------------------------

fn compose() -> Yaml {
    yaml("deploy/compose.yaml").remove(0)
}

/// The compose services that run a countersign binary, with what each is given.
fn compose_processes(compose: &Yaml) -> Vec<(String, Process, Yaml)> {
    entries(&compose["services"])
        .into_iter()
        .filter(|(_, service)| service["build"].as_hash().is_some())
        .map(|(name, service)| {
            assert!(
                service["env_file"].is_badvalue(),
                "{name}: an env_file hides what reaches the process; set `environment`"
            );
            let mut argv = strings(&service["entrypoint"]);
            argv.extend(strings(&service["command"]));
            let env = match &service["environment"] {
                Yaml::Array(items) => items
                    .iter()
                    .map(|item| {
                        let item = scalar(item).expect("NAME=value");
                        let (k, v) = item.split_once('=').unwrap_or((&item, ""));
                        (k.to_owned(), v.to_owned())
                    })
                    .collect(),
                map => entries(map)
                    .into_iter()
                    .map(|(k, v)| (k, scalar(v).unwrap_or_default()))
                    .collect(),
            };
            let p = process(format!("compose.yaml: {name}"), argv, env);
            (name, p, service.clone())
        })
        .collect()
}

#[test]
fn every_variable_and_flag_the_compose_file_sets_is_read_by_its_binary() {
    let compose = compose();
    let processes: Vec<Process> = compose_processes(&compose)
        .into_iter()
        .map(|(_, p, _)| p)
        .collect();
    let binaries: BTreeSet<&str> = processes.iter().map(Process::binary).collect();
    assert_eq!(
        binaries,
        BTreeSet::from([
            "countersign",
            "countersign-api",
            "countersign-coordinator",
            "countersign-reaper",
            "countersign-worker"
        ]),
        "compose runs the migrations, the four services and the operator's command line"
    );
    assert_all_known(&processes);
}

#[test]
fn compose_publishes_no_host_port_twice_and_prometheus_scrapes_each_service_where_it_listens() {
    let compose = compose();
    let mut published = BTreeMap::new();
    for (name, service) in entries(&compose["services"]) {
        for port in strings(&service["ports"]) {
            // [host_ip:]host_port:container_port
            let parts: Vec<&str> = port.split(':').collect();
            assert!(
                parts.len() >= 2,
                "{name}: publish {port} with an explicit host port"
            );
            let host = parts[..parts.len() - 1].join(":");
            if let Some(other) = published.insert(host.clone(), name.clone()) {
                panic!("{name} and {other} both publish {host}");
            }
        }
    }

    let listening: BTreeMap<String, String> = compose_processes(&compose)
        .into_iter()
        .filter_map(|(name, p, _)| Some((name, p.http_port()?)))
        .collect();
    let prometheus = yaml("deploy/prometheus/prometheus.yml").remove(0);
    let mut scraped = BTreeMap::new();
    for job in prometheus["scrape_configs"]
        .as_vec()
        .expect("scrape_configs")
    {
        for config in job["static_configs"].as_vec().expect("static_configs") {
            for target in strings(&config["targets"]) {
                let (host, port) = target.split_once(':').expect("host:port");
                scraped.insert(host.to_owned(), port.to_owned());
            }
        }
    }
    assert_eq!(
        scraped, listening,
        "Prometheus scrapes every service that serves /metrics, on the port it binds"
    );
    for service in ["coordinator", "worker-1", "worker-2", "api", "reaper"] {
        assert!(
            listening.contains_key(service),
            "{service} serves no /metrics"
        );
    }
}

#[test]
fn compose_gives_a_stopping_worker_the_time_to_hand_its_runs_back() {
    let compose = compose();
    let workers: Vec<_> = compose_processes(&compose)
        .into_iter()
        .filter(|(_, p, _)| p.binary() == "countersign-worker")
        .collect();
    assert_eq!(workers.len(), 2, "two workers");
    for (name, p, service) in workers {
        let grace = scalar(&service["stop_grace_period"])
            .unwrap_or_else(|| panic!("{name}: no stop_grace_period (compose's default is 10 s)"));
        let secs: u64 = grace
            .strip_suffix('s')
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{name}: stop_grace_period {grace} in seconds, e.g. 45s"));
        assert!(
            secs >= p.lease_ttl_secs() + HAND_BACK_SECS,
            "{name}: {secs} s to stop, but a worker may take one lease ({} s) and {HAND_BACK_SECS} s more",
            p.lease_ttl_secs()
        );
        assert_ne!(
            p.env.get("COUNTERSIGN_WORKER_ID"),
            None,
            "{name}: a lease owner name a person can read"
        );
    }
}

#[test]
fn compose_gives_the_keyring_only_to_the_processes_that_seal_or_open() {
    let compose = compose();
    for (name, p, service) in compose_processes(&compose) {
        let has_secret = strings(&service["secrets"]).contains(&"countersign-keys".to_owned());
        let holds = KEY_HOLDERS.contains(&p.binary())
            && p.command.get(1).map(String::as_str) != Some("migrate");
        assert_eq!(has_secret, holds, "{name}: the keyring secret");
        assert_eq!(
            p.env.contains_key("COUNTERSIGN_KEY_FILE"),
            holds,
            "{name}: COUNTERSIGN_KEY_FILE"
        );
        assert!(
            !p.env.contains_key("COUNTERSIGN_KEYS"),
            "{name}: the keyring as a variable shows in `docker inspect`; use the secret"
        );
    }
}

#[test]
fn every_countersign_service_in_compose_is_health_checked_on_its_own_readiness_port() {
    let compose = compose();
    let mut checked = BTreeSet::new();
    for (name, p, service) in compose_processes(&compose) {
        let Some(port) = p.http_port() else {
            // The migrations and the operator's command line end, and serve nothing.
            assert_eq!(
                scalar(&service["restart"]).as_deref(),
                Some("no"),
                "{name} serves no /readyz, so it must be a one-shot"
            );
            continue;
        };
        let check = &service["healthcheck"];
        assert_eq!(
            strings(&check["test"]),
            [
                "CMD".to_owned(),
                "countersign".to_owned(),
                "healthcheck".to_owned(),
                format!("http://127.0.0.1:{port}/readyz"),
            ],
            "{name}: the image has no shell; `countersign healthcheck` asks its own /readyz"
        );
        for key in ["interval", "timeout", "retries", "start_period"] {
            assert!(scalar(&check[key]).is_some(), "{name}: healthcheck {key}");
        }
        checked.insert(name);
    }
    assert_eq!(
        checked,
        ["api", "coordinator", "reaper", "worker-1", "worker-2"]
            .map(str::to_owned)
            .into(),
    );
    assert!(
        super::help(&["countersign", "healthcheck"])
            .flags
            .contains("--timeout-secs"),
        "countersign has a healthcheck subcommand"
    );
}

// ---- README and docs/ ----------------------------------------------------------------------

/// The markdown files whose shell examples start services: README.md, then every page of
/// docs/, in name order.
fn documentation_files() -> Vec<String> {
    let mut pages: Vec<String> = std::fs::read_dir(workspace_file("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    std::iter::once("README.md".to_owned())
        .chain(pages)
        .collect()
}

/// The binaries README and the pages of docs/ start in their shell examples, with what they
/// are given (a command continued with `\` is one line; a comment or `&` ends it).
fn readme_processes() -> Vec<Process> {
    let mut processes = Vec::new();
    for file in documentation_files() {
        let text = std::fs::read_to_string(workspace_file(&file)).unwrap();
        let (mut in_code, mut pending) = (false, String::new());
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if !in_code {
                continue;
            }
            if let Some(head) = line.trim_end().strip_suffix('\\') {
                pending.push_str(head);
                continue;
            }
            let command = std::mem::take(&mut pending) + line;
            let words: Vec<&str> = command
                .split('#')
                .next()
                .unwrap()
                .split_whitespace()
                .take_while(|w| !matches!(*w, "&" | "&&" | "|" | ";"))
                .collect();
            let Some(at) = words.iter().position(|w| SERVICES.contains(w)) else {
                continue;
            };
            let env = words[..at]
                .iter()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            let argv = words[at..].iter().map(|w| (*w).to_owned()).collect();
            processes.push(process(format!("{file}:{}", n + 1), argv, env));
        }
    }
    processes
}

/// The service binaries (the operator's `countersign` serves nothing).
const SERVICES: [&str; 4] = [
    "countersign-api",
    "countersign-coordinator",
    "countersign-reaper",
    "countersign-worker",
];

#[test]
fn every_flag_readme_gives_a_service_is_read_by_it() {
    let processes = readme_processes();
    let binaries: BTreeSet<&str> = processes
        .iter()
        .filter(|p| p.origin.starts_with("README.md"))
        .map(Process::binary)
        .collect();
    assert_eq!(
        binaries,
        BTreeSet::from(SERVICES),
        "README starts each service"
    );
    assert_all_known(&processes);
}

/// `(binary, surface) → where → port`, for the ports each deployment and README give: `http`
/// (`/metrics`, `/healthz`, `/readyz`) and `api` (`/v1`, `/inbox`).
type Ports = BTreeMap<(String, &'static str), BTreeMap<String, String>>;

fn record_ports(ports: &mut Ports, p: &Process) {
    for (surface, port) in [("http", p.http_port()), ("api", p.api_port())] {
        // A systemd worker's port is its instance name (see the worker tests below).
        if let Some(port) = port.filter(|port| port != "%i") {
            ports
                .entry((p.binary().to_owned(), surface))
                .or_default()
                .insert(p.origin.clone(), port);
        }
    }
}

#[test]
fn readme_compose_kubernetes_and_systemd_give_each_service_the_same_ports() {
    let mut ports = Ports::new();
    let compose = compose();
    let from_compose: Vec<Process> = compose_processes(&compose)
        .into_iter()
        .map(|(_, p, _)| p)
        .collect();
    let from_kubernetes = kubernetes_processes(&kubernetes())
        .into_iter()
        .map(|(_, p, _, _)| p);
    let from_systemd = SERVICE_UNITS.iter().map(|f| systemd_process(f).0);
    for p in from_compose
        .iter()
        .cloned()
        .chain(from_kubernetes)
        .chain(from_systemd)
        .chain(readme_processes())
    {
        record_ports(&mut ports, &p);
    }
    for binary in [
        "countersign-api",
        "countersign-coordinator",
        "countersign-worker",
    ] {
        assert!(
            ports[&(binary.to_owned(), "http")]
                .keys()
                .any(|o| o.starts_with("README.md")),
            "README gives {binary} no --http-addr"
        );
    }
    for ((binary, surface), by_origin) in &ports {
        let numbers: BTreeSet<&String> = by_origin.values().collect();
        assert_eq!(
            numbers.len(),
            1,
            "{binary} serves {surface} on different ports: {by_origin:#?}"
        );
        assert!(
            by_origin.keys().any(|o| o.starts_with("compose.yaml")),
            "{binary} {surface}: compose runs it elsewhere: {by_origin:#?}"
        );
    }
    // Where every service runs on one host, no two share a port.
    let mut taken = BTreeMap::new();
    for ((binary, surface), by_origin) in &ports {
        let port = by_origin.values().next().unwrap();
        if let Some(other) = taken.insert(port.clone(), format!("{binary} {surface}")) {
            panic!("{binary} {surface} and {other} both use {port}");
        }
    }
}

// ---- Kubernetes -------------------------------------------------------------------------

/// Every manifest of deploy/kubernetes/: what kustomize applies, the migration Job applied
/// on its own, and the example of the Secrets.
fn kubernetes() -> Vec<(String, Yaml)> {
    kubernetes_files()
        .into_iter()
        .flat_map(|f| {
            yaml(&format!("deploy/kubernetes/{f}"))
                .into_iter()
                .map(move |doc| (f.clone(), doc))
        })
        .collect()
}

/// The files of [`kubernetes`], checked to be every manifest on disk.
fn kubernetes_files() -> Vec<String> {
    let kustomization = yaml("deploy/kubernetes/kustomization.yaml").remove(0);
    let mut files = strings(&kustomization["resources"]);
    files.extend([
        "migrate-job.yaml".to_owned(),
        "secrets.example.yaml".to_owned(),
    ]);
    let on_disk: BTreeSet<String> = std::fs::read_dir(workspace_file("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
        .collect();
    assert_eq!(
        on_disk,
        files.iter().cloned().collect(),
        "every manifest is applied by kustomize, or is the migration Job or the Secrets' example"
    );
    files
}

fn kind(doc: &Yaml) -> &str {
    doc["kind"].as_str().unwrap_or("")
}

fn name(doc: &Yaml) -> String {
    scalar(&doc["metadata"]["name"]).unwrap_or_default()
}

/// The pod template of a workload.
fn pod_spec(doc: &Yaml) -> Option<&Yaml> {
    match kind(doc) {
        "Deployment" | "Job" | "StatefulSet" | "DaemonSet" => {
            Some(&doc["spec"]["template"]["spec"])
        }
        "CronJob" => Some(&doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]),
        _ => None,
    }
}

/// The data of every ConfigMap and Secret, by name.
fn config_data(docs: &[(String, Yaml)]) -> BTreeMap<(String, String), BTreeMap<String, String>> {
    docs.iter()
        .filter(|(_, d)| matches!(kind(d), "ConfigMap" | "Secret"))
        .map(|(_, d)| {
            let mut data = BTreeMap::new();
            for field in ["data", "stringData"] {
                for (k, v) in entries(&d[field]) {
                    data.insert(k, scalar(v).unwrap_or_default());
                }
            }
            ((kind(d).to_owned(), name(d)), data)
        })
        .collect()
}

/// Each container of each workload, as the process it starts.
fn kubernetes_processes(docs: &[(String, Yaml)]) -> Vec<(String, Process, Yaml, Yaml)> {
    let data = config_data(docs);
    let mut out = Vec::new();
    for (file, doc) in docs {
        let Some(spec) = pod_spec(doc) else { continue };
        for container in spec["containers"].as_vec().expect("containers") {
            let origin = format!("{file}: {} {}", kind(doc), name(doc));
            let mut argv = strings(&container["command"]);
            argv.extend(strings(&container["args"]));
            let mut env = BTreeMap::new();
            for source in container["envFrom"].as_vec().into_iter().flatten() {
                let (k, r) = if source["configMapRef"].is_badvalue() {
                    ("Secret", &source["secretRef"])
                } else {
                    ("ConfigMap", &source["configMapRef"])
                };
                let referenced = (k.to_owned(), scalar(&r["name"]).unwrap());
                let entries = data
                    .get(&referenced)
                    .unwrap_or_else(|| panic!("{origin}: envFrom {referenced:?} is not defined"));
                env.extend(entries.clone());
            }
            for var in container["env"].as_vec().into_iter().flatten() {
                let value = scalar(&var["value"]).unwrap_or_else(|| "<valueFrom>".to_owned());
                env.insert(scalar(&var["name"]).expect("an env name"), value);
            }
            out.push((
                origin.clone(),
                process(origin, argv, env),
                container.clone(),
                spec.clone(),
            ));
        }
    }
    out
}

/// The user and group of the image's last `USER` instruction, as written.
fn dockerfile_user() -> (String, Option<String>) {
    let text = std::fs::read_to_string(workspace_file("Dockerfile")).unwrap();
    let user = text
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix("USER "))
        .expect("the Dockerfile sets a USER");
    let (user, group) = match user.trim().split_once(':') {
        Some((u, g)) => (u.to_owned(), Some(g.to_owned())),
        None => (user.trim().to_owned(), None),
    };
    (user, group)
}

/// The kubelet's check before it starts a container that must run as non-root
/// (`runAsNonRoot`, the container's or else the pod's): the user it runs as (the container's
/// `runAsUser`, else the pod's, else the image's `USER`) must be a number, and not 0. An image
/// user given by name is refused ("image has non-numeric user, cannot verify user is
/// non-root"): there is no passwd file the kubelet reads.
fn kubelet_refusal(pod: &Yaml, container: &Yaml, image_user: &str) -> Option<String> {
    let setting = |key: &str| {
        let own = &container["securityContext"][key];
        if own.is_badvalue() {
            pod["securityContext"][key].clone()
        } else {
            own.clone()
        }
    };
    if setting("runAsNonRoot").as_bool() != Some(true) {
        return None;
    }
    let user = match setting("runAsUser") {
        Yaml::Integer(uid) => uid,
        Yaml::BadValue => match image_user.parse::<i64>() {
            Ok(uid) => uid,
            Err(_) => {
                return Some(format!(
                    "image has non-numeric user ({image_user}), cannot verify user is non-root"
                ))
            }
        },
        other => return Some(format!("runAsUser {other:?} is not a number")),
    };
    (user == 0).then(|| "runAsNonRoot, but runs as uid 0".to_owned())
}

#[test]
fn the_kubelet_can_check_that_every_container_runs_as_a_non_root_numeric_user() {
    let (user, group) = dockerfile_user();
    let uid: i64 = user
        .parse()
        .unwrap_or_else(|_| panic!("the Dockerfile's USER {user} is a name, not a number"));
    let gid: i64 = group
        .as_deref()
        .unwrap_or_else(|| panic!("the Dockerfile's USER {user} names no group"))
        .parse()
        .unwrap_or_else(|_| panic!("the Dockerfile's USER group {group:?} is a name"));
    assert_ne!(uid, 0, "the image runs as root");

    // The check itself refuses what the kubelet refuses.
    let pod = &YamlLoader::load_from_str("securityContext: {runAsNonRoot: true}").unwrap()[0];
    let bare = &YamlLoader::load_from_str("name: c").unwrap()[0];
    assert!(kubelet_refusal(pod, bare, "nonroot").is_some());
    assert!(kubelet_refusal(pod, bare, "0").is_some());
    assert_eq!(kubelet_refusal(pod, bare, "65532"), None);

    let docs = kubernetes();
    let mut workloads = BTreeSet::new();
    for (file, doc) in &docs {
        let Some(spec) = pod_spec(doc) else { continue };
        let origin = format!("{file}: {} {}", kind(doc), name(doc));
        workloads.insert(kind(doc).to_owned());
        let containers = ["initContainers", "containers"]
            .iter()
            .flat_map(|field| spec[*field].as_vec().into_iter().flatten());
        for container in containers {
            let c = scalar(&container["name"]).unwrap_or_default();
            if let Some(refusal) = kubelet_refusal(spec, container, &user) {
                panic!("{origin}, container {c}: the kubelet refuses it: {refusal}");
            }
            let runs_as = |key: &str| {
                container["securityContext"][key]
                    .as_i64()
                    .or(spec["securityContext"][key].as_i64())
            };
            assert_eq!(
                (runs_as("runAsUser"), runs_as("runAsGroup")),
                (Some(uid), Some(gid)),
                "{origin}, container {c}: runAsUser and runAsGroup, the image's user and group"
            );
        }
    }
    assert_eq!(
        workloads,
        BTreeSet::from([
            "CronJob".to_owned(),
            "Deployment".to_owned(),
            "Job".to_owned()
        ])
    );
}

/// The Kubernetes release whose API schemas the manifests are checked against.
const KUBERNETES_VERSION: &str = "1.34.0";

/// `kubernetes-validate` (PyPI; `.ci/run` installs the pinned version and names it in
/// `KUBERNETES_VALIDATE`), with its schemas bundled: no cluster is needed.
fn kubernetes_validate() -> String {
    std::env::var("KUBERNETES_VALIDATE").unwrap_or_else(|_| "kubernetes-validate".to_owned())
}

#[test]
fn every_kubernetes_manifest_passes_kubernetes_validate_in_strict_mode() {
    let program = kubernetes_validate();
    let files: Vec<String> = kubernetes_files()
        .into_iter()
        .map(|f| {
            workspace_file(&format!("deploy/kubernetes/{f}"))
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let out = std::process::Command::new(&program)
        .args([
            "--strict",
            "--quiet",
            "--kubernetes-version",
            KUBERNETES_VERSION,
        ])
        .args(&files)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{program} is needed (`pip install kubernetes-validate==1.34.1`; .ci/run \
                 installs it; KUBERNETES_VALIDATE names another): {e}"
            )
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program}: {said}");
    assert!(!said.contains("ERROR") && !said.contains("WARN"), "{said}");
}

#[test]
fn every_variable_and_flag_the_kubernetes_manifests_set_is_read_by_its_binary() {
    let docs = kubernetes();
    let processes: Vec<Process> = kubernetes_processes(&docs)
        .into_iter()
        .map(|(_, p, _, _)| p)
        .collect();
    let binaries: BTreeSet<&str> = processes.iter().map(Process::binary).collect();
    assert_eq!(
        binaries,
        BTreeSet::from([
            "countersign",
            "countersign-api",
            "countersign-coordinator",
            "countersign-reaper",
            "countersign-worker"
        ])
    );
    assert_all_known(&processes);
}

#[test]
fn every_secret_a_manifest_reads_is_one_the_secrets_example_defines() {
    let docs = kubernetes();
    let data = config_data(&docs);
    let secret_keys = |secret: &str| {
        data.get(&("Secret".to_owned(), secret.to_owned()))
            .unwrap_or_else(|| panic!("Secret {secret} is not in secrets.example.yaml"))
            .keys()
            .cloned()
            .collect::<BTreeSet<_>>()
    };
    for (origin, _, container, spec) in kubernetes_processes(&docs) {
        for var in container["env"].as_vec().into_iter().flatten() {
            let r = &var["valueFrom"]["secretKeyRef"];
            if let (Some(secret), Some(key)) = (scalar(&r["name"]), scalar(&r["key"])) {
                assert!(
                    secret_keys(&secret).contains(&key),
                    "{origin}: Secret {secret} has no key {key}"
                );
            }
        }
        for volume in spec["volumes"].as_vec().into_iter().flatten() {
            if let Some(secret) = scalar(&volume["secret"]["secretName"]) {
                assert!(
                    !secret_keys(&secret).is_empty(),
                    "{origin}: Secret {secret}"
                );
            }
        }
    }
}

#[test]
fn each_kubernetes_service_is_probed_on_the_port_it_listens_on_and_asks_for_resources() {
    let docs = kubernetes();
    let mut probed = BTreeSet::new();
    for (origin, p, container, _) in kubernetes_processes(&docs) {
        let requests = &container["resources"]["requests"];
        assert!(
            scalar(&requests["cpu"]).is_some() && scalar(&requests["memory"]).is_some(),
            "{origin}: resource requests"
        );
        let ports: Vec<(String, String)> = container["ports"]
            .as_vec()
            .into_iter()
            .flatten()
            .map(|port| {
                (
                    scalar(&port["name"]).unwrap_or_default(),
                    scalar(&port["containerPort"]).expect("containerPort"),
                )
            })
            .collect();
        let numbers: BTreeSet<&String> = ports.iter().map(|(_, n)| n).collect();
        assert_eq!(
            numbers.len(),
            ports.len(),
            "{origin}: two container ports collide"
        );
        let Some(listens) = p.http_port() else {
            assert!(
                ports.is_empty(),
                "{origin}: declares a port nothing listens on"
            );
            continue;
        };
        let (port_name, number) = ports
            .iter()
            .find(|(_, n)| *n == listens)
            .unwrap_or_else(|| panic!("{origin}: listens on {listens}, declares {ports:?}"));
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &container[probe]["httpGet"];
            assert_eq!(
                scalar(&get["path"]).as_deref(),
                Some(path),
                "{origin}: {probe}"
            );
            let port = scalar(&get["port"]).expect("a probe port");
            assert!(
                port == *port_name || port == *number,
                "{origin}: {probe} on {port}, but the process listens on {listens}"
            );
        }
        probed.insert(p.binary().to_owned());
    }
    assert_eq!(
        probed,
        BTreeSet::from([
            "countersign-api".to_owned(),
            "countersign-coordinator".to_owned(),
            "countersign-worker".to_owned()
        ])
    );
}

#[test]
fn kubernetes_gives_a_stopping_worker_the_time_to_hand_its_runs_back() {
    let docs = kubernetes();
    let workers: Vec<_> = kubernetes_processes(&docs)
        .into_iter()
        .filter(|(_, p, _, _)| p.binary() == "countersign-worker")
        .collect();
    assert_eq!(workers.len(), 1);
    for (origin, p, _, spec) in workers {
        let grace = spec["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30)
            .unsigned_abs();
        assert!(
            grace >= p.lease_ttl_secs() + HAND_BACK_SECS,
            "{origin}: {grace} s to stop, but a worker may take one lease ({} s) and {HAND_BACK_SECS} s more",
            p.lease_ttl_secs()
        );
    }
}

#[test]
fn kubernetes_mounts_the_keyring_only_where_something_is_sealed_or_opened() {
    let docs = kubernetes();
    for (origin, p, container, spec) in kubernetes_processes(&docs) {
        let keyring_volumes: Vec<String> = spec["volumes"]
            .as_vec()
            .into_iter()
            .flatten()
            .filter(|v| {
                scalar(&v["secret"]["secretName"]).as_deref() == Some("countersign-keyring")
            })
            .map(|v| scalar(&v["name"]).unwrap())
            .collect();
        let mount = container["volumeMounts"]
            .as_vec()
            .into_iter()
            .flatten()
            .find(|m| keyring_volumes.contains(&scalar(&m["name"]).unwrap()))
            .map(|m| scalar(&m["mountPath"]).unwrap());
        let holds = KEY_HOLDERS.contains(&p.binary())
            && p.command.get(1).map(String::as_str) != Some("migrate");
        assert_eq!(
            !keyring_volumes.is_empty(),
            holds,
            "{origin}: the keyring volume"
        );
        match (mount, p.env.get("COUNTERSIGN_KEY_FILE")) {
            (Some(dir), Some(file)) => assert!(
                file.starts_with(&format!("{dir}/")),
                "{origin}: COUNTERSIGN_KEY_FILE {file} is not in the mounted {dir}"
            ),
            (None, None) => assert!(!holds, "{origin}: no keyring"),
            other => panic!("{origin}: keyring mount and COUNTERSIGN_KEY_FILE disagree: {other:?}"),
        }
        assert!(
            !p.env.contains_key("COUNTERSIGN_KEYS"),
            "{origin}: COUNTERSIGN_KEYS"
        );
    }
}

#[test]
fn the_reaper_is_a_cron_job_that_never_overlaps_itself_and_retries_only_by_its_schedule() {
    let docs = kubernetes();
    let cron: Vec<&Yaml> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| kind(d) == "CronJob")
        .collect();
    assert_eq!(cron.len(), 1);
    let spec = &cron[0]["spec"];
    assert_eq!(spec["concurrencyPolicy"].as_str(), Some("Forbid"));
    assert_eq!(
        spec["jobTemplate"]["spec"]["backoffLimit"].as_i64(),
        Some(0)
    );
    let container = &pod_spec(cron[0]).unwrap()["containers"][0];
    assert_eq!(strings(&container["command"]), ["countersign-reaper"]);
    assert!(
        !strings(&container["args"]).contains(&"--every".to_owned()),
        "one pass per activation"
    );
}

#[test]
fn each_disruption_budget_covers_a_deployment() {
    let docs = kubernetes();
    let templates: Vec<(String, BTreeMap<String, String>)> = docs
        .iter()
        .filter(|(_, d)| kind(d) == "Deployment")
        .map(|(_, d)| {
            let labels = entries(&d["spec"]["template"]["metadata"]["labels"])
                .into_iter()
                .map(|(k, v)| (k, scalar(v).unwrap()))
                .collect();
            (name(d), labels)
        })
        .collect();
    let mut covered = BTreeSet::new();
    for (_, pdb) in docs
        .iter()
        .filter(|(_, d)| kind(d) == "PodDisruptionBudget")
    {
        let selector: BTreeMap<String, String> = entries(&pdb["spec"]["selector"]["matchLabels"])
            .into_iter()
            .map(|(k, v)| (k, scalar(v).unwrap()))
            .collect();
        let matching: Vec<&String> = templates
            .iter()
            .filter(|(_, labels)| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(matching.len(), 1, "{} selects {matching:?}", name(pdb));
        covered.insert(matching[0].clone());
    }
    assert_eq!(
        covered,
        templates.into_iter().map(|(n, _)| n).collect(),
        "every Deployment has a disruption budget"
    );
}

// ---- systemd ----------------------------------------------------------------------------

/// A unit file's `[Service]` settings, in order (a key may repeat).
fn unit(file: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(workspace_file(&format!("deploy/systemd/{file}"))).unwrap();
    let mut section = String::new();
    let mut settings = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_owned();
        } else if section == "[Service]" && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                settings.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    settings
}

/// The variables an example environment file sets or shows commented out.
fn env_example(path: &str) -> BTreeMap<String, String> {
    let text =
        std::fs::read_to_string(workspace_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines()
        .filter_map(|line| {
            let line = line.strip_prefix('#').unwrap_or(line);
            let (k, v) = line.split_once('=')?;
            let name = k
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            (name && !k.is_empty()).then(|| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// The process a service unit starts, with every variable its environment files may give.
fn systemd_process(file: &str) -> (Process, Vec<(String, String)>) {
    let settings = unit(file);
    let prefix = file.split(['@', '.']).next().unwrap();
    let mut env = BTreeMap::new();
    let mut argv = Vec::new();
    for (key, value) in &settings {
        match key.as_str() {
            "EnvironmentFile" => {
                let path = value.trim_start_matches('-').replace("%p", prefix);
                let base = path
                    .strip_prefix("/etc/countersign/")
                    .expect("in /etc/countersign");
                let example = ["deploy", "deploy/systemd"]
                    .iter()
                    .map(|dir| format!("{dir}/{base}.example"))
                    .find(|p| workspace_file(p).exists())
                    .unwrap_or_else(|| panic!("{file}: no example of {path} in deploy/"));
                env.extend(env_example(&example));
            }
            "Environment" => {
                let (k, v) = value.split_once('=').expect("Environment=NAME=value");
                env.insert(k.to_owned(), v.to_owned());
            }
            "ExecStart" => argv = value.split_whitespace().map(str::to_owned).collect(),
            _ => {}
        }
    }
    (process(format!("systemd/{file}"), argv, env), settings)
}

const SERVICE_UNITS: [&str; 4] = [
    "countersign-coordinator.service",
    "countersign-worker@.service",
    "countersign-reaper.service",
    "countersign-api.service",
];

#[test]
fn every_variable_and_flag_the_systemd_units_set_is_read_by_its_binary() {
    let processes: Vec<Process> = SERVICE_UNITS.iter().map(|f| systemd_process(f).0).collect();
    assert_all_known(&processes);
}

#[test]
fn systemd_hands_the_keyring_as_a_credential_to_the_coordinator_and_the_workers_only() {
    for file in SERVICE_UNITS {
        let (p, settings) = systemd_process(file);
        let credential = settings
            .iter()
            .any(|(k, v)| k == "LoadCredential" && v.starts_with("keys:"));
        let holds = KEY_HOLDERS.contains(&p.binary());
        assert_eq!(credential, holds, "{file}: LoadCredential=keys");
        assert_eq!(
            p.env.get("COUNTERSIGN_KEY_FILE").map(String::as_str),
            holds.then_some("%d/keys"),
            "{file}: COUNTERSIGN_KEY_FILE in the unit's credentials directory"
        );
        assert!(
            !p.env.contains_key("COUNTERSIGN_KEYS"),
            "{file}: the keyring in an environment file every unit reads"
        );
    }
}

#[test]
fn systemd_worker_instances_name_their_ports_and_none_is_another_units() {
    let (worker, settings) = systemd_process("countersign-worker@.service");
    assert_eq!(
        worker.http_port().as_deref(),
        Some("%i"),
        "the instance is the port"
    );
    let guard = settings
        .iter()
        .find(|(k, _)| k == "ExecStartPre")
        .map(|(_, v)| v.clone())
        .expect("a guard on the instance name");
    // The pattern the guard lets through is exactly SYSTEMD_WORKER_PORTS.
    assert!(guard.contains("case \"%i\" in 94[7-9][0-9])"), "{guard}");
    assert_eq!(SYSTEMD_WORKER_PORTS, 9470..=9499);

    let mut taken = BTreeMap::new();
    for file in ["countersign-coordinator.service", "countersign-api.service"] {
        let (p, _) = systemd_process(file);
        let mut ports = vec![p.http_port().expect("a port")];
        ports.extend(p.flag("--listen").map(port_of));
        for port in ports {
            let number: u16 = port.parse().unwrap();
            assert!(
                !SYSTEMD_WORKER_PORTS.contains(&number),
                "{file}: {port} is a worker's"
            );
            if let Some(other) = taken.insert(port.clone(), file) {
                panic!("{file} and {other} both bind {port}");
            }
        }
    }
    let (reaper, settings) = systemd_process("countersign-reaper.service");
    assert_eq!(reaper.http_port(), None, "a one-shot pass serves nothing");
    assert!(settings.contains(&("Type".to_owned(), "oneshot".to_owned())));

    let timeout: u64 = settings_value(&unit("countersign-worker@.service"), "TimeoutStopSec")
        .parse()
        .unwrap();
    assert!(
        timeout >= worker.lease_ttl_secs() + HAND_BACK_SECS,
        "TimeoutStopSec={timeout}"
    );
    let timer =
        std::fs::read_to_string(workspace_file("deploy/systemd/countersign-reaper.timer")).unwrap();
    assert!(timer.contains("OnUnitActiveSec="), "{timer}");
}

fn settings_value(settings: &[(String, String)], key: &str) -> String {
    settings
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {key}"))
}

// ---- what --help shows is read -------------------------------------------------------------

#[test]
fn the_keyring_and_the_log_settings_are_read_by_the_binaries_whose_help_lists_them() {
    // The keyring: each holder loads it before it connects to anything.
    for command in [
        &["countersign-coordinator"][..],
        &["countersign-worker"],
        &["countersign-api"],
        &["countersign", "keys", "rotate"],
    ] {
        assert!(super::help(command).env.contains("COUNTERSIGN_KEY_FILE"));
        let out = std::process::Command::new(binary(command[0]))
            .args(&command[1..])
            .env("DATABASE_URL", database_url())
            .env_remove("COUNTERSIGN_KEYS")
            .env("COUNTERSIGN_KEY_FILE", "/nonexistent/countersign-e2e-keys")
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{command:?} started without its keyring"
        );
        assert!(
            stderr.contains("/nonexistent/countersign-e2e-keys"),
            "{command:?}: {stderr}"
        );
    }
    let reaper_reads = super::help(&["countersign-reaper"]).env;
    assert!(
        !reaper_reads.contains("COUNTERSIGN_KEYS"),
        "{reaper_reads:?}"
    );
    assert!(reaper_reads.contains("RUST_LOG"), "{reaper_reads:?}");

    // The log settings: a role that does not exist fails at once, and is logged as asked.
    let base = database_url();
    let host = base.rsplit_once('@').map_or_else(
        || base.split_once("://").map_or(base.as_str(), |(_, h)| h),
        |(_, h)| h,
    );
    let refused = format!("postgres://countersign_e2e_no_such_role@{host}");
    let reaper = |filter: &str| {
        let out = std::process::Command::new(binary("countersign-reaper"))
            .env("DATABASE_URL", &refused)
            .env("RUST_LOG", filter)
            .env("RUST_LOG_FORMAT", "json")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let logged = reaper("error");
    assert!(
        logged
            .lines()
            .any(|l| l.starts_with("{\"timestamp\"") && l.contains("PostgreSQL unreachable")),
        "{logged}"
    );
    let quiet = reaper("off");
    assert!(!quiet.contains("{\"timestamp\""), "{quiet}");
}

// ---- systemd-analyze ----------------------------------------------------------------------

/// The highest `systemd-analyze security` exposure a unit may have (0 is confined, 10 not
/// at all; 4 is the top of "OK").
const MAX_EXPOSURE: f64 = 4.0;

fn systemd_analyze(args: &[&str]) -> std::process::Output {
    std::process::Command::new("systemd-analyze")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze is needed (Debian's systemd package; .ci/run checks it): {e}")
        })
}

/// Every unit of deploy/systemd/ copied into a directory of its own, as installed, except that
/// the binaries are the ones built here (`systemd-analyze verify` checks that each command is
/// an executable) and the worker's template is its first instance. Removed on drop.
struct InstalledUnits {
    dir: std::path::PathBuf,
    units: Vec<std::path::PathBuf>,
}

impl InstalledUnits {
    fn new() -> InstalledUnits {
        let built = binary("countersign-worker");
        let bin = built
            .parent()
            .expect("the target directory")
            .to_string_lossy();
        let dir = std::env::temp_dir().join(format!(
            "countersign-units-{}",
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut units = Vec::new();
        for entry in std::fs::read_dir(workspace_file("deploy/systemd")).unwrap() {
            let file = entry.unwrap().file_name().to_string_lossy().into_owned();
            if !(file.ends_with(".service") || file.ends_with(".timer")) {
                continue;
            }
            let text = std::fs::read_to_string(workspace_file(&format!("deploy/systemd/{file}")))
                .unwrap()
                .replace("/usr/local/bin/", &format!("{bin}/"));
            let installed = dir.join(file.replace("@.service", "@9470.service"));
            std::fs::write(&installed, text).unwrap();
            units.push(installed);
        }
        units.sort();
        InstalledUnits { dir, units }
    }

    fn services(&self) -> impl Iterator<Item = &std::path::PathBuf> {
        self.units
            .iter()
            .filter(|u| u.extension().is_some_and(|e| e == "service"))
    }
}

impl Drop for InstalledUnits {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn systemd_analyze_verify_finds_nothing_to_say_about_any_unit() {
    let installed = InstalledUnits::new();
    let services: Vec<String> = installed
        .services()
        .map(|u| u.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut expected: Vec<String> = SERVICE_UNITS
        .iter()
        .map(|u| u.replace("@.service", "@9470.service"))
        .collect();
    expected.sort();
    assert_eq!(services, expected, "the tests know every service unit");
    let paths: Vec<&str> = installed
        .units
        .iter()
        .map(|u| u.to_str().unwrap())
        .collect();
    let mut args = vec!["verify"];
    args.extend(&paths);
    let out = systemd_analyze(&args);
    // It exits 0 on an unknown key or a value it cannot parse, which it only prints.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

/// The overall exposure `systemd-analyze security` prints for a unit: "→ Overall exposure
/// level for NAME: 1.1 OK 🙂".
fn exposure(output: &str, unit: &str) -> f64 {
    let marker = format!("Overall exposure level for {unit}: ");
    let line = output
        .lines()
        .find_map(|l| l.split_once(&marker).map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no exposure for {unit} in:\n{output}"));
    line.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{unit}: exposure {line}"))
}

#[test]
fn systemd_analyze_security_rates_every_service_unit_at_most_4() {
    assert_eq!(
        exposure(
            "\u{2192} Overall exposure level for a.service: 8.3 EXPOSED \u{1f641}",
            "a.service"
        ),
        8.3
    );
    let installed = InstalledUnits::new();
    let mut rated = Vec::new();
    for unit in installed.services() {
        let name = unit.file_name().unwrap().to_string_lossy().into_owned();
        let out = systemd_analyze(&[
            "security",
            "--offline=yes",
            "--no-pager",
            unit.to_str().unwrap(),
        ]);
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{name}: {printed}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let level = exposure(&printed, &name);
        assert!(
            level <= MAX_EXPOSURE,
            "{name}: exposure {level}:\n{printed}"
        );
        rated.push(name);
    }
    assert_eq!(rated.len(), SERVICE_UNITS.len());
}
