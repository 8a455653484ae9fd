//! The tool contract, the opt-in preview contract, the registry, and which tools an agent is
//! offered.
//!
//! A write is declared by the tool's [`Effect`], never by a separate approval flag: any write
//! effect makes every call suspend for a human, so there is no flag to forget.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use strum::VariantArray;

use crate::ids::{CallIndex, LeaseEpoch, RunId, SuspensionSeq};

/// The user a run acts as, or a person looking at a card. Tools check permissions against an
/// explicit principal; nothing reads an ambient user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub name: String,
    pub admin: bool,
    /// What the [`UserDirectory`](crate::UserDirectory) that found the user read about them,
    /// for the tools of the same system, which would otherwise read it again for every call of
    /// a segment. Neither compared nor serialized.
    #[serde(skip)]
    pub profile: Profile,
}

impl Principal {
    pub fn new(name: impl Into<String>, admin: bool) -> Self {
        Principal {
            name: name.into(),
            admin,
            profile: Profile::default(),
        }
    }

    /// The principal carrying `profile`, what its directory read about the user.
    #[must_use]
    pub fn with_profile<T: std::any::Any + Send + Sync>(mut self, profile: T) -> Self {
        self.profile = Profile(Some(Arc::new(profile)));
        self
    }

    /// The profile its directory attached, if it is a `T`.
    pub fn profile<T: std::any::Any>(&self) -> Option<&T> {
        self.profile.0.as_deref()?.downcast_ref()
    }
}

/// An opaque record of a user attached by a directory (see [`Principal::with_profile`]).
#[derive(Clone, Default)]
pub struct Profile(Option<Arc<dyn std::any::Any + Send + Sync>>);

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Profile(..)"
        } else {
            "Profile(None)"
        })
    }
}

/// Profiles do not take part in comparing principals: a principal is its name and flag.
impl PartialEq for Profile {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Profile {}

/// What a call does to the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[derive(strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum Effect {
    ReadOnly,
    IdempotentWrite,
    NonIdempotentWrite,
}

impl Effect {
    pub fn is_write(self) -> bool {
        !matches!(self, Effect::ReadOnly)
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What kind of data a tool reads or writes — and so which model providers may be sent it:
/// its results reach the model, and a model outside the installation must see only what it
/// may. Every tool group has one; a group nobody classified counts as
/// [`DataClass::SecretAdjacent`], so an oversight withholds a tool instead of leaking it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[derive(strum::IntoStaticStr, strum::EnumString, strum::Display, VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum DataClass {
    /// Published anyway: anybody may read it.
    Public,
    /// What editors write for the site: pages, content elements, the texts of files.
    EditorContent,
    /// About people: names, addresses, accounts.
    PersonalData,
    /// Structure, configuration, internal paths and whatever sits next to credentials.
    SecretAdjacent,
}

impl DataClass {
    /// What a group or a name that is not a class counts as.
    pub const FAIL_CLOSED: DataClass = DataClass::SecretAdjacent;

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The data classes a model provider may be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataClasses(BTreeSet<DataClass>);

impl DataClasses {
    /// Every class: a provider that runs inside the installation.
    pub fn all() -> Self {
        DataClasses(DataClass::VARIANTS.iter().copied().collect())
    }

    /// What a provider outside the installation may be sent unless its settings say more:
    /// what is published, and what editors write for the site.
    pub fn external_default() -> Self {
        DataClasses::of([DataClass::Public, DataClass::EditorContent])
    }

    pub fn of(classes: impl IntoIterator<Item = DataClass>) -> Self {
        DataClasses(classes.into_iter().collect())
    }

    pub fn allows(&self, class: DataClass) -> bool {
        self.0.contains(&class)
    }

    pub fn iter(&self) -> impl Iterator<Item = DataClass> + '_ {
        self.0.iter().copied()
    }
}

impl Default for DataClasses {
    fn default() -> Self {
        Self::all()
    }
}

impl fmt::Display for DataClasses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(DataClass::as_str).collect();
        f.write_str(&names.join(", "))
    }
}

/// What a tool declares about itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
    pub group: String,
    /// The class of the data of its group: which model providers it is offered to.
    pub data_class: DataClass,
    pub effect: Effect,
    pub enabled_by_default: bool,
    pub requires_admin: bool,
}

impl ToolSpec {
    /// Whether `args` fit this tool's argument schema, as a JSON Schema validator reads it
    /// (draft 2020-12 unless the schema names another). A schema that does not compile fits
    /// nothing.
    pub fn check_arguments(&self, args: &Value) -> Result<(), ArgumentsError> {
        if !args.is_object() {
            return Err(ArgumentsError::NotAnObject);
        }
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let location = "urn:countersign:tool-arguments";
        compiler
            .add_resource(location, self.parameters.clone())
            .map_err(|e| ArgumentsError::Schema(e.to_string()))?;
        let schema = compiler
            .compile(location, &mut schemas)
            .map_err(|e| ArgumentsError::Schema(e.to_string()))?;
        schemas
            .validate(args, schema)
            .map_err(|e| ArgumentsError::Mismatch(format!("{e:#}")))
    }
}

/// Why arguments do not fit a tool. The details are for the log: they quote the arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentsError {
    #[error("the arguments are not a JSON object")]
    NotAnObject,
    #[error("the tool's argument schema does not compile: {0}")]
    Schema(String),
    #[error("the arguments do not fit the tool's schema: {0}")]
    Mismatch(String),
}

/// The lease a write must still hold at the resource. Built by the segment runner from the
/// claim it won; a tool writing to the run's own database verifies it inside its transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceToken {
    pub run_id: RunId,
    pub lease_owner: String,
    pub lease_epoch: LeaseEpoch,
    pub suspension_seq: SuspensionSeq,
    pub call_index: CallIndex,
}

impl FenceToken {
    /// The idempotency key of this call for an external side effect: `run:suspension:call`.
    pub fn idempotency_key(&self) -> String {
        format!(
            "{}:{}:{}",
            self.run_id, self.suspension_seq, self.call_index
        )
    }
}

/// What a tool is given besides its arguments.
#[derive(Debug, Clone)]
pub struct ExecContext {
    /// The run's acting user. Never the approver.
    pub acting_user: Principal,
    /// Present for every write executed by a segment; `None` for read-only calls.
    pub fence: Option<FenceToken>,
    /// For a write of an approved turn sent outside the store: the preview lines the approver
    /// was shown for this call, when they can be compared line for line (no bound cut them),
    /// so that a resource able to compare and write in one step refuses a call whose preview
    /// moved since. `None` otherwise.
    pub shown_preview: Option<Vec<String>>,
    /// For a write sent outside the store: the calls of the same turn on the same resource
    /// that come before it and have not landed when it is sent (held by a two-phase resource,
    /// most often). Its preview — the one shown, and the one a resource compares at the write —
    /// is the call's preview after them. Empty for a call that comes first.
    pub before: Vec<EarlierCall>,
}

impl ExecContext {
    /// The context of a call as `acting_user` with no fence, nothing shown and nothing before
    /// it: a read.
    pub fn new(acting_user: Principal) -> Self {
        ExecContext {
            acting_user,
            fence: None,
            shown_preview: None,
            before: Vec::new(),
        }
    }
}

/// A call of the same turn that comes before the one a preview or a write is about, on the same
/// resource: the state the later call is previewed and written against is the state this one
/// leaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EarlierCall {
    pub tool: String,
    pub arguments: Value,
}

/// Where a tool's calls act, for the turn's sequence (see [`Tool::sequence`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// The resource: calls of one turn on the same resource are previewed, compared and written
    /// in call order, each after the ones before it. Tools of one server share one.
    pub resource: String,
    /// Whether [`ToolPreview::preview_after`] takes the calls before: otherwise a call that
    /// comes after others on its resource is previewed as if it were alone, and its card says so.
    pub composes: bool,
}

/// The result of a call, as the model will read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: false,
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        ToolOutput {
            content: content.into(),
            is_error: true,
        }
    }
}

/// Whether a failure of the infrastructure under a call would happen again.
///
/// Decided once for each kind of failure — by the store for the database, by the remote client
/// for a tool server — and acted on once, by the loop: a transient fault interrupts the segment
/// and it is retried; a persistent one is a failed preview line at suspend, refuses the turn
/// (re-suspends it) at resume, and fails the run when it stops a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The same request may well succeed when tried again: a lost connection, a serialization
    /// failure or deadlock, an exhausted pool, a restarting server.
    Transient,
    /// It would fail the same way again: a permission, a missing column, a constraint.
    Persistent,
}

/// A failure of a tool, as opposed to a refusal (which is a [`ToolOutput`] with `is_error`).
///
/// Only [`ToolError::code`] may reach a preview line, an event or the database; the detail
/// goes to the log, because it can carry credentials or content.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum ToolError {
    /// The lease was lost: the write did not happen and the segment must stop.
    #[error("lease lost before the write")]
    FenceLost,
    /// The tool's own failure, with a stable code: it becomes the call's error result.
    #[error("{code}: {detail}")]
    Failed { code: &'static str, detail: String },
    /// A transient failure of the infrastructure under the tool ([`Fault::Transient`]): nothing
    /// is known about the call. Never a tool result, a preview line or a refusal — the segment
    /// rolls back and is interrupted, to be retried.
    #[error("{code} (infrastructure): {detail}")]
    Unavailable { code: &'static str, detail: String },
    /// A persistent failure of the infrastructure under the tool ([`Fault::Persistent`]):
    /// retrying cannot help. A failed line in a preview; in a write, the run fails with the
    /// code.
    #[error("{code} (persistent): {detail}")]
    Broken { code: &'static str, detail: String },
    /// A write was sent and no answer came back, and asking the resource what became of its
    /// idempotency key did not tell: it may have landed. Never a result: the model must not be
    /// told "failed" for a write that may have happened.
    #[error("{code} (outcome unknown): {detail}")]
    OutcomeUnknown { code: &'static str, detail: String },
    /// The resource compared the preview the approver was shown with its own at the write,
    /// found that it moved, and wrote nothing.
    #[error("the preview moved at the resource; nothing was written")]
    #[strum(serialize = "preview_moved")]
    Moved,
}

impl ToolError {
    pub fn failed(code: &'static str, detail: impl fmt::Display) -> Self {
        ToolError::Failed {
            code,
            detail: detail.to_string(),
        }
    }

    pub fn unavailable(code: &'static str, detail: impl fmt::Display) -> Self {
        ToolError::Unavailable {
            code,
            detail: detail.to_string(),
        }
    }

    /// An infrastructure failure of the given [`Fault`].
    pub fn infrastructure(fault: Fault, code: &'static str, detail: impl fmt::Display) -> Self {
        let detail = detail.to_string();
        match fault {
            Fault::Transient => ToolError::Unavailable { code, detail },
            Fault::Persistent => ToolError::Broken { code, detail },
        }
    }

    pub fn outcome_unknown(code: &'static str, detail: impl fmt::Display) -> Self {
        ToolError::OutcomeUnknown {
            code,
            detail: detail.to_string(),
        }
    }

    /// The code a failure carries, or else its own.
    pub fn code(&self) -> &'static str {
        match self {
            ToolError::Failed { code, .. }
            | ToolError::Unavailable { code, .. }
            | ToolError::Broken { code, .. }
            | ToolError::OutcomeUnknown { code, .. } => code,
            other => other.into(),
        }
    }

    /// Whether the failure says nothing about the call itself and the segment must stop, to be
    /// retried: a transient fault or a lost lease.
    pub fn interrupts(&self) -> bool {
        matches!(self, ToolError::Unavailable { .. } | ToolError::FenceLost)
    }
}

/// A tool the model may call.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug {
    fn spec(&self) -> &ToolSpec;

    /// Runs the call as `ctx.acting_user`. A refusal is an `Ok` output with `is_error`.
    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError>;

    /// The preview contract, for tools that offer one (opt-in).
    fn previewer(&self) -> Option<&dyn ToolPreview> {
        None
    }

    /// For a writer that acts outside the run store: what else its resource can be asked about
    /// a write besides executing it (see [`ExternalWrite`]). `None`: it can only execute.
    fn external(&self) -> Option<&dyn ExternalWrite> {
        None
    }

    /// The resource this tool's calls act on, when calls of other tools of a turn may share its
    /// state (the tools of one server). `None`: no other call of a turn can change what its
    /// calls read. The writers of the run store's own database need none: a turn previews and
    /// writes them in sequence in its transaction ([`crate::LocalWriter`]).
    fn sequence(&self) -> Option<Sequence> {
        None
    }

    /// The facts that make the tool what it is: its name, effect and argument schema, and its
    /// preview. A tool from outside adds where it comes from and which tool previews it.
    fn identity_facts(&self) -> Value {
        let spec = self.spec();
        serde_json::json!({
            "name": spec.name,
            "effect": spec.effect,
            "parameters": spec.parameters,
            "preview": self.previewer().is_some(),
        })
    }

    /// A stable digest of [`identity_facts`](Self::identity_facts) ([`identity_of`]): it
    /// changes exactly when one of the facts does.
    fn identity(&self) -> String {
        identity_of(&self.identity_facts())
    }

    /// Whether the tool may be offered and run now. `false` while its server lists it otherwise
    /// than an operator accepted it: it is offered to no run until the change is accepted.
    fn available(&self) -> bool {
        true
    }
}

/// The identity of a tool with `facts`: the SHA-256 (64 lowercase hex) of their canonical JSON
/// ([`crate::digest::canonical_json`]).
pub fn identity_of(facts: &Value) -> String {
    use sha2::Digest as _;
    let canonical = crate::digest::canonical_json(facts);
    hex::encode(sha2::Sha256::digest(canonical.as_bytes()))
}

/// What became of a write a resource was sent under its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallStatus {
    /// The resource carried the call out (or refused it): its recorded answer.
    Answered(ToolOutput),
    /// The resource compared the shown preview at the write, found it moved, and wrote nothing.
    Moved,
    /// The resource holds the change under the key, prepared and not committed.
    Prepared,
    /// The resource has never seen the key: nothing was written.
    Unseen,
}

/// The answer to a `prepare` (see [`ExternalWrite::prepare`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// The resource compared the shown preview under its lock, found it unchanged and holds the
    /// change under the key until it is committed or aborted.
    Held,
    /// The shown preview moved at the resource; nothing is held.
    Moved,
    /// The resource answered finally without holding anything: a refusal, or the recorded
    /// answer of a key it already committed.
    Answered(ToolOutput),
}

/// The questions a resource outside the store may answer about a write besides executing it.
///
/// Every method carries the call's [`FenceToken`] in `ctx` (its idempotency key and epoch).
/// A method the resource does not support answers [`ToolError::Failed`] with the code
/// `unsupported`.
#[async_trait]
pub trait ExternalWrite: Send + Sync {
    /// Whether the resource takes a write in two phases: [`prepare`](Self::prepare), then
    /// [`commit`](Self::commit) or [`abort`](Self::abort). A turn of such writes lands all or
    /// nothing.
    fn two_phase(&self) -> bool;

    /// Compares `ctx.shown_preview` with the resource's own preview under its lock and, when
    /// they read the same, holds the change under the key.
    async fn prepare(&self, ctx: &ExecContext, args: &Value) -> Result<Prepared, ToolError>;

    /// Makes a held change visible; the answer is the call's result.
    async fn commit(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError>;

    /// Drops a held change; a key that holds nothing is aborted already.
    async fn abort(&self, ctx: &ExecContext, args: &Value) -> Result<(), ToolError>;

    /// What became of the call under `ctx`'s key.
    async fn status(&self, ctx: &ExecContext) -> Result<CallStatus, ToolError>;
}

/// What a pending call would do, for the approver.
///
/// Contract on implementors, which the loop cannot enforce:
/// - `preview` is deterministic: no clock, randomness or unstable ordering in the lines, or
///   every approval of the tool goes stale. Check it with [`crate::preview::assert_deterministic`].
/// - It reads only what the acting user may read, and on a refusal returns the tool's own
///   neutral refusal line rather than an error.
/// - It shows only the fields the call would write, each value excerpted to 120 characters.
#[async_trait]
pub trait ToolPreview: Send + Sync {
    async fn preview(
        &self,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<String>, ToolError>;

    /// The preview's lines with, for some, a structured form a card may render in their place
    /// ([`crate::LineForm`]: a before/after pair, a list with the new item marked). The texts
    /// must be [`preview`](Self::preview)'s lines: they are what an approval binds to. The
    /// default gives the lines without forms.
    async fn preview_with_forms(
        &self,
        acting_user: &Principal,
        args: &Value,
    ) -> Result<Vec<crate::PreviewLine>, ToolError> {
        let lines = self.preview(acting_user, args).await?;
        Ok(lines.into_iter().map(crate::PreviewLine::from).collect())
    }

    /// Whether `viewer` may be shown this call's preview: the same record check as the
    /// preview, applied to the person looking at the card.
    async fn may_viewer_read_preview(&self, args: &Value, viewer: &Principal) -> bool;

    /// The preview of the call as it would run after `before`, the calls of the same turn on
    /// the same resource that come first, in order: the state it reads is the state they leave.
    /// Called only when [`Tool::sequence`] says it composes and `before` is not empty. The same
    /// contract as [`preview`](Self::preview).
    async fn preview_after(
        &self,
        acting_user: &Principal,
        args: &Value,
        before: &[EarlierCall],
    ) -> Result<Vec<crate::PreviewLine>, ToolError> {
        let _ = before;
        self.preview_with_forms(acting_user, args).await
    }
}

/// All tools known to a process, by name.
#[derive(Debug, Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool; a later tool with the same name replaces the earlier one.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> &mut Self {
        self.tools.insert(tool.spec().name.clone(), tool);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn Tool>> {
        self.tools.values()
    }

    /// The effect a gate must assume for `name`: an unknown tool counts as a non-idempotent
    /// write.
    pub fn effect_of(&self, name: &str) -> Effect {
        self.get(name)
            .map_or(Effect::NonIdempotentWrite, |t| t.spec().effect)
    }
}

/// The tool-related part of an agent configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolPolicy {
    /// Tool names the agent may use; empty means no name restriction.
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// Tool groups the agent may use; empty means no group restriction.
    #[serde(default)]
    pub allowed_groups: Vec<String>,
    /// Tools switched on for this agent although they are disabled by default (the writers).
    #[serde(default)]
    pub enabled_tools: Vec<String>,
}

/// Why a tool is not offered to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Withheld {
    /// Not on the agent's allow-list of tool names.
    NotAllowed,
    /// Its group is not among the agent's groups.
    GroupNotAllowed,
    /// Disabled by default (a writer), and the agent does not enable it.
    NotEnabled,
    /// Offered to administrators only, and the acting user is not one.
    AdminOnly,
    /// Its data class may not be sent to the agent's model provider.
    DataClass(DataClass),
}

impl Withheld {
    pub fn code(self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Withheld::NotAllowed => f.write_str("not on the agent's allowed tools"),
            Withheld::GroupNotAllowed => f.write_str("its group is not among the agent's groups"),
            Withheld::NotEnabled => {
                f.write_str("disabled by default, and the agent does not enable it")
            }
            Withheld::AdminOnly => f.write_str("offered to administrators only"),
            Withheld::DataClass(class) => write!(
                f,
                "its data ({class}) may not be sent to the agent's model provider"
            ),
        }
    }
}

impl ToolPolicy {
    /// Whether `spec` passes the allow-list, group, enable and admin rules for `user`.
    pub fn permits(&self, spec: &ToolSpec, user: &Principal) -> bool {
        self.withheld(spec, user).is_none()
    }

    /// The first rule `spec` fails for `user`, if any: allow-list, group, enable, admin.
    pub fn withheld(&self, spec: &ToolSpec, user: &Principal) -> Option<Withheld> {
        if !self.allowed_tools.is_empty() && !self.allowed_tools.contains(&spec.name) {
            return Some(Withheld::NotAllowed);
        }
        if !self.allowed_groups.is_empty() && !self.allowed_groups.contains(&spec.group) {
            return Some(Withheld::GroupNotAllowed);
        }
        if !spec.enabled_by_default && !self.enabled_tools.contains(&spec.name) {
            return Some(Withheld::NotEnabled);
        }
        if spec.requires_admin && !user.admin {
            return Some(Withheld::AdminOnly);
        }
        None
    }

    /// [`withheld`](Self::withheld), and then whether the tool's data may be sent to a model
    /// provider that may receive `classes`.
    pub fn withheld_from(
        &self,
        spec: &ToolSpec,
        user: &Principal,
        classes: &DataClasses,
    ) -> Option<Withheld> {
        self.withheld(spec, user).or_else(|| {
            (!classes.allows(spec.data_class)).then_some(Withheld::DataClass(spec.data_class))
        })
    }

    /// The tools offered to a run of this agent acting as `user` on a model provider that may
    /// receive `classes`, in name order; a tool that is not [`available`](Tool::available) is
    /// offered to nobody.
    pub fn offered(
        &self,
        registry: &ToolRegistry,
        user: &Principal,
        classes: &DataClasses,
    ) -> OfferedTools {
        OfferedTools {
            tools: registry
                .iter()
                .filter(|t| t.available() && self.withheld_from(t.spec(), user, classes).is_none())
                .cloned()
                .collect(),
        }
    }
}

/// The tools offered to one segment, resolved live from the registry and the configuration.
#[derive(Debug, Clone)]
pub struct OfferedTools {
    tools: Vec<Arc<dyn Tool>>,
}

impl OfferedTools {
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.spec().name == name)
    }

    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.spec().name.clone()).collect()
    }

    pub fn specs(&self) -> Vec<&ToolSpec> {
        self.tools.iter().map(|t| t.spec()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, group: &str, effect: Effect, default_on: bool, admin: bool) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
            group: group.into(),
            data_class: DataClass::EditorContent,
            effect,
            enabled_by_default: default_on,
            requires_admin: admin,
        }
    }

    #[test]
    fn a_writer_disabled_by_default_is_offered_only_when_enabled_for_the_agent() {
        let w = spec(
            "update_page_metadata",
            "editing",
            Effect::IdempotentWrite,
            false,
            false,
        );
        let editor = Principal::new("editor", false);
        assert!(!ToolPolicy::default().permits(&w, &editor));
        let policy = ToolPolicy {
            enabled_tools: vec![w.name.clone()],
            ..Default::default()
        };
        assert!(policy.permits(&w, &editor));
    }

    #[test]
    fn enabling_a_writer_does_not_pass_a_group_restriction_that_excludes_it() {
        let w = spec(
            "update_page_metadata",
            "editing",
            Effect::IdempotentWrite,
            false,
            false,
        );
        let policy = ToolPolicy {
            allowed_groups: vec!["content".into()],
            enabled_tools: vec![w.name.clone()],
            ..Default::default()
        };
        assert!(!policy.permits(&w, &Principal::new("editor", false)));
    }

    #[test]
    fn an_admin_only_tool_is_offered_to_admins_only() {
        let r = spec(
            "read_fal_asset_meta",
            "structure",
            Effect::ReadOnly,
            true,
            true,
        );
        let policy = ToolPolicy::default();
        assert!(!policy.permits(&r, &Principal::new("editor", false)));
        assert!(policy.permits(&r, &Principal::new("admin", true)));
    }

    #[test]
    fn a_tool_outside_the_allow_list_is_not_offered() {
        let r = spec("search_pages", "content", Effect::ReadOnly, true, false);
        let policy = ToolPolicy {
            allowed_tools: vec!["other".into()],
            ..Default::default()
        };
        assert!(!policy.permits(&r, &Principal::new("editor", false)));
    }

    #[test]
    fn a_tool_whose_data_the_provider_may_not_receive_is_withheld_and_says_why() {
        let mut r = spec(
            "read_fal_asset_meta",
            "structure",
            Effect::ReadOnly,
            true,
            false,
        );
        r.data_class = DataClass::SecretAdjacent;
        let policy = ToolPolicy::default();
        let editor = Principal::new("editor", false);
        let external = DataClasses::external_default();
        assert_eq!(
            policy.withheld_from(&r, &editor, &external),
            Some(Withheld::DataClass(DataClass::SecretAdjacent))
        );
        assert_eq!(policy.withheld_from(&r, &editor, &DataClasses::all()), None);
        let mut registry = ToolRegistry::new();
        registry.register(Arc::new(Named(r)));
        assert!(policy
            .offered(&registry, &editor, &external)
            .names()
            .is_empty());
        assert_eq!(
            policy
                .offered(&registry, &editor, &DataClasses::all())
                .names(),
            vec!["read_fal_asset_meta"]
        );
    }

    #[test]
    fn the_rules_are_asked_in_order_and_the_first_failed_is_the_reason() {
        let w = spec(
            "update_page_metadata",
            "editing",
            Effect::IdempotentWrite,
            false,
            true,
        );
        let policy = ToolPolicy {
            allowed_groups: vec!["content".into()],
            ..Default::default()
        };
        let editor = Principal::new("editor", false);
        assert_eq!(
            policy.withheld(&w, &editor),
            Some(Withheld::GroupNotAllowed)
        );
        assert_eq!(
            ToolPolicy::default().withheld(&w, &editor),
            Some(Withheld::NotEnabled)
        );
        let enabled = ToolPolicy {
            enabled_tools: vec![w.name.clone()],
            ..Default::default()
        };
        assert_eq!(enabled.withheld(&w, &editor), Some(Withheld::AdminOnly));
    }

    #[test]
    fn a_data_class_is_named_by_its_code_and_anything_else_is_no_class() {
        for &class in DataClass::VARIANTS {
            assert_eq!(class.as_str().parse(), Ok(class));
        }
        assert!("EDITOR_CONTENT".parse::<DataClass>().is_err());
        assert_eq!(DataClass::FAIL_CLOSED, DataClass::SecretAdjacent);
    }

    /// A tool that is only its spec.
    #[derive(Debug)]
    struct Named(ToolSpec);

    #[async_trait]
    impl Tool for Named {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        async fn execute(
            &self,
            _ctx: &ExecContext,
            _args: &Value,
        ) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::ok(""))
        }
    }

    /// A tool its server lists otherwise than it was accepted.
    #[derive(Debug)]
    struct Changed(ToolSpec);

    #[async_trait]
    impl Tool for Changed {
        fn spec(&self) -> &ToolSpec {
            &self.0
        }

        async fn execute(
            &self,
            _ctx: &ExecContext,
            _args: &Value,
        ) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::ok(""))
        }

        fn available(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_tool_that_is_not_available_is_offered_to_nobody() {
        let read = spec("lookup", "content", Effect::ReadOnly, true, false);
        let mut registry = ToolRegistry::new();
        registry.register(Arc::new(Changed(read)));
        let offered = ToolPolicy::default().offered(
            &registry,
            &Principal::new("admin", true),
            &DataClasses::all(),
        );
        assert!(offered.names().is_empty());
    }

    #[test]
    fn arguments_are_checked_against_the_tools_schema() {
        let mut spec = ToolSpec {
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1}, "title": {"type": "string", "maxLength": 5}},
                "required": ["id"],
                "additionalProperties": false
            }),
            ..spec("edit", "content", Effect::NonIdempotentWrite, false, false)
        };
        assert_eq!(
            spec.check_arguments(&serde_json::json!({"id": 3, "title": "abc"})),
            Ok(())
        );
        for bad in [
            serde_json::json!({"title": "abc"}),
            serde_json::json!({"id": 0}),
            serde_json::json!({"id": "3"}),
            serde_json::json!({"id": 3, "title": "too long"}),
            serde_json::json!({"id": 3, "other": true}),
        ] {
            assert!(
                matches!(spec.check_arguments(&bad), Err(ArgumentsError::Mismatch(_))),
                "{bad}"
            );
        }
        assert_eq!(
            spec.check_arguments(&serde_json::json!([3])),
            Err(ArgumentsError::NotAnObject)
        );
        spec.parameters = serde_json::json!({"type": "no-such-type"});
        assert!(matches!(
            spec.check_arguments(&serde_json::json!({})),
            Err(ArgumentsError::Schema(_))
        ));
    }

    #[test]
    fn a_tools_identity_is_stable_and_changes_with_its_effect_schema_or_preview() {
        let read = spec("lookup", "content", Effect::ReadOnly, true, false);
        let identity = Named(read.clone()).identity();
        assert_eq!(identity.len(), 64);
        assert!(identity
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(Named(read.clone()).identity(), identity, "stable");
        let mut grouped = read.clone();
        grouped.group = "elsewhere".into();
        grouped.description = "another description".into();
        assert_eq!(
            Named(grouped).identity(),
            identity,
            "the operator's settings are no part of it"
        );
        let mut write = read.clone();
        write.effect = Effect::NonIdempotentWrite;
        assert_ne!(Named(write).identity(), identity);
        let mut schema = read;
        schema.parameters = serde_json::json!({"type": "object", "required": ["id"]});
        assert_ne!(Named(schema).identity(), identity);
    }

    #[test]
    fn an_unknown_tool_counts_as_a_non_idempotent_write() {
        assert_eq!(
            ToolRegistry::new().effect_of("nope"),
            Effect::NonIdempotentWrite
        );
    }

    #[test]
    fn every_tool_error_has_the_code_it_always_had() {
        let errors = [
            (ToolError::FenceLost, "fence_lost"),
            (ToolError::Moved, "preview_moved"),
            (ToolError::failed("row_gone", "d"), "row_gone"),
            (
                ToolError::unavailable("database_unavailable", "d"),
                "database_unavailable",
            ),
            (
                ToolError::infrastructure(Fault::Persistent, "database_refused", "d"),
                "database_refused",
            ),
            (
                ToolError::outcome_unknown("remote_unreachable", "d"),
                "remote_unreachable",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }

    #[test]
    fn every_withheld_reason_has_the_code_it_always_had() {
        let reasons = [
            (Withheld::NotAllowed, "not_allowed"),
            (Withheld::GroupNotAllowed, "group_not_allowed"),
            (Withheld::NotEnabled, "not_enabled"),
            (Withheld::AdminOnly, "admin_only"),
            (Withheld::DataClass(DataClass::PersonalData), "data_class"),
        ];
        for (reason, code) in reasons {
            assert_eq!(reason.code(), code, "{reason:?}");
        }
    }
}
