//! The transport against the real RabbitMQ at `AMQP_ADDR`. Each test declares its own
//! topology under a unique prefix and deletes it at the end.

mod support;

mod delivery;
mod publish;
mod silent;
mod topology;
mod trace;
