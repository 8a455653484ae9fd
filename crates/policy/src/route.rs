//! Routing: an `ask` rule's `@approvers("legal:2, marketing")` annotation names who must approve
//! a card the policy leaves to people — K distinct approvers from each group named (K is 1 when
//! left out). The coordinator refines the agent's quorum with it for that card only
//! ([`countersign_core::quorum::Quorum::refined`]): a route can add groups or raise a count,
//! never lower what the agent wants.

use std::collections::BTreeMap;

use cedar_policy::PolicySet;
use countersign_core::quorum::Requirement;

use crate::engine::{rule_number, LoadError};

/// The most approvers one group may be asked for.
pub const MAX_ROUTED: u32 = 10;

/// The routes of a policy's rules, by rule number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes(BTreeMap<usize, Vec<Requirement>>);

impl Routes {
    /// Reads every rule's `@approvers`; refuses the file at the first one that does not parse,
    /// naming its line.
    pub fn of(source: &str, set: &PolicySet) -> Result<Routes, LoadError> {
        let mut routes = BTreeMap::new();
        for policy in set.policies() {
            let Some(value) = policy.annotation("approvers") else {
                continue;
            };
            let rule = rule_number(policy.id()).unwrap_or(0);
            let parsed = parse(value).map_err(|message| LoadError::Invalid {
                line: line_of_annotation(source, value),
                message: format!("@approvers(\"{value}\"): {message}"),
            })?;
            routes.insert(rule, parsed);
        }
        Ok(Routes(routes))
    }

    /// The requirements rule `rule` names, if any.
    pub fn of_rule(&self, rule: usize) -> Option<&[Requirement]> {
        self.0.get(&rule).map(Vec::as_slice)
    }
}

/// `group[:count]` entries, comma-separated.
fn parse(value: &str) -> Result<Vec<Requirement>, String> {
    let mut out: Vec<Requirement> = Vec::new();
    for entry in value.split(',').map(str::trim) {
        let (group, count) = match entry.split_once(':') {
            Some((g, c)) => (
                g.trim(),
                c.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{c:?} is not a number of approvers"))?,
            ),
            None => (entry, 1),
        };
        if !is_group_name(group) {
            return Err(format!("{group:?} cannot name a group"));
        }
        if !(1..=MAX_ROUTED).contains(&count) {
            return Err(format!("a group is asked for 1 to {MAX_ROUTED} approvers"));
        }
        if out.iter().any(|r| r.group == group) {
            return Err(format!("{group} is named twice"));
        }
        out.push(Requirement {
            group: group.to_owned(),
            count,
        });
    }
    Ok(out)
}

/// A letter or digit, then up to 127 letters, digits, `_`, `.` and `-`: the directory's names.
fn is_group_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The line (1-based) of the annotation whose value is `value`; 1 when it is not found as
/// written.
fn line_of_annotation(source: &str, value: &str) -> usize {
    source
        .lines()
        .position(|l| l.contains("@approvers") && l.contains(value))
        .map_or(1, |i| i + 1)
}

/// The union of `routes`: each group asked for the largest count any names.
pub fn merged<'a>(routes: impl IntoIterator<Item = &'a [Requirement]>) -> Vec<Requirement> {
    let mut out: Vec<Requirement> = Vec::new();
    for r in routes.into_iter().flatten() {
        match out.iter_mut().find(|q| q.group == r.group) {
            Some(q) => q.count = q.count.max(r.count),
            None => out.push(r.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_approvers_annotation_reads_groups_and_counts_and_refuses_what_is_not_one() {
        assert_eq!(
            parse("legal:2, marketing").unwrap(),
            vec![
                Requirement {
                    group: "legal".into(),
                    count: 2
                },
                Requirement {
                    group: "marketing".into(),
                    count: 1
                }
            ]
        );
        for bad in [
            "",
            "legal:0",
            "legal:11",
            "legal:x",
            "a b",
            "legal, legal:2",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
