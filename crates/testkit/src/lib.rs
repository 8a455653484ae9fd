//! What the tests, the demo and the bench need the same way, written once: a throwaway
//! database ([`Database`]), an OpenAI-compatible model that answers what it is told
//! ([`ModelStub`]), and the service binaries started, awaited and stopped as an installation
//! would ([`Process`]).
//!
//! It is test support: a dev-dependency of the test suites and a dependency of the
//! `countersign-dev` binary, never of anything that ships. It must never fake a step the
//! services perform: it starts the real binaries, creates real databases and answers as a
//! model provider would, nothing else.

mod database;
mod model;
mod process;

pub use database::Database;
pub use model::{messages_with_role, ModelStub, Recorded, Reply};
pub use process::{binary, free_port, http_get, is_ready, process_runs, Process};

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
