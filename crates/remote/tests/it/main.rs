//! The remote tool client against real HTTP servers on loopback.

mod client;
mod schemas;
mod tls;
mod wiki;
