//! In-memory tools, model and segment hooks for driving the loop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use countersign_core::{AgentConfig, HookError, Segment, SegmentHooks};
use countersign_core::{
    CallIndex, Effect, ExecContext, FenceToken, JournalEntry, LeaseEpoch, LocalWriter, Message,
    Model, ModelError, ModelRequest, ModelResponse, PendingCall, Principal, Role, RunId,
    SuspensionSeq, TokenUsage, Tool, ToolCall, ToolError, ToolOutput, ToolPolicy, ToolPreview,
    ToolRegistry, ToolSpec, TurnRecord,
};
use serde_json::{json, Value};

/// A shared in-memory record store: `key → list of items`, which the writers append to.
#[derive(Debug, Default)]
pub struct World {
    pub lists: Mutex<BTreeMap<String, Vec<String>>>,
    /// Every executed call, in order: (tool, arguments).
    pub executed: Mutex<Vec<(String, Value)>>,
    /// Keys the viewer gate lets no one but admins read.
    pub secret_keys: Mutex<Vec<String>>,
    /// The principal of every preview and every write, in order.
    pub principals: Mutex<Vec<String>>,
}

impl World {
    pub fn set(&self, key: &str, items: &[&str]) {
        self.lists
            .lock()
            .unwrap()
            .insert(key.into(), items.iter().map(|s| s.to_string()).collect());
    }

    pub fn get(&self, key: &str) -> Vec<String> {
        self.lists
            .lock()
            .unwrap()
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    pub fn executed_tools(&self) -> Vec<String> {
        self.executed
            .lock()
            .unwrap()
            .iter()
            .map(|(t, _)| t.clone())
            .collect()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewMode {
    /// A real preview of what `append` would do.
    Real,
    /// No preview contract at all.
    None,
    Errors,
    /// The store under the preview is unreachable.
    Unavailable,
    Panics,
    Empty,
    /// A real preview with one more line per item the list holds: long for a long list.
    Long,
}

/// `append {key, item}`: a RELATIVE write, like attaching a file to a list of references.
#[derive(Debug)]
pub struct Append {
    pub spec: ToolSpec,
    pub world: Arc<World>,
    pub mode: Mutex<PreviewMode>,
    /// Changes the tool's identity, as a new argument schema accepted by an operator would.
    pub revision: Mutex<u32>,
}

impl Append {
    pub fn new(name: &str, world: Arc<World>, mode: PreviewMode) -> Arc<Self> {
        Arc::new(Append {
            spec: spec(name, "editing", Effect::NonIdempotentWrite),
            world,
            mode: Mutex::new(mode),
            revision: Mutex::new(0),
        })
    }

    pub fn set_mode(&self, mode: PreviewMode) {
        *self.mode.lock().unwrap() = mode;
    }
}

fn spec(name: &str, group: &str, effect: Effect) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("test tool {name}"),
        parameters: json!({"type": "object"}),
        group: group.into(),
        data_class: countersign_core::DataClass::EditorContent,
        effect,
        enabled_by_default: !effect.is_write(),
        requires_admin: false,
    }
}

fn key_of(args: &Value) -> String {
    args["key"].as_str().unwrap_or_default().to_owned()
}

#[async_trait]
impl Tool for Append {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        assert!(ctx.fence.is_some(), "a write must be given its fence token");
        self.world
            .principals
            .lock()
            .unwrap()
            .push(ctx.acting_user.name.clone());
        let key = key_of(args);
        let item = args["item"].as_str().unwrap_or_default().to_owned();
        self.world
            .executed
            .lock()
            .unwrap()
            .push((self.spec.name.clone(), args.clone()));
        let mut lists = self.world.lists.lock().unwrap();
        let list = lists.entry(key.clone()).or_default();
        list.push(item);
        Ok(ToolOutput::ok(format!(
            "{key} now has {} item(s)",
            list.len()
        )))
    }

    fn identity_facts(&self) -> Value {
        json!({"name": self.spec.name, "revision": *self.revision.lock().unwrap()})
    }

    fn previewer(&self) -> Option<&dyn ToolPreview> {
        if *self.mode.lock().unwrap() == PreviewMode::None {
            None
        } else {
            Some(self)
        }
    }
}

#[async_trait]
impl ToolPreview for Append {
    async fn preview(&self, user: &Principal, args: &Value) -> Result<Vec<String>, ToolError> {
        self.world
            .principals
            .lock()
            .unwrap()
            .push(user.name.clone());
        let mode = *self.mode.lock().unwrap();
        match mode {
            PreviewMode::Real | PreviewMode::None => {
                let key = key_of(args);
                let n = self.world.get(&key).len();
                Ok(vec![
                    format!("list {key}: {n} item(s) → {}, appended last", n + 1),
                    format!("item: \"{}\"", args["item"].as_str().unwrap_or_default()),
                ])
            }
            PreviewMode::Errors => Err(ToolError::failed(
                "database_error",
                "connection refused for user secret@db.internal",
            )),
            PreviewMode::Unavailable => Err(ToolError::unavailable(
                "database_error",
                "connection reset by peer",
            )),
            PreviewMode::Panics => panic!("preview exploded"),
            PreviewMode::Empty => Ok(vec!["   ".into()]),
            PreviewMode::Long => {
                let key = key_of(args);
                let items = self.world.get(&key);
                let mut lines = vec![format!(
                    "list {key}: {} item(s) → {}, appended last",
                    items.len(),
                    items.len() + 1
                )];
                lines.extend(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| format!("item {i}: {item}")),
                );
                Ok(lines)
            }
        }
    }

    async fn may_viewer_read_preview(&self, args: &Value, viewer: &Principal) -> bool {
        viewer.admin
            || !self
                .world
                .secret_keys
                .lock()
                .unwrap()
                .contains(&key_of(args))
    }
}

/// `read {key}`: read-only.
#[derive(Debug)]
pub struct Read {
    pub spec: ToolSpec,
    pub world: Arc<World>,
}

impl Read {
    pub fn new(world: Arc<World>) -> Arc<Self> {
        Arc::new(Read {
            spec: spec("read", "content", Effect::ReadOnly),
            world,
        })
    }
}

#[async_trait]
impl Tool for Read {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, _ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        self.world
            .executed
            .lock()
            .unwrap()
            .push(("read".into(), args.clone()));
        Ok(ToolOutput::ok(self.world.get(&key_of(args)).join(",")))
    }
}

/// A model that answers turn N of its script to a transcript holding N assistant messages,
/// and records every transcript it was sent.
#[derive(Debug, Default)]
pub struct TestModel {
    pub turns: Vec<ModelResponse>,
    pub seen: Mutex<Vec<Vec<Message>>>,
    pub offered: Mutex<Vec<Vec<String>>>,
}

impl TestModel {
    pub fn new(turns: Vec<ModelResponse>) -> Self {
        TestModel {
            turns,
            ..Default::default()
        }
    }

    pub fn last_transcript(&self) -> Vec<Message> {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
}

pub fn turn(calls: &[(&str, Value)]) -> ModelResponse {
    ModelResponse {
        content: String::new(),
        tool_calls: calls
            .iter()
            .enumerate()
            .map(|(i, (name, args))| ToolCall {
                id: format!("c{i}"),
                name: (*name).into(),
                arguments: args.clone(),
            })
            .collect(),
        usage: TokenUsage {
            prompt: 10,
            completion: 2,
        },
    }
}

pub fn final_answer(text: &str) -> ModelResponse {
    ModelResponse {
        content: text.into(),
        tool_calls: vec![],
        usage: TokenUsage::default(),
    }
}

#[async_trait]
impl Model for TestModel {
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.seen.lock().unwrap().push(request.messages.to_vec());
        self.offered
            .lock()
            .unwrap()
            .push(request.tools.iter().map(|t| t.name.clone()).collect());
        let n = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        self.turns
            .get(n)
            .cloned()
            .ok_or_else(|| ModelError::InvalidResponse("script exhausted".into()))
    }
}

/// Hooks over an in-memory journal and a lease that a test can take away.
pub struct MemHooks {
    pub run_id: RunId,
    pub journal: Mutex<BTreeMap<(u32, usize), ToolOutput>>,
    pub lease_lost: AtomicBool,
    pub fences: AtomicUsize,
    /// The call an earlier attempt stamped as sent and never journaled: (suspension, index).
    pub sent: Mutex<Option<(u32, usize)>>,
    /// The commits a turn owes: (suspension, index).
    pub owed: Mutex<Vec<(u32, usize)>>,
    /// The next commit point commits, and its answer is lost.
    pub commit_point_fails: AtomicBool,
    /// Run once when the turn is compared and about to write: a colleague's edit at exactly
    /// that moment.
    #[allow(clippy::type_complexity)]
    pub on_applying: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for MemHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemHooks")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl MemHooks {
    /// Runs `edit` when the next approved turn is compared and about to write.
    pub fn when_applying(&self, edit: impl FnOnce() + Send + 'static) {
        *self.on_applying.lock().unwrap() = Some(Box::new(edit));
    }
}

impl Default for MemHooks {
    fn default() -> Self {
        MemHooks {
            run_id: RunId::new(),
            journal: Mutex::default(),
            lease_lost: AtomicBool::new(false),
            fences: AtomicUsize::new(0),
            sent: Mutex::default(),
            owed: Mutex::default(),
            commit_point_fails: AtomicBool::new(false),
            on_applying: Mutex::default(),
        }
    }
}

#[async_trait]
impl SegmentHooks for MemHooks {
    /// The tools here act outside the store: a turn has nothing of its own to commit.
    type Transaction = ();

    async fn turn_record(&self, seq: SuspensionSeq) -> Result<TurnRecord, HookError> {
        Ok(TurnRecord {
            journaled: self
                .journal
                .lock()
                .unwrap()
                .iter()
                .filter(|((s, _), _)| *s == seq.get())
                .map(|((_, i), o)| (CallIndex::new(*i), o.clone()))
                .collect(),
            owed: self
                .owed
                .lock()
                .unwrap()
                .iter()
                .filter(|(s, _)| *s == seq.get())
                .map(|(_, i)| CallIndex::new(*i))
                .collect(),
        })
    }

    async fn begin_turn(&self, _seq: SuspensionSeq) -> Result<(), HookError> {
        if self.lease_lost.load(Ordering::SeqCst) {
            return Err(HookError::LeaseLost);
        }
        Ok(())
    }

    fn local(&self, _tool: &str) -> Option<&dyn LocalWriter<()>> {
        None
    }

    async fn commit_turn(
        &self,
        _turn: (),
        seq: SuspensionSeq,
        entries: &[JournalEntry<'_>],
        owed: &[CallIndex],
    ) -> Result<(), HookError> {
        assert!(entries.is_empty(), "no local writer, no local entry");
        self.owed
            .lock()
            .unwrap()
            .extend(owed.iter().map(|i| (seq.get(), i.get())));
        if self.commit_point_fails.swap(false, Ordering::SeqCst) {
            // The commit happened; its answer is what was lost.
            return Err(HookError::Unavailable {
                code: "database_unavailable",
                detail: "the commit point's answer was lost".into(),
            });
        }
        Ok(())
    }

    async fn rollback_turn(&self, _turn: ()) {}

    async fn applying(&self, _seq: SuspensionSeq) {
        let edit = self.on_applying.lock().unwrap().take();
        if let Some(edit) = edit {
            edit();
        }
    }

    fn sent_unjournaled(&self, seq: SuspensionSeq) -> Option<CallIndex> {
        self.sent
            .lock()
            .unwrap()
            .filter(|(s, _)| *s == seq.get())
            .map(|(_, i)| CallIndex::new(i))
    }

    async fn fence(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        _effect: Effect,
    ) -> Result<FenceToken, HookError> {
        self.fences.fetch_add(1, Ordering::SeqCst);
        if self.lease_lost.load(Ordering::SeqCst) {
            return Err(HookError::LeaseLost);
        }
        *self.sent.lock().unwrap() = Some((seq.get(), index.get()));
        Ok(self.token(seq, index))
    }

    async fn record(
        &self,
        seq: SuspensionSeq,
        index: CallIndex,
        _call: &PendingCall,
        _effect: Effect,
        output: &ToolOutput,
    ) -> Result<(), HookError> {
        self.journal
            .lock()
            .unwrap()
            .entry((seq.get(), index.get()))
            .or_insert(output.clone());
        self.sent.lock().unwrap().take();
        self.owed
            .lock()
            .unwrap()
            .retain(|owed| *owed != (seq.get(), index.get()));
        Ok(())
    }

    fn token(&self, seq: SuspensionSeq, index: CallIndex) -> FenceToken {
        FenceToken {
            run_id: self.run_id,
            lease_owner: "test".into(),
            lease_epoch: LeaseEpoch::new(1).unwrap(),
            suspension_seq: seq,
            call_index: index,
        }
    }

    fn lease_lost(&self) -> bool {
        self.lease_lost.load(Ordering::SeqCst)
    }
}

/// A registry with `read` and two appenders (`append`, `append2`), the agent that may use
/// them, and the acting user.
pub struct Fixture {
    pub world: Arc<World>,
    pub append: Arc<Append>,
    pub append2: Arc<Append>,
    pub registry: ToolRegistry,
    pub agent: AgentConfig,
    pub user: Principal,
    pub hooks: MemHooks,
}

impl Fixture {
    pub fn new() -> Self {
        let world = Arc::new(World::default());
        let append = Append::new("append", world.clone(), PreviewMode::Real);
        let append2 = Append::new("append2", world.clone(), PreviewMode::Real);
        let mut registry = ToolRegistry::new();
        registry
            .register(Read::new(world.clone()))
            .register(append.clone())
            .register(append2.clone());
        let agent = AgentConfig {
            name: "test-agent".into(),
            system_prompt: None,
            policy: ToolPolicy {
                enabled_tools: vec!["append".into(), "append2".into()],
                ..Default::default()
            },
            max_iterations: 10,
            max_tool_calls_per_turn: countersign_core::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            model_options: Default::default(),
            data_classes: Default::default(),
        };
        Fixture {
            world,
            append,
            append2,
            registry,
            agent,
            user: Principal::new("editor", false),
            hooks: MemHooks::default(),
        }
    }

    pub fn segment<'a>(&'a self, model: &'a TestModel, at: &'a str) -> Segment<'a, MemHooks> {
        Segment {
            model,
            registry: &self.registry,
            agent: &self.agent,
            acting_user: &self.user,
            hooks: &self.hooks,
            captured_at: at,
        }
    }
}
