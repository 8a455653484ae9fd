//! Who users are and what they may decide: the one contract the coordinator's gates, the
//! worker and the surfaces ask, whatever system keeps the users.
//!
//! The users belong to the system the tools work on (the reference content store keeps its
//! own), so countersign asks that system rather than keeping a copy that could drift from it.
//! A directory answers three questions, each with one read of its own:
//! - who a user is — the [`Principal`], with the admin flag the tools' policy checks;
//! - whether the user may be a run's acting user — the same answer: a user it knows and has not
//!   disabled ([`UserDirectory::principal`] is `Some`);
//! - whether the user may approve runs — an administrator, or a holder of the directory's
//!   approve grant ([`UserDirectory::approver`]).
//!
//! A run's own acting user may always decide on their own run (four-eyes aside). That rule is
//! the coordinator's, not the directory's: a directory only says what it grants.

use std::fmt;

use async_trait::async_trait;

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

    /// The user called `name` as an approver: who they are, and whether the directory lets them
    /// approve runs. One read, so a gate that asks both questions sees one state of the user.
    async fn approver(&self, name: &str) -> Result<Option<Approver>, DirectoryError>;
}

/// A user as a directory answers for a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approver {
    principal: Principal,
    granted: bool,
}

impl Approver {
    /// `principal`, holding the directory's approve grant or not.
    pub fn new(principal: Principal, granted: bool) -> Self {
        Approver { principal, granted }
    }

    /// Who the approver is, for the policy checks of the writes they release.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Whether the directory lets this user approve runs of any agent and acting user: an
    /// administrator always, anyone else with the grant.
    pub fn may_approve_runs(&self) -> bool {
        self.principal.admin || self.granted
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
            DirectoryError::Database(_) => "database_error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_administrator_may_approve_runs_without_the_grant() {
        assert!(Approver::new(Principal::new("admin", true), false).may_approve_runs());
    }

    #[test]
    fn a_user_who_is_not_admin_may_approve_runs_only_with_the_grant() {
        assert!(Approver::new(Principal::new("approver", false), true).may_approve_runs());
        assert!(!Approver::new(Principal::new("editor", false), false).may_approve_runs());
    }

    #[test]
    fn a_failed_directory_reports_the_database_code_and_its_cause_for_the_log() {
        let e = DirectoryError::database(std::io::Error::other("connection reset"));
        assert_eq!(e.code(), "database_error");
        assert!(e.to_string().contains("connection reset"), "{e}");
    }
}
