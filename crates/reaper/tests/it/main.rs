//! One reaper pass against the real PostgreSQL and the real RabbitMQ.

mod pass;
