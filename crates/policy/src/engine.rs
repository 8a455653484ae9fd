//! A policy file: loaded (parsed and validated against the schema countersign ships), and
//! evaluated over a card's facts.
//!
//! A policy is a Cedar policy set under a header of `// key: value` lines (`policy`,
//! `version`, `mode`). Each Cedar `permit` or `forbid` is a *rule*, numbered from 1 in the
//! order of the file. A card is approved when every write call of it is permitted the action
//! `approve`; denied when any call is permitted `deny` (its `@message` annotation is what the
//! model is told); otherwise a person is asked — the people an `ask` rule's `@approvers`
//! annotation names, when one permits `ask` for a call ([`crate::route`]). Anything that goes wrong — a rule that errors,
//! an evaluation that overran its budget — asks a person too: a policy fails closed.

use std::str::FromStr;
use std::time::{Duration, Instant};

use cedar_policy::{
    Authorizer, Context, Decision, Entities, EntityUid, PolicyId, PolicySet, Request, Schema,
    ValidationMode, Validator,
};
use miette::Diagnostic;
use strum::{EnumString, IntoStaticStr, VariantArray, VariantNames};

use countersign_core::quorum::Requirement;

use crate::facts::{CallFacts, CardFacts};
use crate::route::{merged, Routes};

/// The Cedar schema of what a policy sees.
pub const SCHEMA: &str = include_str!("schema.cedarschema");

/// What the model is told for a deny whose rule has no `@message`.
pub const DEFAULT_DENY_MESSAGE: &str = "A policy denied this call.";

/// How long one card's evaluation may take before it counts as failed (and a person decides).
pub const EVALUATION_BUDGET: Duration = Duration::from_millis(50);

/// Whether a policy's outcomes take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum Mode {
    /// Approve and deny decide the card.
    Enforce,
    /// Evaluated and recorded ("a policy would have approved this"), with no effect.
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a policy file was refused at load. Each names the line it found wrong (1-based).
///
/// Its codes are [`VariantNames::VARIANTS`] (the header's twice).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, IntoStaticStr, VariantNames)]
#[strum(prefix = "policy_", serialize_all = "snake_case")]
#[non_exhaustive]
pub enum LoadError {
    #[error("line {line}: the header lacks `// {key}: …`")]
    #[strum(serialize = "header")]
    MissingHeader { line: usize, key: &'static str },
    #[error("line {line}: header `{key}` has an unusable value")]
    #[strum(serialize = "header")]
    BadHeader { line: usize, key: &'static str },
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("line {line}: {message}")]
    Invalid { line: usize, message: String },
    #[error("the file holds no rule")]
    Empty,
}

impl LoadError {
    /// A stable code for the log, a metric or a problem document.
    pub fn code(&self) -> &'static str {
        self.into()
    }

    /// The line it names (0 for none).
    pub fn line(&self) -> usize {
        match self {
            LoadError::MissingHeader { line, .. }
            | LoadError::BadHeader { line, .. }
            | LoadError::Syntax { line, .. }
            | LoadError::Invalid { line, .. } => *line,
            LoadError::Empty => 0,
        }
    }
}

/// Why an evaluation asked a person rather than deciding. Recorded as a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr, EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum AskReason {
    /// No rule approved every call, and none denied one.
    NoRule,
    /// A rule failed to evaluate.
    EvaluationError,
    /// The evaluation overran [`EVALUATION_BUDGET`].
    Timeout,
    /// No policy is loaded.
    NoPolicy,
    /// The card has no write call to decide.
    NoWrites,
    /// The same turn bounced too often (a preview moved after each approval): a person decides.
    LoopGuard,
    /// An `ask` rule named who must approve (`@approvers`): people of those groups decide.
    Routed,
}

impl AskReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What a policy makes of a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Approve,
    /// With the message the model sees.
    Deny {
        message: String,
    },
    Ask {
        reason: AskReason,
    },
}

/// The outcomes' stable spellings, as recorded and counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, IntoStaticStr, EnumString, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum OutcomeKind {
    Approve,
    Deny,
    Ask,
}

impl OutcomeKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl Outcome {
    pub fn kind(&self) -> OutcomeKind {
        match self {
            Outcome::Approve => OutcomeKind::Approve,
            Outcome::Deny { .. } => OutcomeKind::Deny,
            Outcome::Ask { .. } => OutcomeKind::Ask,
        }
    }
}

/// One policy's verdict on one card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    pub outcome: Outcome,
    /// The rule (1-based) that decided: for an approval, the one that permitted the first call.
    pub rule: Option<usize>,
    /// [`CardFacts::digest`] of what it saw.
    pub facts_digest: String,
    pub elapsed: Duration,
    /// For an ask the rules routed ([`AskReason::Routed`]): who must approve the card, on top
    /// of what the agent wants. Empty otherwise.
    pub route: Vec<Requirement>,
}

/// A loaded, validated policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub id: String,
    pub version: u32,
    pub mode: Mode,
    /// The file's text, as loaded.
    pub source: String,
    set: PolicySet,
    rules: usize,
    routes: Routes,
}

/// The schema countersign ships, parsed.
pub fn schema() -> Schema {
    #[allow(clippy::expect_used)]
    let (schema, _) = Schema::from_cedarschema_str(SCHEMA).expect("the shipped schema parses");
    schema
}

impl Policy {
    /// Parses the header and the rules of `source` and validates the rules against the schema;
    /// refuses the file naming the first line it found wrong.
    pub fn load(source: &str) -> Result<Policy, LoadError> {
        let header = Header::parse(source)?;
        let set = PolicySet::from_str(source).map_err(|e| LoadError::Syntax {
            line: line_of(source, &e),
            message: first_message(&e),
        })?;
        let rules = set.policies().count();
        if rules == 0 {
            return Err(LoadError::Empty);
        }
        let schema = schema();
        let result = Validator::new(schema).validate(&set, ValidationMode::Strict);
        if let Some(e) = result.validation_errors().next() {
            return Err(LoadError::Invalid {
                line: line_of(source, e),
                message: e.to_string(),
            });
        }
        let routes = Routes::of(source, &set)?;
        Ok(Policy {
            id: header.id,
            version: header.version,
            mode: header.mode,
            source: source.to_owned(),
            set,
            rules,
            routes,
        })
    }

    /// `policy:<id>@<version>`: the principal its decisions are made by.
    pub fn principal(&self) -> String {
        format!("policy:{}@{}", self.id, self.version)
    }

    /// How many rules it has.
    pub fn rules(&self) -> usize {
        self.rules
    }

    /// The `@message` of rule `rule` (1-based), if any.
    pub fn message(&self, rule: usize) -> Option<&str> {
        self.set.annotation(&rule_id(rule), "message")
    }

    /// Evaluates the policy over `facts`. Never fails: whatever goes wrong asks a person.
    pub fn evaluate(&self, facts: &CardFacts) -> Evaluation {
        let started = Instant::now();
        let (outcome, rule) = self.decide(facts);
        let (outcome, rule, route) = match outcome {
            Outcome::Ask {
                reason: AskReason::NoRule,
            } => match self.route(facts) {
                Ok((first, route)) if !route.is_empty() => {
                    let reason = AskReason::Routed;
                    (Outcome::Ask { reason }, Some(first), route)
                }
                Ok(_) => (outcome, rule, Vec::new()),
                Err(reason) => (Outcome::Ask { reason }, None, Vec::new()),
            },
            _ => (outcome, rule, Vec::new()),
        };
        let elapsed = started.elapsed();
        let (outcome, rule, route) = if elapsed > EVALUATION_BUDGET {
            let reason = AskReason::Timeout;
            (Outcome::Ask { reason }, None, Vec::new())
        } else {
            (outcome, rule, route)
        };
        Evaluation {
            outcome,
            rule,
            facts_digest: facts.digest(),
            elapsed,
            route,
        }
    }

    fn decide(&self, facts: &CardFacts) -> (Outcome, Option<usize>) {
        if facts.calls.is_empty() {
            let reason = AskReason::NoWrites;
            return (Outcome::Ask { reason }, None);
        }
        let mut approved_by = None;
        let mut all_approved = true;
        for call in &facts.calls {
            match self.ask(facts, call, "deny") {
                Err(reason) => return (Outcome::Ask { reason }, None),
                Ok(Some(rule)) => {
                    let message = self.message(rule).unwrap_or(DEFAULT_DENY_MESSAGE);
                    let message = message.to_owned();
                    return (Outcome::Deny { message }, Some(rule));
                }
                Ok(None) => {}
            }
            match self.ask(facts, call, "approve") {
                Err(reason) => return (Outcome::Ask { reason }, None),
                Ok(Some(rule)) => {
                    approved_by.get_or_insert(rule);
                }
                Ok(None) => all_approved = false,
            }
        }
        if all_approved {
            (Outcome::Approve, approved_by)
        } else {
            let reason = AskReason::NoRule;
            (Outcome::Ask { reason }, None)
        }
    }

    /// Whether `action` is permitted for `call`: the first permitting rule, or `None`.
    fn ask(
        &self,
        facts: &CardFacts,
        call: &CallFacts,
        action: &str,
    ) -> Result<Option<usize>, AskReason> {
        let rules = self.permitting(facts, call, action)?;
        match rules.first() {
            None => Ok(None),
            Some(_) if rules.contains(&0) => Err(AskReason::EvaluationError),
            Some(first) => Ok(Some(*first)),
        }
    }

    /// The rules that permit `action` for `call`, in order (empty: none). A permitting policy
    /// whose id is not a rule's is returned as rule 0.
    fn permitting(
        &self,
        facts: &CardFacts,
        call: &CallFacts,
        action: &str,
    ) -> Result<Vec<usize>, AskReason> {
        let request = request(facts, call, action).ok_or(AskReason::EvaluationError)?;
        let response = Authorizer::new().is_authorized(&request, &self.set, &Entities::empty());
        if response.diagnostics().errors().next().is_some() {
            return Err(AskReason::EvaluationError);
        }
        if response.decision() != Decision::Allow {
            return Ok(Vec::new());
        }
        let mut rules: Vec<usize> = response
            .diagnostics()
            .reason()
            .map(|id| rule_number(id).unwrap_or(0))
            .collect();
        rules.sort_unstable();
        Ok(rules)
    }

    /// Who the `ask` rules route the card to: the first routing rule, and the union of the
    /// routes of every `ask` rule that permits any call (empty: none routes it).
    fn route(&self, facts: &CardFacts) -> Result<(usize, Vec<Requirement>), AskReason> {
        let mut rules = Vec::new();
        for call in &facts.calls {
            rules.extend(self.permitting(facts, call, "ask")?);
        }
        rules.sort_unstable();
        rules.dedup();
        let routing: Vec<usize> = rules
            .into_iter()
            .filter(|r| self.routes.of_rule(*r).is_some())
            .collect();
        let first = routing.first().copied().unwrap_or(0);
        let route = merged(routing.iter().filter_map(|r| self.routes.of_rule(*r)));
        Ok((first, route))
    }
}

/// The request of `action` on `call`. Not checked against the schema at each evaluation: the
/// rules were validated against it at load, and the facts are made to its shape
/// ([`CardFacts::context`]; a unit test holds the two together).
fn request(facts: &CardFacts, call: &CallFacts, action: &str) -> Option<Request> {
    let principal = EntityUid::from_str(&format!("Agent::{}", quoted(&facts.agent))).ok()?;
    let resource = EntityUid::from_str(&format!("Tool::{}", quoted(&call.tool))).ok()?;
    let action = EntityUid::from_str(&format!("Action::{}", quoted(action))).ok()?;
    let context = Context::from_json_value(facts.context(call), None).ok()?;
    Request::new(principal, action, resource, context, None).ok()
}

/// Whether the context of `call` fits the schema's `Facts`: what [`request`] relies on.
#[cfg(test)]
pub(crate) fn fits_schema(facts: &CardFacts, call: &CallFacts) -> bool {
    let schema = schema();
    let Ok(action) = EntityUid::from_str("Action::\"approve\"") else {
        return false;
    };
    Context::from_json_value(facts.context(call), Some((&schema, &action))).is_ok()
}

/// A string as a Cedar string literal.
fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The id Cedar gives rule `rule` (1-based) of a file: `policy<rule-1>`.
fn rule_id(rule: usize) -> PolicyId {
    PolicyId::new(format!("policy{}", rule.saturating_sub(1)))
}

pub(crate) fn rule_number(id: &PolicyId) -> Option<usize> {
    let n: usize = id.to_string().strip_prefix("policy")?.parse().ok()?;
    Some(n + 1)
}

/// The line (1-based) of the first place `diagnostic` points at in `source`; 1 when it points
/// nowhere.
fn line_of(source: &str, diagnostic: &dyn Diagnostic) -> usize {
    let offset = diagnostic
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| label.offset())
        .or_else(|| {
            diagnostic
                .related()
                .and_then(|mut r| r.next())
                .and_then(|d| d.labels().and_then(|mut l| l.next()).map(|l| l.offset()))
        });
    match offset {
        Some(offset) => source[..offset.min(source.len())].matches('\n').count() + 1,
        None => 1,
    }
}

fn first_message(e: &cedar_policy::ParseErrors) -> String {
    e.iter()
        .next()
        .map(ToString::to_string)
        .unwrap_or_else(|| e.to_string())
}

/// The `// key: value` lines that open a policy file.
struct Header {
    id: String,
    version: u32,
    mode: Mode,
}

impl Header {
    fn parse(source: &str) -> Result<Header, LoadError> {
        let (mut id, mut version, mut mode) = (None, None, Some((0, Mode::Enforce)));
        for (n, line) in source.lines().enumerate() {
            let Some(rest) = line.trim().strip_prefix("//") else {
                if line.trim().is_empty() {
                    continue;
                }
                break;
            };
            let Some((key, value)) = rest.split_once(':') else {
                continue;
            };
            let (line, value) = (n + 1, value.trim());
            match key.trim() {
                "policy" => id = Some((line, value.to_owned())),
                "version" => version = Some((line, value.to_owned())),
                "mode" => {
                    let parsed = Mode::from_str(value);
                    let key = "mode";
                    mode = Some((
                        line,
                        parsed.map_err(|_| LoadError::BadHeader { line, key })?,
                    ));
                }
                _ => {}
            }
        }
        let (line, id) = id.ok_or(LoadError::MissingHeader {
            line: 1,
            key: "policy",
        })?;
        let well_formed = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !well_formed {
            return Err(LoadError::BadHeader {
                line,
                key: "policy",
            });
        }
        let (line, version) = version.ok_or(LoadError::MissingHeader {
            line: 1,
            key: "version",
        })?;
        let version =
            version
                .trim_start_matches('v')
                .parse()
                .map_err(|_| LoadError::BadHeader {
                    line,
                    key: "version",
                })?;
        let mode = mode.map(|(_, m)| m).unwrap_or(Mode::Enforce);
        Ok(Header { id, version, mode })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_load_error_has_the_code_it_always_had() {
        let errors = [
            (
                LoadError::MissingHeader {
                    line: 1,
                    key: "policy",
                },
                "policy_header",
            ),
            (
                LoadError::BadHeader {
                    line: 2,
                    key: "mode",
                },
                "policy_header",
            ),
            (
                LoadError::Syntax {
                    line: 3,
                    message: String::new(),
                },
                "policy_syntax",
            ),
            (
                LoadError::Invalid {
                    line: 4,
                    message: String::new(),
                },
                "policy_invalid",
            ),
            (LoadError::Empty, "policy_empty"),
        ];
        for (error, code) in &errors {
            assert_eq!(error.code(), *code, "{error:?}");
        }
        let codes: Vec<&str> = errors.iter().map(|(_, code)| *code).collect();
        assert_eq!(LoadError::VARIANTS, codes);
    }
}
