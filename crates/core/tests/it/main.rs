//! Behaviour of the domain core, through its public API, with in-memory tools and a scripted
//! model. No service is needed: the core does no I/O.

mod support;

mod boundary;
mod card;
mod comparator;
mod loop_scenarios;
mod pipeline;
mod preview_bounds;
mod rehydration;
