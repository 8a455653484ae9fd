//! End-to-end: the real binaries against the real PostgreSQL and RabbitMQ.

mod cards;
mod demo;
mod faults;
mod operator;
mod recovery;
mod services;
mod shutdown;
