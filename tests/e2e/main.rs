//! End-to-end: the real binaries against the real PostgreSQL.

mod demo;
