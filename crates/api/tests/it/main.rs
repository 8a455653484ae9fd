//! The API and the inbox over real HTTP, against a real PostgreSQL (one database per test) and
//! RabbitMQ (one topology per test).

mod auth;
mod decisions;
mod groups;
mod idempotency;
mod inbox;
mod observe;
mod openapi;
mod runs;
mod support;
mod transport;
