//! End-to-end: the real binaries against the real PostgreSQL and RabbitMQ.

mod demo;
mod operator;
mod recovery;
mod services;
mod shutdown;
