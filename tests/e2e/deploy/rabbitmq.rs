//! deploy/rabbitmq/definitions.json: it holds the topology the services check for, with
//! dead-lettering and the delivery limit as a policy; imported into a fresh vhost of the real
//! broker, it lets the services run a whole cycle as its least-privilege users with
//! `--no-declare`, and its producer user reach the two public queues and nothing else.

use std::collections::BTreeSet;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use countersign_core::EventName;
use countersign_e2e::{
    amqp_addr, demo_agent, demo_script, free_port, http_get, model_settings, workspace_file,
    Installation, ModelStub, Process, TempDir, MODEL_KEY_ENV,
};
use countersign_queue::{
    Broker, Consumer, Declare, MessageProperties, QueueConfig, Topology, DEAD_LETTER_MAX_BYTES,
    DEAD_LETTER_MAX_LENGTH, DEAD_LETTER_OVERFLOW, DEFAULT_DELIVERY_LIMIT,
};
use serde_json::{json, Value};
use sqlx::Connection;
use uuid::Uuid;

use super::{entries, scalar, yaml};
use countersign_e2e::Database;

/// Within this, what must happen has happened; never a statement about speed.
const GUARD: Duration = Duration::from_secs(60);

/// The producer's password in the definitions: the development one, like those compose uses
/// for the services (docs/deployment.md).
const PRODUCER_PASSWORD: &str = "producer-dev";

fn definitions() -> Value {
    let path = workspace_file("deploy/rabbitmq/definitions.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("JSON")
}

fn by_name<'a>(definitions: &'a Value, field: &str) -> Vec<&'a Value> {
    definitions[field].as_array().expect(field).iter().collect()
}

#[test]
fn an_alert_fires_before_the_dead_letter_queue_drops_its_oldest() {
    let alerts = yaml("deploy/prometheus/alerts.yml").remove(0);
    let rules: Vec<&yaml_rust2::Yaml> = alerts["groups"]
        .as_vec()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_vec().unwrap())
        .collect();
    let rule = rules
        .iter()
        .find(|r| r["alert"].as_str() == Some("CountersignDeadLettersNearlyFull"))
        .expect("an alert for a filling dead-letter queue");
    let expr = scalar(&rule["expr"]).unwrap();
    let (metric, threshold) = expr.split_once(" > ").expect("GAUGE > N");
    assert_eq!(metric, "max(countersign_dead_letter_messages)");
    let threshold: u32 = threshold.trim().parse().expect("a count");
    assert!(
        (DEAD_LETTER_MAX_LENGTH / 2..DEAD_LETTER_MAX_LENGTH).contains(&threshold),
        "{threshold}: below the bound {DEAD_LETTER_MAX_LENGTH}, and not long before it"
    );
    let summary = scalar(&rule["annotations"]["summary"]).unwrap();
    assert!(
        summary.contains(&DEAD_LETTER_MAX_LENGTH.to_string()),
        "{summary}"
    );
}

#[test]
fn the_definitions_hold_the_topology_the_services_check_for_with_dead_lettering_as_a_policy() {
    let d = definitions();
    let t = Topology::default();
    let vhost = d["vhosts"][0]["name"].as_str().expect("one vhost");
    assert_eq!(d["vhosts"].as_array().unwrap().len(), 1);

    let queues: BTreeSet<String> = by_name(&d, "queues")
        .into_iter()
        .map(|q| {
            let name = q["name"].as_str().unwrap().to_owned();
            assert_eq!(q["vhost"], vhost, "{name}");
            assert_eq!(q["durable"], true, "{name}");
            assert_eq!(q["auto_delete"], false, "{name}");
            // Only what cannot be a policy: everything else can change without a redeclare.
            assert_eq!(q["arguments"], json!({"x-queue-type": "quorum"}), "{name}");
            name
        })
        .collect();
    let mut expected: BTreeSet<String> = t.work_queues().into_iter().collect();
    expected.insert(t.dead_letters());
    assert_eq!(queues, expected);

    let exchanges: BTreeSet<(String, String)> = by_name(&d, "exchanges")
        .into_iter()
        .map(|e| {
            assert_eq!(e["vhost"], vhost);
            assert_eq!(e["durable"], true);
            (
                e["name"].as_str().unwrap().to_owned(),
                e["type"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut expected = BTreeSet::from([
        (t.dead_letter_exchange(), "fanout".to_owned()),
        (t.events_exchange(), "topic".to_owned()),
    ]);
    expected.extend(
        t.public_queues()
            .into_iter()
            .chain([t.segments_exchange()])
            .map(|q| (q, "fanout".to_owned())),
    );
    assert_eq!(exchanges, expected);

    let bindings: BTreeSet<(String, String, String)> = by_name(&d, "bindings")
        .into_iter()
        .map(|b| {
            assert_eq!(b["destination_type"], "queue");
            (
                b["source"].as_str().unwrap().to_owned(),
                b["destination"].as_str().unwrap().to_owned(),
                b["routing_key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let fanout = |exchange: String, queue: String| (exchange, queue, String::new());
    let mut expected = BTreeSet::from([fanout(t.dead_letter_exchange(), t.dead_letters())]);
    expected.extend(t.public_queues().map(|q| fanout(q.clone(), q)));
    expected.insert(fanout(t.segments_exchange(), t.segments()));
    // The events that hand a run to the workers are its wake-ups.
    expected.extend(
        EventName::WAKE_UPS
            .map(|name| (t.events_exchange(), t.segments(), name.as_str().to_owned())),
    );
    assert_eq!(bindings, expected);

    let policies = by_name(&d, "policies");
    assert_eq!(
        policies.len(),
        2,
        "the work queues' and the dead-letter queue's"
    );
    let policy = |name: &str| {
        *policies
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("no policy {name}"))
    };
    let bounds = policy("countersign-dead-letters");
    assert_eq!(bounds["pattern"], format!("^{}\\.dead-letters$", t.prefix));
    assert_eq!(bounds["apply-to"], "queues");
    // The bounds the services give the queue when they create it themselves.
    assert_eq!(
        bounds["definition"],
        json!({
            "max-length": DEAD_LETTER_MAX_LENGTH,
            "max-length-bytes": DEAD_LETTER_MAX_BYTES,
            "overflow": DEAD_LETTER_OVERFLOW,
        })
    );
    let policy = policy("countersign-work-queues");
    let suffixes: Vec<String> = t
        .work_queues()
        .iter()
        .map(|q| {
            q.strip_prefix(&format!("{}.", t.prefix))
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        policy["pattern"],
        format!("^{}\\.({})$", t.prefix, suffixes.join("|")),
        "the policy matches exactly the work queues"
    );
    assert_eq!(policy["apply-to"], "queues");
    assert_eq!(
        policy["definition"],
        json!({
            "dead-letter-exchange": t.dead_letter_exchange(),
            "dead-letter-strategy": "at-least-once",
            "overflow": "reject-publish",
            "delivery-limit": DEFAULT_DELIVERY_LIMIT,
        })
    );

    // compose connects each service to this vhost as one of these users.
    let users: BTreeSet<&str> = by_name(&d, "users")
        .into_iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    for (service, (user, _, service_vhost)) in compose_logins() {
        assert!(
            users.contains(user.as_str()),
            "compose {service}: user {user}"
        );
        assert_eq!(service_vhost, vhost, "compose {service}");
    }
}

/// `(service, (user, password, vhost))` of every compose service's `AMQP_ADDR`.
fn compose_logins() -> Vec<(String, (String, String, String))> {
    let compose = yaml("deploy/compose.yaml").remove(0);
    entries(&compose["services"])
        .into_iter()
        .filter_map(|(name, service)| {
            let addr = scalar(&service["environment"]["AMQP_ADDR"])?;
            let rest = addr.strip_prefix("amqp://").expect("amqp://");
            let (userinfo, rest) = rest.split_once('@').expect("user:password@");
            let (user, password) = userinfo.split_once(':').expect("user:password");
            let vhost = rest.split_once('/').expect("/vhost").1;
            Some((
                name,
                (user.to_owned(), password.to_owned(), vhost.to_owned()),
            ))
        })
        .collect()
}

/// The compose password of `user`, which the definitions' hash must accept.
fn compose_password(user: &str) -> String {
    compose_logins()
        .into_iter()
        .find(|(_, (u, _, _))| u == user)
        .map(|(_, (_, password, _))| password)
        .unwrap_or_else(|| panic!("no compose service connects as {user}"))
}

fn rabbitmqctl_program() -> String {
    std::env::var("RABBITMQCTL").unwrap_or_else(|_| "rabbitmqctl".to_owned())
}

/// Runs `rabbitmqctl ARGS`, whatever its exit status.
fn try_rabbitmqctl(args: &[&str]) -> Output {
    let program = rabbitmqctl_program();
    Command::new(&program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("{program} is needed to import the broker definitions (RABBITMQCTL names another): {e}")
        })
}

/// Runs `rabbitmqctl ARGS`, which must succeed.
fn rabbitmqctl(args: &[&str]) -> Output {
    let program = rabbitmqctl_program();
    let out = try_rabbitmqctl(args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The definitions imported into a vhost of their own, with their users renamed so that tests
/// running at once do not share them; removed on drop, also when the test failed.
struct Imported {
    vhost: String,
    suffix: String,
    users: Vec<String>,
}

impl Imported {
    fn new(tag: &str) -> Imported {
        let id = Uuid::now_v7().simple().to_string();
        let suffix = format!("{tag}-{}", &id[id.len() - 12..]);
        let mut d = definitions();
        let vhost = format!("{}-e2e-{suffix}", d["vhosts"][0]["name"].as_str().unwrap());
        d["vhosts"] = json!([{ "name": vhost }]);
        rewrite(&mut d, &mut |key, value| {
            if key == "vhost" {
                *value = json!(vhost);
            }
        });
        let mut users = Vec::new();
        for user in d["users"].as_array_mut().unwrap() {
            let renamed = format!("{}-{suffix}", user["name"].as_str().unwrap());
            users.push(renamed.clone());
            user["name"] = json!(renamed);
        }
        for permission in d["permissions"].as_array_mut().unwrap() {
            permission["user"] =
                json!(format!("{}-{suffix}", permission["user"].as_str().unwrap()));
        }
        // The administrator of AMQP_ADDR watches the events and reads the queues of the vhost.
        d["permissions"].as_array_mut().unwrap().push(json!({
            "user": admin().0, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"
        }));
        let imported = Imported {
            vhost,
            suffix,
            users,
        };
        let file =
            std::env::temp_dir().join(format!("countersign-definitions-{}.json", imported.suffix));
        std::fs::write(&file, serde_json::to_vec(&d).unwrap()).unwrap();
        rabbitmqctl(&["import_definitions", file.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        imported.wait_for_bindings();
        imported
    }

    /// The broker imports asynchronously, bindings last: wait until they are there.
    fn wait_for_bindings(&self) {
        let expected = by_name(&definitions(), "bindings").len();
        let deadline = Instant::now() + GUARD;
        loop {
            // Until the import has created the vhost, this fails.
            let out = try_rabbitmqctl(&[
                "list_bindings",
                "-p",
                &self.vhost,
                "-q",
                "--no-table-headers",
                "source_name",
            ]);
            let named = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count();
            if out.status.success() && named >= expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the definitions were not imported within {GUARD:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `user` of the definitions, as renamed here.
    fn user(&self, user: &str) -> String {
        format!("{user}-{}", self.suffix)
    }

    /// `AMQP_ADDR` as `user` (of the definitions, with `password`) on this vhost.
    fn addr(&self, user: &str, password: &str) -> String {
        addr_as(&self.user(user), password, &self.vhost)
    }

    fn admin_addr(&self) -> String {
        let (user, password) = admin();
        addr_as(&user, &password, &self.vhost)
    }

    /// A broker handle that declares nothing, as the services in this vhost do.
    async fn broker(&self, addr: String) -> Result<Broker, countersign_queue::QueueError> {
        let mut config = QueueConfig::new(addr, Topology::default());
        config.declare = Declare::Nothing;
        config.reconnect_attempts = 2;
        Broker::connect(config).await
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        let _ = try_rabbitmqctl(&["delete_vhost", &self.vhost]);
        for user in &self.users {
            let _ = try_rabbitmqctl(&["delete_user", user]);
        }
    }
}

/// Calls `f` on every `(key, value)` of every object, depth first.
fn rewrite(value: &mut Value, f: &mut impl FnMut(&str, &mut Value)) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                f(k, v);
                rewrite(v, f);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rewrite(v, f)),
        _ => {}
    }
}

/// The user and password of `AMQP_ADDR`, an administrator of the broker.
fn admin() -> (String, String) {
    let addr = amqp_addr();
    let rest = addr.split_once("://").map_or(addr.as_str(), |(_, r)| r);
    let userinfo = rest.rsplit_once('@').map_or("guest:guest", |(u, _)| u);
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    (user.to_owned(), password.to_owned())
}

/// `AMQP_ADDR`'s host and port, as `user` on `vhost`.
fn addr_as(user: &str, password: &str, vhost: &str) -> String {
    let addr = amqp_addr();
    let (scheme, rest) = addr.split_once("://").unwrap_or(("amqp", addr.as_str()));
    let authority = rest.split('/').next().unwrap();
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    format!("{scheme}://{user}:{password}@{host}/{vhost}")
}

async fn next_event(events: &mut Consumer, name: &str, key: &str, value: &str) -> Value {
    loop {
        let delivery = tokio::time::timeout(GUARD, events.next())
            .await
            .unwrap_or_else(|_| panic!("no {name} event within {GUARD:?}"))
            .expect("the event consumer is open")
            .expect("a delivery");
        let event: Value = serde_json::from_slice(&delivery.body).unwrap();
        delivery.ack().await.unwrap();
        if event["event"] == name && event[key] == value {
            return event;
        }
    }
}

async fn wait_ready(port: u16) {
    let deadline = Instant::now() + GUARD;
    loop {
        if http_get(port, "/readyz").is_some_and(|(status, _)| status.contains("200")) {
            return;
        }
        assert!(Instant::now() < deadline, "nothing ready on port {port}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_goes_from_request_to_write_under_the_least_privilege_users_declaring_nothing_past_a_node_that_is_down(
) {
    let mq = Imported::new("cycle");
    let db = Database::create("deploy").await;
    let install = Installation {
        database_url: db.url(),
        queue_prefix: Topology::default().prefix,
    };
    install.configure(&demo_agent());
    let producer = mq.user("countersign-producer");
    install.countersign_ok(&["producers", "allow", &producer, "acting-user", "*"]);
    install.countersign_ok(&["producers", "allow", &producer, "approver", "*"]);

    let watcher = mq.broker(mq.admin_addr()).await.unwrap();
    let watch = watcher.declare_private_queue().await.unwrap();
    watcher.bind_events(&watch, "#").await.unwrap();
    let mut events = watcher.consume(&watch, 50).await.unwrap();

    // Each service is given a node list whose first node does not answer (a port nothing
    // listens on), as a cluster with a node down is: it connects to the next, and checks the
    // topology there with its least privileges.
    let down = free_port();
    let as_user = |binary: &str, user: &str| {
        let addr = mq.addr(user, &compose_password(user));
        let (scheme, rest) = addr.split_once("://").unwrap();
        let (userinfo, rest) = rest.rsplit_once('@').unwrap();
        let vhost = rest.split_once('/').map_or("", |(_, v)| v);
        let mut cmd = install.command(binary);
        cmd.env(
            "AMQP_ADDR",
            format!("{scheme}://{userinfo}@127.0.0.1:{down}/{vhost},{addr}"),
        );
        cmd
    };
    let (coordinator_port, worker_port) = (free_port(), free_port());
    // What each service logs (warnings and errors): a refusal by the broker shows there even
    // where another relay covers for it.
    let log =
        |name: &str| std::env::temp_dir().join(format!("countersign-{name}-{}.log", mq.suffix));
    let log_to = |name: &str| Stdio::from(std::fs::File::create(log(name)).unwrap());
    // --no-declare by its variable for one service, by its flag for the others.
    let _coordinator = Process::from(
        as_user("countersign-coordinator", "countersign-coordinator")
            .env("COUNTERSIGN_NO_DECLARE", "true")
            .args(["--http-addr", &format!("127.0.0.1:{coordinator_port}")])
            .stdout(Stdio::null())
            .stderr(log_to("coordinator"))
            .spawn()
            .unwrap(),
    );
    let _worker = Process::from(
        as_user("countersign-worker", "countersign-worker")
            .args(["--no-declare", "--model-script", &demo_script()])
            .args(["--http-addr", &format!("127.0.0.1:{worker_port}")])
            // No poll within the test: the run starts and resumes only if the definitions'
            // bindings carry `run.accepted` and `decision.accepted` to the segments queue.
            .args(["--poll-interval-secs", "3600"])
            .stdout(Stdio::null())
            .stderr(log_to("worker"))
            .spawn()
            .unwrap(),
    );
    wait_ready(coordinator_port).await;
    wait_ready(worker_port).await;

    // A foreign producer, allowed to write to the two public queues and nothing else.
    let t = Topology::default();
    let producing = mq
        .broker(mq.addr("countersign-producer", PRODUCER_PASSWORD))
        .await
        .expect("the producer's password opens its user");
    let as_producer = MessageProperties {
        user_id: Some(producer.clone()),
        ..MessageProperties::default()
    };
    let request_id = Uuid::now_v7().to_string();
    let request = json!({
        "type": "countersign.run_request", "version": 1, "request_id": request_id,
        "agent": "seo-assistant", "acting_user": "editor",
        "prompt": "Tighten the description of page 12 and add bicycle.png to its teaser.",
    });
    producing
        .publish_public(
            &t.run_requests(),
            request.to_string().as_bytes(),
            &as_producer,
        )
        .await
        .unwrap();
    let accepted = next_event(&mut events, "run.accepted", "request_id", &request_id).await;
    let run_id = accepted["run_id"].as_str().unwrap().to_owned();
    let suspended = next_event(&mut events, "run.suspended", "run_id", &run_id).await;

    // The decision names the card the event announced.
    let decision = json!({
        "type": "countersign.decision", "version": 1, "decision_id": Uuid::now_v7(),
        "run_id": run_id, "suspension_seq": suspended["suspension_seq"],
        "turn_digest": suspended["turn_digest"], "approved": true, "approver": "approver",
    });
    producing
        .publish_public(
            &t.decisions(),
            decision.to_string().as_bytes(),
            &as_producer,
        )
        .await
        .unwrap();
    next_event(&mut events, "decision.accepted", "run_id", &run_id).await;
    let completed = next_event(&mut events, "run.completed", "run_id", &run_id).await;
    assert_eq!(completed["termination_reason"], "completed");
    let mut conn = sqlx::PgConnection::connect(&db.url()).await.unwrap();
    let images: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM content.file_references WHERE element = 5 AND field = 'image' AND NOT deleted",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(images, 3, "the approved attachment was written");
    drop(conn);

    // The reaper, as its own user, finds nothing to repair.
    let reaper = as_user("countersign-reaper", "countersign-reaper")
        .arg("--no-declare")
        .output()
        .unwrap();
    assert!(
        reaper.status.success(),
        "{}",
        String::from_utf8_lossy(&reaper.stderr)
    );
    assert!(String::from_utf8_lossy(&reaper.stdout).starts_with("reaper pass: requeued=0"));

    for name in ["coordinator", "worker"] {
        let logged = std::fs::read_to_string(log(name)).unwrap();
        let _ = std::fs::remove_file(log(name));
        assert!(
            logged.contains("broker node unreachable; trying the next"),
            "the {name} did not pass the node that is down:\n{logged}"
        );
        for code in [
            "ACCESS_REFUSED",
            "publish_refused",
            "consume_failed",
            "topology_failed",
            "topology_missing",
        ] {
            assert!(
                !logged.contains(code),
                "the {name} was refused ({code}):\n{logged}"
            );
        }
    }
    drop((_coordinator, _worker));
    db.remove().await.unwrap();
}

#[tokio::test]
async fn the_reaper_and_api_users_publish_where_their_work_goes_and_never_through_amq_default() {
    let mq = Imported::new("publishers");
    let t = Topology::default();
    let as_user = |user: &'static str| {
        let mq = &mq;
        async move {
            mq.broker(mq.addr(user, &compose_password(user)))
                .await
                .unwrap_or_else(|e| panic!("{user}: {e}"))
        }
    };
    let reaper = as_user("countersign-reaper").await;
    let api = as_user("countersign-api").await;
    let run = countersign_core::RunId::new();

    // The reaper wakes a run through the segments exchange; the API only announces events.
    reaper.publish_segment(run).await.unwrap();
    let event = json!({"type": "countersign.event", "event": "run.refused"});
    for publisher in [&reaper, &api] {
        publisher
            .publish_event_body("run.refused", &Uuid::now_v7().to_string(), &event)
            .await
            .unwrap();
    }
    let refused = api
        .publish_segment(run)
        .await
        .expect_err("the API has no write permission on the segments exchange");
    assert_eq!(refused.code(), "publish_refused");
    // The default exchange would reach every queue: neither may write to it.
    for publisher in [&reaper, &api] {
        let refused = publisher
            .publish_message(&t.segments(), b"{}", &MessageProperties::default())
            .await
            .expect_err("no write permission on amq.default");
        assert_eq!(refused.code(), "publish_refused");
    }
    let admin = mq.broker(mq.admin_addr()).await.unwrap();
    assert_eq!(
        admin.message_count(&t.segments()).await.unwrap(),
        1,
        "the reaper's wake-up, and nothing else"
    );
}

#[tokio::test]
async fn the_producer_user_reaches_the_two_public_queues_and_nothing_else() {
    let mq = Imported::new("producer");
    let t = Topology::default();
    let producer = mq.user("countersign-producer");
    let producing = mq
        .broker(mq.addr("countersign-producer", PRODUCER_PASSWORD))
        .await
        .unwrap();
    let properties = MessageProperties {
        user_id: Some(producer),
        ..MessageProperties::default()
    };
    for queue in t.public_queues() {
        producing
            .publish_public(&queue, b"{}", &properties)
            .await
            .unwrap_or_else(|e| panic!("{queue}: {e}"));
    }
    // The default exchange would reach every queue: refused, for the public ones too.
    for queue in [t.segments(), t.run_requests()] {
        let refused = producing
            .publish_message(&queue, b"{}", &properties)
            .await
            .expect_err("no write permission on amq.default");
        assert_eq!(refused.code(), "publish_refused", "{queue}");
    }
    let refused = producing
        .consume(&t.run_requests(), 1)
        .await
        .expect_err("no read permission");
    assert_eq!(refused.code(), "consume_failed");
    assert!(
        producing.declare_private_queue().await.is_err(),
        "no configure permission"
    );

    // What it sent is in the public queues, under its validated user.
    let admin = mq.broker(mq.admin_addr()).await.unwrap();
    for queue in t.public_queues() {
        let mut consumer = admin.consume(&queue, 1).await.unwrap();
        let d = tokio::time::timeout(GUARD, consumer.next())
            .await
            .unwrap_or_else(|_| panic!("nothing in {queue}"))
            .unwrap()
            .unwrap();
        assert_eq!(d.user_id, properties.user_id, "{queue}");
        d.ack().await.unwrap();
    }
}

#[tokio::test]
async fn the_policies_dead_letter_a_message_redelivered_past_the_delivery_limit_and_bound_the_dead_letters(
) {
    let mq = Imported::new("policy");
    let t = Topology::default();

    // The queues carry no dead-letter arguments: the policy gives them.
    let out = rabbitmqctl(&[
        "list_queues",
        "-p",
        &mq.vhost,
        "-q",
        "--no-table-headers",
        "name",
        "policy",
        "arguments",
    ]);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    for queue in t.work_queues() {
        let line = listing
            .lines()
            .find(|l| l.split_whitespace().next() == Some(queue.as_str()))
            .unwrap_or_else(|| panic!("{queue} in {listing}"));
        assert!(line.contains("countersign-work-queues"), "{line}");
        assert!(!line.contains("x-dead-letter"), "{line}");
        assert!(!line.contains("x-delivery-limit"), "{line}");
    }
    // The dead-letter queue is bounded by its own policy (whose bounds the definitions test
    // holds to the topology's), not by its arguments.
    let line = listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(t.dead_letters().as_str()))
        .unwrap_or_else(|| panic!("{} in {listing}", t.dead_letters()));
    assert!(line.contains("countersign-dead-letters"), "{line}");
    assert!(!line.contains("x-max-length"), "{line}");

    let broker = mq.broker(mq.admin_addr()).await.unwrap();
    let run = countersign_core::RunId::new();
    broker.publish_segment(run).await.unwrap();
    let mut segments = broker.consume(&t.segments(), 1).await.unwrap();
    for attempt in 0..=u64::from(DEFAULT_DELIVERY_LIMIT) {
        let d = tokio::time::timeout(GUARD, segments.next())
            .await
            .expect("redelivered within the limit")
            .unwrap()
            .unwrap();
        assert_eq!(d.delivery_count(), attempt);
        d.requeue().await.unwrap();
    }
    let mut dead = broker.consume(&t.dead_letters(), 1).await.unwrap();
    let d = tokio::time::timeout(GUARD, dead.next())
        .await
        .expect("dead-lettered by the policy")
        .unwrap()
        .unwrap();
    assert_eq!(countersign_queue::parse_segment(&d.body), Ok(run));
    assert_eq!(d.dead_letter_reason().as_deref(), Some("delivery_limit"));
    d.ack().await.unwrap();
}

/// `(ready, unacknowledged)` messages of `queue` in the vhost, as the broker counts them.
fn queue_counts(vhost: &str, queue: &str) -> (u64, u64) {
    let out = rabbitmqctl(&[
        "list_queues",
        "-p",
        vhost,
        "-q",
        "--no-table-headers",
        "name",
        "messages_ready",
        "messages_unacknowledged",
    ]);
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = listing
        .lines()
        .find(|l| l.split_whitespace().next() == Some(queue))
        .unwrap_or_else(|| panic!("{queue} in {listing}"));
    let counts: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().expect("a count"))
        .collect();
    (counts[0], counts[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stopped_under_its_definitions_user_hands_its_waiting_wake_up_back_spending_no_delivery(
) {
    // Its user may write to the segments exchange, never to the default exchange (which
    // reaches every queue of the vhost).
    let d = definitions();
    let worker_may_write = by_name(&d, "permissions")
        .into_iter()
        .find(|p| p["user"] == "countersign-worker")
        .map(|p| p["write"].as_str().unwrap().to_owned())
        .expect("the worker's permissions");
    assert_eq!(worker_may_write, "^countersign\\.(segments|events|dlx)$");

    let mq = Imported::new("handback");
    let db = Database::create("deploy_handback").await;
    let t = Topology::default();
    let install = Installation {
        database_url: db.url(),
        queue_prefix: t.prefix.clone(),
    };
    // A model that never answers: the first run holds the worker's only slot.
    let model = ModelStub::silent();
    let dir = TempDir::new();
    let agent = dir.json(
        "agent.json",
        &json!({
            "name": "seo-assistant",
            "model": model_settings(&model),
            "policy": {"allowed_groups": ["content"], "enabled_tools": []},
            "max_iterations": 4,
            "approval_deadline_secs": 3600
        }),
    );
    install.configure(&agent);
    let operator = mq.user("countersign-operator");
    install.countersign_ok(&["producers", "allow", &operator, "acting-user", "*"]);

    let as_user = |binary: &str, user: &str| {
        let mut cmd = install.command(binary);
        cmd.env("AMQP_ADDR", mq.addr(user, &compose_password(user)));
        cmd
    };
    let log = std::env::temp_dir().join(format!("countersign-worker-{}.log", mq.suffix));
    let _coordinator = Process::from(
        as_user("countersign-coordinator", "countersign-coordinator")
            .arg("--no-declare")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut worker = Process::from(
        as_user("countersign-worker", "countersign-worker")
            .args([
                "--no-declare",
                "--concurrency",
                "1",
                "--lease-ttl-secs",
                "3",
            ])
            // Only its wake-up brings the second run to this worker.
            .args(["--poll-interval-secs", "3600"])
            .env(MODEL_KEY_ENV, "fake-key")
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap(),
    );
    let submit = |prompt: &str| {
        let out = as_user("countersign", "countersign-operator")
            .args([
                "submit",
                "--agent",
                "seo-assistant",
                "--as",
                "editor",
                prompt,
            ])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        said.split_whitespace().nth(1).expect("a run id").to_owned()
    };

    submit("Improve page 12.");
    let deadline = Instant::now() + GUARD;
    while model.requests().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the first run never reached its model"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = submit("Improve page 13.");
    // The second wake-up is delivered, and held by the worker while it waits for its slot.
    let deadline = Instant::now() + GUARD;
    while queue_counts(&mq.vhost, &t.segments()) != (0, 1) {
        assert!(
            Instant::now() < deadline,
            "the worker never took the second wake-up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    worker.sigterm();
    let status = worker
        .exit_within(GUARD)
        .await
        .expect("the worker stops on SIGTERM");
    assert!(status.success(), "the worker exited with {status}");
    let logged = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    for refusal in ["ACCESS_REFUSED", "publish_refused", "requeuing it"] {
        assert!(
            !logged.contains(refusal),
            "the hand-back was refused ({refusal}):\n{logged}"
        );
    }

    // Handed back as a fresh message: neither redelivered nor counted against the delivery
    // limit after which the quorum queue would dead-letter it.
    let admin = mq.broker(mq.admin_addr()).await.unwrap();
    let mut segments = admin.consume(&t.segments(), 8).await.unwrap();
    loop {
        let d = tokio::time::timeout(GUARD, segments.next())
            .await
            .expect("the second run's wake-up is back in the queue")
            .unwrap()
            .unwrap();
        let run = countersign_queue::parse_segment(&d.body)
            .unwrap()
            .to_string();
        let spent = (d.redelivered, d.delivery_count());
        d.ack().await.unwrap();
        if run == second {
            assert_eq!(spent, (false, 0), "handed back as a fresh message");
            break;
        }
    }
    let (dead, _) = queue_counts(&mq.vhost, &t.dead_letters());
    assert_eq!(dead, 0, "nothing was dead-lettered");
    drop(_coordinator);
    db.remove().await.unwrap();
}
