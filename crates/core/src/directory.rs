//! Who users are and what they may decide: the one contract the coordinator's gates, the
//! worker and the surfaces ask, whatever system keeps the users.
//!
//! The users belong to the system the tools work on (the reference content store keeps its
//! own), so countersign asks that system rather than keeping a copy that could drift from it.
//! A directory answers three questions, each with one read of its own:
//! - who a user is — the [`Principal`], with the admin flag the tools' policy checks;
//! - whether the user may be a run's acting user — the same answer: a user it knows and has not
//!   disabled ([`UserDirectory::principal`] is `Some`);
//! - whether the user may approve runs of an agent — an administrator, or a holder of the
//!   directory's approve grant for that agent or for every agent ([`UserDirectory::approver`],
//!   [`Approves`]).
//!
//! A run's own acting user may always decide on their own run (four-eyes aside). That rule is
//! the coordinator's, not the directory's: a directory only says what it grants.

use std::fmt;

use async_trait::async_trait;

use crate::errors::DatabaseCode;
use crate::tool::Principal;

/// Where the principals runs act as, and their approvers, come from: the users of the system
/// the tools work on.
///
/// For a name the directory does not know, or a user it has disabled, every method answers
/// `None`: that name may neither be a run's acting user nor decide on a run, whatever it shares
/// with one. An `Err` says nothing about the user (see [`DirectoryError`]).
#[async_trait]
pub trait UserDirectory: Send + Sync + fmt::Debug {
    /// The user called `name`. May attach what it read to the principal
    /// ([`Principal::with_profile`]) for tools of the same system.
    async fn principal(&self, name: &str) -> Result<Option<Principal>, DirectoryError>;

    /// The user called `name` as an approver: who they are, and which agents' runs the
    /// directory lets them approve. One read, so a gate that asks both questions sees one state
    /// of the user.
    async fn approver(&self, name: &str) -> Result<Option<Approver>, DirectoryError>;
}

/// Whose runs a directory's approve grant covers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Approves {
    /// No agent's: the user may decide only on their own runs.
    #[default]
    Nothing,
    /// Every agent's.
    Every,
    /// The runs of these agents (by name).
    Agents(std::collections::BTreeSet<String>),
}

impl Approves {
    /// The grant for `agents`, `*` standing for every agent.
    pub fn of<S: AsRef<str>>(agents: impl IntoIterator<Item = S>) -> Approves {
        let mut named = std::collections::BTreeSet::new();
        for agent in agents {
            match agent.as_ref() {
                "*" => return Approves::Every,
                name => {
                    named.insert(name.to_owned());
                }
            }
        }
        if named.is_empty() {
            Approves::Nothing
        } else {
            Approves::Agents(named)
        }
    }

    /// Whether the grant covers runs of `agent`.
    pub fn covers(&self, agent: &str) -> bool {
        match self {
            Approves::Nothing => false,
            Approves::Every => true,
            Approves::Agents(names) => names.contains(agent),
        }
    }
}

/// A user as a directory answers for a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approver {
    principal: Principal,
    approves: Approves,
}

impl Approver {
    /// `principal`, with the directory's approve grant `approves`.
    pub fn new(principal: Principal, approves: Approves) -> Self {
        Approver {
            principal,
            approves,
        }
    }

    /// Who the approver is, for the policy checks of the writes they release.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Whose runs the approver may approve, whoever their acting user: every agent's for an
    /// administrator, otherwise those the grant covers.
    pub fn approves(&self) -> Approves {
        if self.principal.admin {
            Approves::Every
        } else {
            self.approves.clone()
        }
    }

    /// Whether the directory lets this user approve runs of `agent`, whoever their acting user.
    pub fn may_approve_runs_of(&self, agent: &str) -> bool {
        self.principal.admin || self.approves.covers(agent)
    }
}

/// A directory that could not answer. Nothing is known about the user — not even that there
/// is none — so no caller may take it for `None`: the worker interrupts the segment, the
/// coordinator requeues the delivery, a surface answers "unavailable", and each asks again.
///
/// Only [`DirectoryError::code`] may reach an event, a reply or the database; the text is for
/// the log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirectoryError {
    /// The database the directory reads failed: unreachable, timed out, the statement refused.
    #[error("the user directory's database failed: {0}")]
    Database(Box<dyn std::error::Error + Send + Sync>),
}

impl DirectoryError {
    pub fn database(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        DirectoryError::Database(Box::new(e))
    }

    pub fn code(&self) -> &'static str {
        match self {
            DirectoryError::Database(_) => DatabaseCode::Error.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_administrator_may_approve_runs_of_every_agent_without_a_grant() {
        let admin = Approver::new(Principal::new("admin", true), Approves::Nothing);
        assert!(admin.may_approve_runs_of("assistant"));
        assert_eq!(admin.approves(), Approves::Every);
    }

    #[test]
    fn a_user_who_is_not_admin_may_approve_only_the_agents_the_grant_names() {
        let scoped = Approver::new(Principal::new("approver", false), Approves::of(["wiki"]));
        assert!(scoped.may_approve_runs_of("wiki"));
        assert!(!scoped.may_approve_runs_of("catalogue"));
        let every = Approver::new(Principal::new("approver", false), Approves::Every);
        assert!(every.may_approve_runs_of("catalogue"));
        let none = Approver::new(Principal::new("editor", false), Approves::Nothing);
        assert!(!none.may_approve_runs_of("wiki"));
    }

    #[test]
    fn a_star_among_the_granted_agents_grants_every_agent_and_no_name_grants_none() {
        assert_eq!(Approves::of(["wiki", "*"]), Approves::Every);
        assert_eq!(Approves::of(Vec::<String>::new()), Approves::Nothing);
        assert_eq!(
            Approves::of(["b", "a", "b"]),
            Approves::Agents(["a".to_owned(), "b".to_owned()].into())
        );
    }

    #[test]
    fn a_failed_directory_reports_the_database_code_and_its_cause_for_the_log() {
        let e = DirectoryError::database(std::io::Error::other("connection reset"));
        assert_eq!(e.code(), "database_error");
        assert!(e.to_string().contains("connection reset"), "{e}");
    }
}
