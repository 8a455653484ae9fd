//! What the tests, the demo and the bench need the same way, written once: a throwaway
//! database ([`Database`]), an OpenAI-compatible model that answers what it is told
//! ([`ModelStub`]), the service binaries started, awaited, stopped, paused and continued as an
//! installation would see them ([`Process`]), and a TCP proxy whose link to PostgreSQL or
//! RabbitMQ a test makes silent, reset or slow ([`Proxy`]). With the feature `site`, the demo site, an agent and the worker's
//! segment runner over them (`site::Site`), for the suites of the crates around the worker.
//!
//! It is test support: a dev-dependency of the test suites and a dependency of the
//! `countersign-dev` binary, never of anything that ships. It must never fake a step the
//! services perform: it starts the real binaries, creates real databases and answers as a
//! model provider would, nothing else.

mod database;
mod model;
mod process;
mod proxy;
#[cfg(feature = "site")]
pub mod site;

pub use database::Database;
pub use model::{chat_answer, messages_with_role, ModelStub, Recorded, Reply};
pub use process::{binary, counter_total, free_port, http_get, process_runs, wait_until, Process};
pub use proxy::{Link, Proxy};

/// A fixed test keyring (32 zero bytes): these tests are about behaviour, not about keys.
pub const KEYS: &str = "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

/// PostgreSQL, where the tests find it: `DATABASE_URL`, by default the local server.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// RabbitMQ, where the tests find it: `AMQP_ADDR`, by default the local broker.
pub fn amqp_addr() -> String {
    std::env::var("AMQP_ADDR")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}
