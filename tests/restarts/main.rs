//! Faults that need the services themselves restarted or killed: the broker restarted while an
//! approved turn is in flight, PostgreSQL restarted inside one, a coordinator killed between
//! recording an approval and dispatching it, and two coordinators on the same queues; and a
//! RabbitMQ cluster of the test's own whose nodes stop under approvals and the chaos suite —
//! here rather than beside the e2e tests, because a cluster starting and failing over among
//! them is starved of the start-up time its nodes need.
//!
//! A separate test target, because restarting PostgreSQL or RabbitMQ disturbs any test running
//! beside it: cargo runs test binaries one after another, so this binary never overlaps the
//! `e2e` one, and its tests take one lock so they never overlap each other. Before each restart
//! a test waits until no other engineer's test process runs, and a drop guard brings both
//! services back up (waiting for `pg_isready` and `rabbitmqctl await_startup`) even when the
//! test panics.
//!
//! Each scenario ends on what the content store and the journal say: approved writes lost 0,
//! duplicated 0.

mod broker;
mod cluster;
mod coordinators;
mod dispatch;
mod postgres;
mod support;
