//! deploy/compose.yaml, deploy/kubernetes/ and deploy/systemd/: every variable and flag they
//! set is one the binary reads, the ports agree and cannot collide, the keyring reaches only
//! the processes that seal or open, and a stopping worker gets the time it takes to hand its
//! runs back.

use std::collections::{BTreeMap, BTreeSet};

use countersign_e2e::{binary, database_url, workspace_file};
use yaml_rust2::Yaml;

use super::{entries, process, read_without_a_flag, scalar, strings, yaml, Process};

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

// ---- Kubernetes -------------------------------------------------------------------------

/// Every manifest of deploy/kubernetes/: what kustomize applies, the migration Job applied
/// on its own, and the example of the Secrets.
fn kubernetes() -> Vec<(String, Yaml)> {
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
        .into_iter()
        .flat_map(|f| {
            yaml(&format!("deploy/kubernetes/{f}"))
                .into_iter()
                .map(move |doc| (f.clone(), doc))
        })
        .collect()
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

const SERVICE_UNITS: [&str; 3] = [
    "countersign-coordinator.service",
    "countersign-worker@.service",
    "countersign-reaper.service",
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

    let (coordinator, _) = systemd_process("countersign-coordinator.service");
    let port: u16 = coordinator.http_port().expect("a port").parse().unwrap();
    assert!(
        !SYSTEMD_WORKER_PORTS.contains(&port),
        "the coordinator's {port} is a worker's"
    );
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

// ---- what --help cannot show --------------------------------------------------------------

#[test]
fn the_variables_read_without_a_flag_are_read_by_the_binaries_given_them() {
    // The keyring: each holder loads it before it connects to anything.
    for command in [
        &["countersign-coordinator"][..],
        &["countersign-worker"],
        &["countersign-api"],
        &["countersign", "keys", "rotate"],
    ] {
        assert!(read_without_a_flag(command[0], "COUNTERSIGN_KEY_FILE"));
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
    assert!(!read_without_a_flag(
        "countersign-reaper",
        "COUNTERSIGN_KEYS"
    ));

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
