//! End-to-end: the real binaries against the real PostgreSQL and RabbitMQ.

mod all_or_nothing;
mod by_call;
mod cards;
mod data_classes;
mod demo;
mod deploy;
mod failover;
mod faults;
mod inbox;
mod lying_servers;
mod mcp;
mod observability;
mod operator;
mod policies;
mod recovery;
mod remote_tools;
mod schemathesis;
mod sequence;
mod services;
mod shutdown;
mod silence;
mod team;
mod webhooks;
