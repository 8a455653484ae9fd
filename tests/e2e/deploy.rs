//! The deployment files in `deploy/` as a deployer uses them: the compose file, the
//! Kubernetes manifests and the systemd units set only variables and flags the binaries read
//! (by their `--help`), on the ports README gives, which do not collide; the kubelet can check
//! every container's non-root user, `kubernetes-validate` accepts the manifests and
//! `systemd-analyze` the units ([`manifests`]); the healthcheck compose runs tells a ready
//! service from anything else ([`healthcheck`]); the RabbitMQ definitions are the topology the
//! services expect, and the services run a whole cycle, and a worker stops, under the
//! definitions' least-privilege users without declaring anything ([`rabbitmq`]).
//!
//! No container engine or cluster is needed: the YAML is read here, the checkers run on the
//! files, and the broker is the real one at `AMQP_ADDR`, administered with `rabbitmqctl`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use countersign_e2e::{binary, workspace_file};
use yaml_rust2::yaml::Hash;
use yaml_rust2::{Yaml, YamlLoader};

mod configuration;
mod healthcheck;
mod manifests;
mod rabbitmq;

/// What a binary's `--help` says it reads: its flags and the variables behind them.
#[derive(Debug, Default)]
pub struct Help {
    pub flags: BTreeSet<String>,
    pub env: BTreeSet<String>,
}

/// `--help` of `command` (`countersign-worker`, or `countersign migrate` for a subcommand).
pub fn help(command: &[&str]) -> Help {
    let (name, rest) = command.split_first().expect("a binary");
    let out = Command::new(binary(name))
        .args(rest)
        .arg("--help")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{command:?} --help failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut help = Help::default();
    for word in text.split_whitespace() {
        if let Some(flag) = word.strip_prefix("--") {
            let flag: String = flag
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !flag.is_empty() {
                help.flags.insert(format!("--{flag}"));
            }
        }
    }
    for (at, marker) in text.match_indices("[env: ") {
        let name: String = text[at + marker.len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        help.env.insert(name);
    }
    assert!(
        help.flags.contains("--help"),
        "no flags found in the help of {command:?}"
    );
    help
}

/// One process a deployment file starts: which binary, with which arguments and variables.
#[derive(Debug, Clone)]
pub struct Process {
    /// Where it is defined, for messages: `compose.yaml: worker-1`.
    pub origin: String,
    /// The binary and, for `countersign`, its subcommand.
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl Process {
    /// The binary's name (a path's last part).
    pub fn binary(&self) -> &str {
        let first = self.command.first().map_or("", String::as_str);
        first.rsplit('/').next().unwrap_or(first)
    }

    /// The value of `--flag VALUE` or `--flag=VALUE` in the arguments.
    pub fn flag(&self, flag: &str) -> Option<&str> {
        let mut args = self.args.iter();
        while let Some(arg) = args.next() {
            if arg == flag {
                return args.next().map(String::as_str);
            }
            if let Some(value) = arg.strip_prefix(flag).and_then(|v| v.strip_prefix('=')) {
                return Some(value);
            }
        }
        None
    }

    /// The port of the address it serves `/metrics`, `/healthz` and `/readyz` on, if any.
    pub fn http_port(&self) -> Option<String> {
        let addr = self
            .flag("--http-addr")
            .or(self.env.get("COUNTERSIGN_HTTP_ADDR").map(String::as_str))?;
        Some(port_of(addr))
    }

    /// The port of the address the API serves `/v1` and `/inbox` on (`--listen`).
    pub fn api_port(&self) -> Option<String> {
        let addr = self
            .flag("--listen")
            .or(self.env.get("COUNTERSIGN_API_ADDR").map(String::as_str))?;
        Some(port_of(addr))
    }

    /// The worker's lease time to live in seconds (`--lease-ttl-secs`, default 30).
    pub fn lease_ttl_secs(&self) -> u64 {
        self.flag("--lease-ttl-secs")
            .map_or(30, |v| v.parse().expect("a number of seconds"))
    }

    /// Checks every flag and variable against the binary's `--help`; returns what it lacks.
    pub fn unknown_settings(&self) -> Vec<String> {
        let mut command: Vec<&str> = vec![self.binary()];
        command.extend(self.command.iter().skip(1).map(String::as_str));
        let help = help(&command);
        let mut unknown = Vec::new();
        for arg in &self.args {
            let flag = arg.split('=').next().unwrap_or(arg);
            if flag.starts_with("--") && !help.flags.contains(flag) {
                unknown.push(format!("{}: flag {flag}", self.origin));
            }
        }
        for var in self.env.keys() {
            if !help.env.contains(var) {
                unknown.push(format!("{}: variable {var}", self.origin));
            }
        }
        unknown
    }
}

/// The port of `host:port`.
pub fn port_of(addr: &str) -> String {
    addr.rsplit_once(':').expect("host:port").1.to_owned()
}

/// Splits `[binary, args…]` into the command (with the `countersign` subcommand) and the rest.
pub fn process(origin: String, argv: Vec<String>, env: BTreeMap<String, String>) -> Process {
    let mut argv = argv.into_iter();
    let mut command: Vec<String> = argv.next().into_iter().collect();
    let mut args: Vec<String> = argv.collect();
    if command.first().is_some_and(|b| b.ends_with("countersign"))
        && args.first().is_some_and(|a| !a.starts_with('-'))
    {
        command.push(args.remove(0));
    }
    Process {
        origin,
        command,
        args,
        env,
    }
}

/// Every YAML document of a file of `deploy/`, with merge keys (`<<: *anchor`) applied.
pub fn yaml(path: &str) -> Vec<Yaml> {
    let text =
        std::fs::read_to_string(workspace_file(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
        .iter()
        .map(merged)
        .collect()
}

/// `value` with every `<<` merge key replaced by the entries it merges; an entry of the
/// mapping itself wins over a merged one, as YAML's merge key says.
fn merged(value: &Yaml) -> Yaml {
    match value {
        Yaml::Hash(hash) => {
            let mut out = Hash::new();
            if let Some(merge) = hash.get(&Yaml::String("<<".into())) {
                let sources = match merge {
                    Yaml::Array(items) => items.clone(),
                    single => vec![single.clone()],
                };
                for source in sources {
                    if let Yaml::Hash(entries) = merged(&source) {
                        out.extend(entries);
                    }
                }
            }
            for (key, v) in hash {
                if key.as_str() != Some("<<") {
                    out.insert(key.clone(), merged(v));
                }
            }
            Yaml::Hash(out)
        }
        Yaml::Array(items) => Yaml::Array(items.iter().map(merged).collect()),
        other => other.clone(),
    }
}

/// A scalar as the string a container sees (`"30"`, `30` and `true` alike).
pub fn scalar(value: &Yaml) -> Option<String> {
    match value {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A sequence of scalars, or one string split on whitespace (compose's short form).
pub fn strings(value: &Yaml) -> Vec<String> {
    match value {
        Yaml::Array(items) => items
            .iter()
            .map(|item| scalar(item).expect("a scalar"))
            .collect(),
        Yaml::String(s) => s.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

/// The entries of a mapping, keyed by their string keys.
pub fn entries(value: &Yaml) -> Vec<(String, &Yaml)> {
    value
        .as_hash()
        .map(|hash| {
            hash.iter()
                .filter_map(|(k, v)| Some((scalar(k)?, v)))
                .collect()
        })
        .unwrap_or_default()
}
