//! Approvers as a team: who must approve a card, and whether the votes given so far release it.
//!
//! An agent may want more than one person's approval: *K distinct approvers from group G*, and
//! several such requirements at once (one from `legal` and one from `marketing`). Each approval
//! is then a vote bound to the card (its suspension number and digest); the turn is released
//! only when the votes of distinct people fill every requirement, and ended by the configured
//! number of denials. A new card (a bounce, an edit) starts with no votes: the votes of the old
//! one are dismissed because they name its suspension.
//!
//! The tally is a plain function of the votes, so the store can decide it under the run's row
//! lock and every surface can say where a card stands with the same words.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// `count` distinct approvers from `group`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub group: String,
    pub count: u32,
}

/// Who must approve an agent's cards.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Quorum {
    /// Every requirement must be met, each by different people.
    pub requirements: Vec<Requirement>,
    /// How many denials end the card (at least 1).
    pub denials_to_end: u32,
}

impl Quorum {
    /// Whether the agent wants anything beyond one approver's decision.
    pub fn is_team(&self) -> bool {
        !self.requirements.is_empty()
    }

    /// The groups whose members may vote.
    pub fn groups(&self) -> BTreeSet<&str> {
        self.requirements.iter().map(|r| r.group.as_str()).collect()
    }

    /// This quorum made stricter by `more` (a policy's routing of one card): each group's
    /// count is the larger of the two, a group only `more` names is added. Never looser.
    pub fn refined(&self, more: &[Requirement]) -> Quorum {
        let mut requirements = self.requirements.clone();
        for r in more {
            match requirements.iter_mut().find(|q| q.group == r.group) {
                Some(q) => q.count = q.count.max(r.count),
                None => requirements.push(r.clone()),
            }
        }
        Quorum {
            requirements,
            denials_to_end: self.denials_to_end.max(1),
        }
    }
}

/// One vote on a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vote {
    pub voter: String,
    pub approved: bool,
    /// The groups the vote counts for: the voter's own, and those of whoever delegated their
    /// cards to the voter, as they were when it was cast.
    pub groups: BTreeSet<String>,
    /// The calls the vote lets run; `None`: the whole turn as one.
    pub calls: Option<Vec<usize>>,
}

/// Where the votes of a card leave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tally {
    /// Every requirement is met by distinct approvers: the turn is released.
    Released,
    /// The configured number of denials was reached: the card is ended, denied.
    Denied,
    /// Approvals that let different calls run cannot count together.
    CallsDiffer,
    /// Still waiting.
    Waiting(Standing),
}

/// What a waiting card has and still needs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Standing {
    /// Who approved, in the order of their votes.
    pub approvers: Vec<String>,
    /// Who denied.
    pub deniers: Vec<String>,
    /// Per group, how many more approvals it needs.
    pub missing: Vec<Requirement>,
    /// The approvals needed in all.
    pub needed: u32,
}

impl Standing {
    /// The words every surface shows: "1 of 2 approvals — alice; waiting for one of marketing".
    pub fn summary(&self) -> String {
        let given = self.approvers.len();
        let mut s = format!(
            "{given} of {} approval{}",
            self.needed,
            if self.needed == 1 { "" } else { "s" }
        );
        if given > 0 {
            s.push_str(" — ");
            s.push_str(&self.approvers.join(", "));
        }
        if !self.missing.is_empty() {
            let waiting: Vec<String> = self
                .missing
                .iter()
                .map(|r| match r.count {
                    1 => format!("one of {}", r.group),
                    n => format!("{n} of {}", r.group),
                })
                .collect();
            s.push_str("; waiting for ");
            s.push_str(&waiting.join(" and "));
        }
        if !self.deniers.is_empty() {
            s.push_str(&format!("; denied by {}", self.deniers.join(", ")));
        }
        s
    }
}

/// The tally of `votes` under `quorum`. `editors` changed the card's arguments: under a quorum
/// an editor may be one of the approvers, never all of them. `backup` is the group a card was
/// escalated to: one approval by a member decides it.
pub fn tally(quorum: &Quorum, votes: &[Vote], editors: &[String], backup: Option<&str>) -> Tally {
    let denials = votes.iter().filter(|v| !v.approved).count();
    if denials >= quorum.denials_to_end.max(1) as usize {
        return Tally::Denied;
    }
    let approvals: Vec<&Vote> = votes.iter().filter(|v| v.approved).collect();
    if let Some(first) = approvals.first() {
        if approvals.iter().any(|v| v.calls != first.calls) {
            return Tally::CallsDiffer;
        }
    }
    let not_only_editors = approvals.iter().any(|v| !editors.contains(&v.voter));
    if let Some(backup) = backup {
        if not_only_editors && approvals.iter().any(|v| v.groups.contains(backup)) {
            return Tally::Released;
        }
    }
    let slots: Vec<&str> = quorum
        .requirements
        .iter()
        .flat_map(|r| std::iter::repeat_n(r.group.as_str(), r.count as usize))
        .collect();
    let mut taken = vec![None; slots.len()];
    for voter in 0..approvals.len() {
        let mut seen = vec![false; slots.len()];
        assign(voter, &approvals, &slots, &mut taken, &mut seen);
    }
    let filled = taken.iter().filter(|t| t.is_some()).count();
    if filled == slots.len() && not_only_editors {
        return Tally::Released;
    }
    Tally::Waiting(standing(quorum, &approvals, votes, &slots, &taken))
}

/// Kuhn's augmenting path: gives voter `v` a slot of one of their groups, moving earlier voters
/// to other slots of theirs when that frees one. Distinct people fill distinct slots.
fn assign(
    v: usize,
    approvals: &[&Vote],
    slots: &[&str],
    taken: &mut [Option<usize>],
    seen: &mut [bool],
) -> bool {
    for (s, group) in slots.iter().enumerate() {
        if seen[s] || !approvals[v].groups.contains(*group) {
            continue;
        }
        seen[s] = true;
        let free = match taken[s] {
            None => true,
            Some(other) => assign(other, approvals, slots, taken, seen),
        };
        if free {
            taken[s] = Some(v);
            return true;
        }
    }
    false
}

fn standing(
    quorum: &Quorum,
    approvals: &[&Vote],
    votes: &[Vote],
    slots: &[&str],
    taken: &[Option<usize>],
) -> Standing {
    let missing = quorum
        .requirements
        .iter()
        .filter_map(|r| {
            let open = slots
                .iter()
                .zip(taken)
                .filter(|(g, t)| **g == r.group && t.is_none())
                .count() as u32;
            (open > 0).then(|| Requirement {
                group: r.group.clone(),
                count: open.min(r.count),
            })
        })
        .collect();
    Standing {
        approvers: approvals.iter().map(|v| v.voter.clone()).collect(),
        deniers: votes
            .iter()
            .filter(|v| !v.approved)
            .map(|v| v.voter.clone())
            .collect(),
        missing,
        needed: slots.len() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vote(voter: &str, groups: &[&str]) -> Vote {
        Vote {
            voter: voter.into(),
            approved: true,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            calls: None,
        }
    }

    fn quorum(reqs: &[(&str, u32)]) -> Quorum {
        Quorum {
            requirements: reqs
                .iter()
                .map(|(g, c)| Requirement {
                    group: g.to_string(),
                    count: *c,
                })
                .collect(),
            denials_to_end: 1,
        }
    }

    #[test]
    fn a_refined_quorum_is_never_looser_than_the_agents() {
        let agent = quorum(&[("legal", 2)]);
        let refined = agent.refined(&[
            Requirement {
                group: "legal".into(),
                count: 1,
            },
            Requirement {
                group: "marketing".into(),
                count: 1,
            },
        ]);
        assert_eq!(refined, quorum(&[("legal", 2), ("marketing", 1)]));
        let single = Quorum::default().refined(&[Requirement {
            group: "legal".into(),
            count: 2,
        }]);
        assert!(single.is_team());
        assert_eq!(single, quorum(&[("legal", 2)]));
    }

    #[test]
    fn two_of_a_group_release_only_with_the_second_distinct_approval() {
        let q = quorum(&[("legal", 2)]);
        let one = [vote("alice", &["legal"])];
        let Tally::Waiting(s) = tally(&q, &one, &[], None) else {
            panic!("waiting")
        };
        assert_eq!(
            s.summary(),
            "1 of 2 approvals — alice; waiting for one of legal"
        );
        let two = [vote("alice", &["legal"]), vote("bob", &["legal"])];
        assert_eq!(tally(&q, &two, &[], None), Tally::Released);
    }

    #[test]
    fn one_of_legal_and_one_of_marketing_need_two_people_even_if_one_is_in_both() {
        let q = quorum(&[("legal", 1), ("marketing", 1)]);
        let both = [vote("alice", &["legal", "marketing"])];
        let Tally::Waiting(s) = tally(&q, &both, &[], None) else {
            panic!("waiting")
        };
        assert_eq!(
            s.summary(),
            "1 of 2 approvals — alice; waiting for one of marketing"
        );
        let two = [
            vote("alice", &["legal", "marketing"]),
            vote("carol", &["legal"]),
        ];
        assert_eq!(tally(&q, &two, &[], None), Tally::Released, "alice moves");
    }

    #[test]
    fn a_denial_ends_the_card_and_k_denials_when_configured() {
        let mut q = quorum(&[("legal", 2)]);
        let mut no = vote("alice", &["legal"]);
        no.approved = false;
        assert_eq!(tally(&q, &[no.clone()], &[], None), Tally::Denied);
        q.denials_to_end = 2;
        assert!(matches!(
            tally(&q, &[no], &[], None),
            Tally::Waiting(s) if s.deniers == ["alice"]
        ));
    }

    #[test]
    fn approvals_of_different_calls_do_not_count_together() {
        let q = quorum(&[("legal", 2)]);
        let mut b = vote("bob", &["legal"]);
        b.calls = Some(vec![0]);
        assert_eq!(
            tally(&q, &[vote("alice", &["legal"]), b], &[], None),
            Tally::CallsDiffer
        );
    }

    #[test]
    fn an_editor_is_one_of_the_approvers_never_the_only_one() {
        let q = quorum(&[("legal", 1)]);
        let editors = ["alice".to_owned()];
        assert!(matches!(
            tally(&q, &[vote("alice", &["legal"])], &editors, None),
            Tally::Waiting(_)
        ));
        let q = quorum(&[("legal", 2)]);
        let two = [vote("alice", &["legal"]), vote("bob", &["legal"])];
        assert_eq!(tally(&q, &two, &editors, None), Tally::Released);
    }

    #[test]
    fn after_escalation_one_member_of_the_backup_group_decides() {
        let q = quorum(&[("legal", 2)]);
        let v = [vote("dana", &["backup"])];
        assert_eq!(tally(&q, &v, &[], Some("backup")), Tally::Released);
        assert!(matches!(tally(&q, &v, &[], None), Tally::Waiting(_)));
    }
}
