//! The facts a policy sees about a card, made once from the suspended turn and its previews.
//!
//! Cedar has no quantifier over a set, so a card is not one request: each write call of the
//! turn is one, and the card-level facts (agent, acting user, request kind, counters) travel in
//! every call's context. The preview's structured forms are reduced here to the numbers a rule
//! can compare (which fields change, by how many characters, how many items a list gains,
//! whether the item is appended last, whether anything is removed), so a rule never parses the
//! lines itself.

use countersign_core::{CallPreview, LineForm, PendingCall, SuspendedRunState, ToolSpec};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What a policy sees about one card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardFacts {
    pub agent: String,
    pub acting_user: String,
    pub request_kind: String,
    pub writes_in_turn: i64,
    pub writes_by_agent_last_hour: i64,
    pub tokens_used: i64,
    /// The write calls of the turn still to run, in call order.
    pub calls: Vec<CallFacts>,
}

/// What a policy sees about one write call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallFacts {
    pub index: i64,
    pub tool: String,
    pub effect: String,
    pub group: String,
    pub data_class: String,
    pub args: Vec<Arg>,
    pub arg_names: Vec<String>,
    pub subject_ids: Vec<String>,
    pub preview: PreviewFacts,
}

/// One argument: its name and its value as text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Arg {
    pub name: String,
    pub text: String,
}

/// A call's preview, and what its forms say.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PreviewFacts {
    pub shown: bool,
    pub failed: bool,
    pub lines: Vec<String>,
    pub text: String,
    pub line_count: i64,
    pub changed_fields: Vec<String>,
    pub changes: i64,
    pub max_before_chars: i64,
    pub max_after_chars: i64,
    pub max_delta_chars: i64,
    pub list_items_gained: i64,
    pub appended_last: bool,
    pub removes: bool,
}

/// The run-level facts of a card, beside its turn.
#[derive(Debug, Clone, Copy)]
pub struct RunFacts<'a> {
    pub agent: &'a str,
    pub acting_user: &'a str,
    pub request_kind: &'a str,
    pub writes_by_agent_last_hour: i64,
}

/// Argument names that name a record: a subject of the call.
const SUBJECT_NAMES: [&str; 5] = ["uid", "pid", "page", "element", "file"];

impl CardFacts {
    /// The facts of `state`'s card, with each tool as `spec` describes it (a tool it does not
    /// know is a non-idempotent write of the class `secret_adjacent`, in no group).
    pub fn of<'s>(
        run: RunFacts<'_>,
        state: &SuspendedRunState,
        spec: impl Fn(&str) -> Option<&'s ToolSpec>,
    ) -> CardFacts {
        let landed: Vec<usize> = state.landed_calls.iter().map(|l| l.index.get()).collect();
        let excluded: Vec<usize> = state.excluded_calls.iter().map(|i| i.get()).collect();
        let calls: Vec<CallFacts> = state
            .pending_calls
            .iter()
            .enumerate()
            .filter(|(i, _)| !landed.contains(i) && !excluded.contains(i))
            .filter_map(|(i, call)| {
                let preview = state.call_previews.iter().find(|p| p.index.get() == i);
                CallFacts::of(i, call, spec(&call.tool), preview)
            })
            .collect();
        let tokens = state.tokens.prompt.saturating_add(state.tokens.completion);
        CardFacts {
            agent: run.agent.to_owned(),
            acting_user: run.acting_user.to_owned(),
            request_kind: run.request_kind.to_owned(),
            writes_in_turn: calls.len() as i64,
            writes_by_agent_last_hour: run.writes_by_agent_last_hour,
            tokens_used: i64::try_from(tokens).unwrap_or(i64::MAX),
            calls,
        }
    }

    /// SHA-256 (lowercase hex) of the facts' JSON: recorded with a decision, so what the
    /// policy saw can be shown to have been these facts.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(json))
    }

    /// The context of `call`'s request, as the schema's `Facts` type.
    pub(crate) fn context(&self, call: &CallFacts) -> Value {
        serde_json::json!({
            "agent": self.agent,
            "acting_user": self.acting_user,
            "request_kind": self.request_kind,
            "writes_in_turn": self.writes_in_turn,
            "writes_by_agent_last_hour": self.writes_by_agent_last_hour,
            "tokens_used": self.tokens_used,
            "call": call,
        })
    }
}

impl CallFacts {
    /// The facts of call `index`; `None` for a read (it needs no decision).
    pub fn of(
        index: usize,
        call: &PendingCall,
        spec: Option<&ToolSpec>,
        preview: Option<&CallPreview>,
    ) -> Option<CallFacts> {
        let (effect, group, data_class) = match spec {
            Some(spec) if !spec.effect.is_write() => return None,
            Some(spec) => (
                <&str>::from(spec.effect).to_owned(),
                spec.group.clone(),
                spec.data_class.as_str().to_owned(),
            ),
            None => (
                "non_idempotent_write".to_owned(),
                String::new(),
                "secret_adjacent".to_owned(),
            ),
        };
        let args = arguments(&call.arguments);
        Some(CallFacts {
            index: index as i64,
            tool: call.tool.clone(),
            effect,
            group,
            data_class,
            arg_names: args.iter().map(|a| a.name.clone()).collect(),
            subject_ids: subject_ids(&args),
            args,
            preview: preview.map(PreviewFacts::of).unwrap_or_default(),
        })
    }
}

fn arguments(value: &Value) -> Vec<Arg> {
    let Some(object) = value.as_object() else {
        return Vec::new();
    };
    object
        .iter()
        .map(|(name, value)| Arg {
            name: name.clone(),
            text: match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            },
        })
        .collect()
}

fn subject_ids(args: &[Arg]) -> Vec<String> {
    args.iter()
        .filter(|a| {
            SUBJECT_NAMES.contains(&a.name.as_str())
                || a.name.ends_with("_uid")
                || a.name.ends_with("_id")
        })
        .map(|a| format!("{}:{}", a.name, a.text))
        .collect()
}

impl PreviewFacts {
    /// What `preview` shows: its lines, and the numbers its forms give.
    pub fn of(preview: &CallPreview) -> PreviewFacts {
        let lines = preview.lines.clone();
        let mut facts = PreviewFacts {
            shown: !preview.failed && !lines.is_empty(),
            failed: preview.failed,
            text: lines.join("\n"),
            line_count: lines.len() as i64,
            appended_last: false,
            removes: lines.iter().any(|l| says_removed(l)),
            ..PreviewFacts::default()
        };
        let mut lists = 0;
        let mut appended = 0;
        for (i, line) in lines.iter().enumerate() {
            match preview.form(i) {
                Some(LineForm::Change { before, after }) => facts.change(line, before, after),
                Some(LineForm::List { items, added }) => {
                    lists += 1;
                    facts.list_items_gained += 1;
                    if *added + 1 == items.len() {
                        appended += 1;
                    }
                }
                None => {}
            }
        }
        facts.appended_last = lists > 0 && appended == lists;
        facts.lines = lines;
        facts
    }

    fn change(&mut self, line: &str, before: &str, after: &str) {
        let (b, a) = (chars(before), chars(after));
        self.changes += 1;
        self.max_before_chars = self.max_before_chars.max(b);
        self.max_after_chars = self.max_after_chars.max(a);
        self.max_delta_chars = self.max_delta_chars.max((a - b).abs());
        if b > 0 && a == 0 {
            self.removes = true;
        }
        if let Some(field) = field_of(line) {
            if !self.changed_fields.contains(&field) {
                self.changed_fields.push(field);
            }
        }
    }
}

fn chars(s: &str) -> i64 {
    s.chars().count() as i64
}

/// The field a change line names: `description: "old" → "new"` or `field image: …`.
fn field_of(line: &str) -> Option<String> {
    let (head, _) = line.split_once(':')?;
    let head = head.strip_prefix("field ").unwrap_or(head).trim();
    (!head.is_empty() && !head.contains(' ')).then(|| head.to_owned())
}

/// Whether a line says that something is taken away.
fn says_removed(line: &str) -> bool {
    let lower = line.to_lowercase();
    ["remove", "delete", "detach", "unlink"]
        .iter()
        .any(|w| lower.contains(w))
}
