//! Policies over approval cards: rules, written in Cedar against the schema countersign ships,
//! that approve, deny or ask a person about a suspended turn from what its previews show.
//!
//! This crate loads (its only I/O: reading policy files), validates and evaluates; it decides
//! nothing by itself. Its
//! verdict becomes a decision only through the coordinator's gates, as a person's would, under
//! the principal `policy:<id>@<version>`. It must never turn an error into an approval: a file
//! that does not validate is refused at load, and an evaluation that fails asks a person.

mod engine;
mod facts;
mod grant;
mod route;
mod set;

pub use engine::{
    schema, AskReason, Evaluation, LoadError, Mode, Outcome, OutcomeKind, Policy,
    DEFAULT_DENY_MESSAGE, EVALUATION_BUDGET, SCHEMA,
};
pub use facts::{Arg, CallFacts, CardFacts, PreviewFacts, RunFacts};
pub use grant::{grant_source, grantable, GrantRefusal};
pub use route::MAX_ROUTED;
pub use set::{read, Loaded, PolicySource, SourceError};

#[cfg(test)]
mod tests;
