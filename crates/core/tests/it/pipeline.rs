//! The approved turn's one pipeline with writes outside the store: a resource that compares at
//! its write, a two-phase resource, a call in doubt, an answer that never came.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use countersign_core::agent_loop;
use countersign_core::card::build_card;
use countersign_core::preview::bound_lines;
use countersign_core::{CallEdit, Decision, Outcome, TerminationReason};
use countersign_core::{
    CallIndex, CallStatus, CallVerdict, EarlierCall, Effect, ExecContext, ExternalWrite, Prepared,
    PreviewLine, Principal, Role, Sequence, SuspendedRunState, Tool, ToolError, ToolOutput,
    ToolPreview, ToolSpec,
};
use serde_json::{json, Value};

use crate::support::{final_answer, turn, Fixture, TestModel, World};

/// `put {key, item}` on a resource outside the store that keeps the record of every key it
/// answered, as the remote tool protocol asks: it compares the preview it is sent with its own
/// at the write, and may take writes in two phases.
#[derive(Debug)]
struct Resource {
    spec: ToolSpec,
    world: Arc<World>,
    two_phase: bool,
    /// Whether it answers what became of a key.
    tells_status: bool,
    /// It carries calls out and loses their answers.
    loses_answers: AtomicBool,
    records: Mutex<BTreeMap<String, Option<ToolOutput>>>,
    held: Mutex<BTreeMap<String, Value>>,
    writes: AtomicUsize,
    /// A colleague's edit — a list of the world set to these items — made once just before the
    /// resource compares at its next prepare.
    before_prepare: Mutex<Option<(String, Vec<String>)>>,
    /// The resource its calls act on, shared with other tools, and whether it previews a call
    /// after the calls before it.
    sequence: Mutex<Option<Sequence>>,
    /// It drops every change it holds right after holding it, as an expired hold.
    drops_holds: AtomicBool,
}

impl Resource {
    fn new(name: &str, world: Arc<World>, two_phase: bool, tells_status: bool) -> Arc<Self> {
        Arc::new(Resource {
            spec: ToolSpec {
                name: name.into(),
                description: "puts an item at the end of a list elsewhere".into(),
                parameters: json!({"type": "object"}),
                group: "editing".into(),
                data_class: countersign_core::DataClass::EditorContent,
                effect: Effect::NonIdempotentWrite,
                enabled_by_default: false,
                requires_admin: false,
            },
            world,
            two_phase,
            tells_status,
            loses_answers: AtomicBool::new(false),
            records: Mutex::default(),
            held: Mutex::default(),
            writes: AtomicUsize::new(0),
            before_prepare: Mutex::default(),
            sequence: Mutex::default(),
            drops_holds: AtomicBool::new(false),
        })
    }

    fn lines(&self, args: &Value) -> Vec<String> {
        self.lines_after(args, &[])
    }

    /// The preview of `args` after the calls `before` (of this resource's tools).
    fn lines_after(&self, args: &Value, before: &[EarlierCall]) -> Vec<String> {
        let key = args["key"].as_str().unwrap_or_default();
        let earlier = before.iter().filter(|c| c.arguments["key"] == key).count();
        let n = self.world.get(key).len() + earlier;
        vec![format!(
            "list {key}: {n} item(s) → {}, appended last",
            n + 1
        )]
    }

    fn key(ctx: &ExecContext) -> String {
        ctx.fence
            .as_ref()
            .expect("a write carries its fence")
            .idempotency_key()
    }

    /// Whether the preview the approver was shown still reads the same here.
    fn current(&self, ctx: &ExecContext, args: &Value) -> bool {
        ctx.shown_preview
            .as_ref()
            .is_none_or(|shown| bound_lines(&self.lines_after(args, &ctx.before)) == *shown)
    }

    fn apply(&self, args: &Value) -> ToolOutput {
        let key = args["key"].as_str().unwrap_or_default().to_owned();
        let item = args["item"].as_str().unwrap_or_default().to_owned();
        let mut lists = self.world.lists.lock().unwrap();
        let list = lists.entry(key.clone()).or_default();
        list.push(item);
        self.writes.fetch_add(1, Ordering::SeqCst);
        ToolOutput::ok(format!("{key} now has {} item(s)", list.len()))
    }
}

#[async_trait]
impl Tool for Resource {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        let key = Self::key(ctx);
        if let Some(recorded) = self.records.lock().unwrap().get(&key) {
            return recorded.clone().ok_or(ToolError::Moved);
        }
        let answer = self.current(ctx, args).then(|| self.apply(args));
        self.records.lock().unwrap().insert(key, answer.clone());
        if self.loses_answers.load(Ordering::SeqCst) {
            return Err(ToolError::outcome_unknown("remote_timeout", "no answer"));
        }
        answer.ok_or(ToolError::Moved)
    }

    fn previewer(&self) -> Option<&dyn ToolPreview> {
        Some(self)
    }

    fn external(&self) -> Option<&dyn ExternalWrite> {
        Some(self)
    }

    fn sequence(&self) -> Option<Sequence> {
        self.sequence.lock().unwrap().clone()
    }
}

#[async_trait]
impl ToolPreview for Resource {
    async fn preview(&self, _user: &Principal, args: &Value) -> Result<Vec<String>, ToolError> {
        Ok(self.lines(args))
    }

    async fn may_viewer_read_preview(&self, _args: &Value, _viewer: &Principal) -> bool {
        true
    }

    async fn preview_after(
        &self,
        _user: &Principal,
        args: &Value,
        before: &[EarlierCall],
    ) -> Result<Vec<PreviewLine>, ToolError> {
        Ok(self
            .lines_after(args, before)
            .into_iter()
            .map(PreviewLine::from)
            .collect())
    }
}

#[async_trait]
impl ExternalWrite for Resource {
    fn two_phase(&self) -> bool {
        self.two_phase
    }

    async fn prepare(&self, ctx: &ExecContext, args: &Value) -> Result<Prepared, ToolError> {
        let edit = self.before_prepare.lock().unwrap().take();
        if let Some((key, items)) = edit {
            let items: Vec<&str> = items.iter().map(String::as_str).collect();
            self.world.set(&key, &items);
        }
        let key = Self::key(ctx);
        if let Some(recorded) = self.records.lock().unwrap().get(&key) {
            return Ok(recorded.clone().map_or(Prepared::Moved, Prepared::Answered));
        }
        if !self.current(ctx, args) {
            self.records.lock().unwrap().insert(key, None);
            return Ok(Prepared::Moved);
        }
        if !self.drops_holds.load(Ordering::SeqCst) {
            self.held.lock().unwrap().insert(key, args.clone());
        }
        Ok(Prepared::Held)
    }

    async fn commit(&self, ctx: &ExecContext, _args: &Value) -> Result<ToolOutput, ToolError> {
        let key = Self::key(ctx);
        let held = self.held.lock().unwrap().remove(&key);
        match held {
            Some(args) => {
                let output = self.apply(&args);
                self.records
                    .lock()
                    .unwrap()
                    .insert(key, Some(output.clone()));
                Ok(output)
            }
            None => self
                .records
                .lock()
                .unwrap()
                .get(&key)
                .cloned()
                .flatten()
                .ok_or_else(|| ToolError::failed("prepared_change_gone", "nothing held")),
        }
    }

    async fn abort(&self, ctx: &ExecContext, _args: &Value) -> Result<(), ToolError> {
        self.held.lock().unwrap().remove(&Self::key(ctx));
        Ok(())
    }

    async fn status(&self, ctx: &ExecContext) -> Result<CallStatus, ToolError> {
        if !self.tells_status {
            return Err(ToolError::failed("unsupported", "no status"));
        }
        let key = Self::key(ctx);
        if let Some(recorded) = self.records.lock().unwrap().get(&key) {
            return Ok(recorded
                .clone()
                .map_or(CallStatus::Moved, CallStatus::Answered));
        }
        Ok(if self.held.lock().unwrap().contains_key(&key) {
            CallStatus::Prepared
        } else {
            CallStatus::Unseen
        })
    }
}

/// The fixture with two resources, `put` and `put2`, enabled for the agent.
fn fixture(two_phase: bool, tells_status: bool) -> (Fixture, Arc<Resource>, Arc<Resource>) {
    let mut f = Fixture::new();
    let put = Resource::new("put", f.world.clone(), two_phase, tells_status);
    let put2 = Resource::new("put2", f.world.clone(), two_phase, tells_status);
    f.registry.register(put.clone()).register(put2.clone());
    f.agent.policy.enabled_tools = vec!["put".into(), "put2".into()];
    (f, put, put2)
}

fn model() -> TestModel {
    TestModel::new(vec![
        turn(&[
            ("put", json!({"key": "k1", "item": "x"})),
            ("put2", json!({"key": "k2", "item": "y"})),
        ]),
        final_answer("done"),
    ])
}

fn decision(approved: bool) -> Decision {
    Decision {
        approved,
        comment: None,
        ..Decision::default()
    }
}

async fn suspended(f: &Fixture) -> SuspendedRunState {
    match agent_loop::start(f.segment(&model(), "t0"), "go", None).await {
        Outcome::Suspended { state, .. } => state,
        other => panic!("{other:?}"),
    }
}

async fn resumed(
    f: &Fixture,
    model: &TestModel,
    state: SuspendedRunState,
    approved: bool,
) -> Outcome {
    agent_loop::resume(f.segment(model, "t1"), state, &decision(approved)).await
}

/// What the model was told of each call of the approved turn, in order.
fn told(model: &TestModel) -> Vec<String> {
    model
        .last_transcript()
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.clone())
        .collect()
}

#[tokio::test]
async fn a_resource_that_finds_a_later_call_moved_at_its_write_re_suspends_with_the_earlier_call_landed(
) {
    let (f, put, put2) = fixture(false, true);
    let state = suspended(&f).await;
    // Between the comparison and the second write, a colleague adds to k2 at the resource.
    let world = f.world.clone();
    f.hooks
        .when_applying(move || world.set("k2", &["colleague"]));

    let Outcome::Suspended {
        state: card2,
        moved,
    } = resumed(&f, &model(), state, true).await
    else {
        panic!("the second call moved at its resource");
    };
    assert_eq!(card2.stale_call_indexes, vec![CallIndex::new(1)]);
    assert_eq!(moved, vec![(CallIndex::new(1), "put2".to_owned())]);
    assert_eq!(
        card2.call_previews[1].lines,
        vec!["list k2: 1 item(s) → 2, appended last"],
        "the new card shows what the call would do now"
    );
    let landed: Vec<_> = card2.landed_calls.iter().map(|c| c.index).collect();
    assert_eq!(
        landed,
        vec![CallIndex::new(0)],
        "the first call landed and is shown as done"
    );
    assert_eq!(
        (
            put.writes.load(Ordering::SeqCst),
            put2.writes.load(Ordering::SeqCst)
        ),
        (1, 0)
    );

    // Approved again, only the call that did not land runs; the first is not written twice.
    let model = model();
    assert!(matches!(
        resumed(&f, &model, card2, true).await,
        Outcome::Completed { .. }
    ));
    assert_eq!(
        (
            put.writes.load(Ordering::SeqCst),
            put2.writes.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    assert_eq!(f.world.get("k1"), vec!["x"]);
    assert_eq!(f.world.get("k2"), vec!["colleague", "y"]);
    assert_eq!(
        told(&model),
        vec!["k1 now has 1 item(s)", "k2 now has 2 item(s)"]
    );
}

#[tokio::test]
async fn a_denied_card_after_a_partial_turn_tells_the_model_the_truth_about_the_call_that_landed() {
    let (f, _, put2) = fixture(false, true);
    let state = suspended(&f).await;
    let world = f.world.clone();
    f.hooks
        .when_applying(move || world.set("k2", &["colleague"]));
    let Outcome::Suspended { state: card2, .. } = resumed(&f, &model(), state, true).await else {
        panic!("re-suspended");
    };

    let model = model();
    resumed(&f, &model, card2, false).await;
    let told = told(&model);
    assert_eq!(
        told[0], "k1 now has 1 item(s)",
        "it happened, whatever the second card said"
    );
    assert!(told[1].contains("denied"), "{}", told[1]);
    assert_eq!(put2.writes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_two_phase_turn_whose_second_call_moved_at_its_resource_writes_nothing_at_all() {
    let (f, put, put2) = fixture(true, true);
    let state = suspended(&f).await;
    *put2.before_prepare.lock().unwrap() = Some(("k2".into(), vec!["colleague".into()]));

    let Outcome::Suspended { state: card2, .. } = resumed(&f, &model(), state, true).await else {
        panic!("the second prepare found the preview moved");
    };
    assert_eq!(card2.stale_call_indexes, vec![CallIndex::new(1)]);
    assert!(
        card2.landed_calls.is_empty(),
        "the first change was only held, and is aborted"
    );
    assert!(put.held.lock().unwrap().is_empty(), "aborted");
    assert_eq!(
        (
            put.writes.load(Ordering::SeqCst),
            put2.writes.load(Ordering::SeqCst)
        ),
        (0, 0)
    );
    assert!(f.world.get("k1").is_empty());

    assert!(matches!(
        resumed(&f, &model(), card2, true).await,
        Outcome::Completed { .. }
    ));
    assert_eq!(f.world.get("k1"), vec!["x"]);
    assert_eq!(f.world.get("k2"), vec!["colleague", "y"]);
}

#[tokio::test]
async fn a_call_an_earlier_attempt_sent_is_resolved_by_its_key_and_never_sent_again() {
    let (f, put, put2) = fixture(false, true);
    let state = suspended(&f).await;
    // An earlier attempt sent call 0, which landed, and died before journaling it.
    let token =
        countersign_core::SegmentHooks::token(&f.hooks, state.suspension_seq, CallIndex::new(0));
    let ctx = ExecContext {
        acting_user: f.user.clone(),
        fence: Some(token),
        shown_preview: None,
        before: Vec::new(),
    };
    put.execute(&ctx, &json!({"key": "k1", "item": "x"}))
        .await
        .unwrap();
    *f.hooks.sent.lock().unwrap() = Some((state.suspension_seq.get(), 0));

    let model = model();
    assert!(matches!(
        resumed(&f, &model, state, true).await,
        Outcome::Completed { .. }
    ));
    assert_eq!(put.writes.load(Ordering::SeqCst), 1, "not sent again");
    assert_eq!(put2.writes.load(Ordering::SeqCst), 1);
    assert_eq!(f.world.get("k1"), vec!["x"]);
    assert_eq!(
        told(&model)[0],
        "k1 now has 1 item(s)",
        "its recorded answer"
    );
}

#[tokio::test]
async fn a_non_idempotent_call_in_doubt_whose_resource_cannot_say_fails_the_run_outcome_unknown() {
    let (f, put, put2) = fixture(false, false);
    let state = suspended(&f).await;
    *f.hooks.sent.lock().unwrap() = Some((state.suspension_seq.get(), 0));

    let outcome = resumed(&f, &model(), state, true).await;
    assert!(
        matches!(
            outcome,
            Outcome::Failed {
                reason: TerminationReason::OutcomeUnknown,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        (
            put.writes.load(Ordering::SeqCst),
            put2.writes.load(Ordering::SeqCst)
        ),
        (0, 0)
    );
}

#[tokio::test]
async fn a_write_whose_answer_never_came_fails_the_run_outcome_unknown_and_the_model_is_not_told() {
    let (f, put, _) = fixture(false, true);
    let state = suspended(&f).await;
    put.loses_answers.store(true, Ordering::SeqCst);

    let model = model();
    let outcome = resumed(&f, &model, state, true).await;
    assert!(
        matches!(
            outcome,
            Outcome::Failed {
                reason: TerminationReason::OutcomeUnknown,
                code: "outcome_unknown",
                ..
            }
        ),
        "{outcome:?}"
    );
    assert!(
        model.seen.lock().unwrap().is_empty(),
        "the model is never asked on about a write that may have landed"
    );
    assert!(
        f.hooks.journal.lock().unwrap().is_empty(),
        "no result was journaled for it"
    );
}

/// Two appends to `k1` on one resource in one turn, through `put` then `put2`.
fn same_list_model() -> TestModel {
    TestModel::new(vec![
        turn(&[
            ("put", json!({"key": "k1", "item": "x"})),
            ("put2", json!({"key": "k1", "item": "y"})),
        ]),
        final_answer("done"),
    ])
}

/// `put` and `put2` act on one resource, which previews a call after the ones before it when
/// it `composes`.
fn one_resource(put: &Resource, put2: &Resource, composes: bool) {
    for r in [put, put2] {
        *r.sequence.lock().unwrap() = Some(Sequence {
            resource: "list-server".into(),
            composes,
        });
    }
}

async fn suspended_with(f: &Fixture, model: &TestModel) -> SuspendedRunState {
    match agent_loop::start(f.segment(model, "t0"), "go", None).await {
        Outcome::Suspended { state, .. } => state,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn two_calls_on_one_resource_are_previewed_in_sequence_and_land_as_their_lines_said() {
    for two_phase in [false, true] {
        let (f, put, put2) = fixture(two_phase, true);
        one_resource(&put, &put2, true);
        let state = suspended_with(&f, &same_list_model()).await;
        let lines: Vec<_> = state
            .call_previews
            .iter()
            .map(|p| p.lines[0].clone())
            .collect();
        assert_eq!(
            lines,
            vec![
                "list k1: 0 item(s) → 1, appended last",
                "list k1: 1 item(s) → 2, appended last"
            ],
            "the second line composes with the first (two phases: {two_phase})"
        );
        assert!(state.call_previews.iter().all(|p| !p.alone));
        let model = same_list_model();
        let outcome = agent_loop::resume(f.segment(&model, "t1"), state, &decision(true)).await;
        assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
        assert_eq!(f.world.get("k1"), vec!["x", "y"]);
        assert_eq!(
            told(&model),
            vec!["k1 now has 1 item(s)", "k1 now has 2 item(s)"]
        );
    }
}

#[tokio::test]
async fn a_call_after_another_on_a_resource_that_cannot_compose_is_marked_alone() {
    let (f, put, put2) = fixture(false, true);
    one_resource(&put, &put2, false);
    let state = suspended_with(&f, &same_list_model()).await;
    let alone: Vec<_> = state.call_previews.iter().map(|p| p.alone).collect();
    assert_eq!(alone, vec![false, true]);
    assert_eq!(
        state.call_previews[1].lines,
        vec!["list k1: 0 item(s) → 1, appended last"],
        "computed as if the first call were not there"
    );
}

#[tokio::test]
async fn a_commit_point_whose_answer_was_lost_keeps_the_holds_and_the_next_attempt_only_commits_them(
) {
    let (f, put, put2) = fixture(true, true);
    let state = suspended(&f).await;
    f.hooks.commit_point_fails.store(true, Ordering::SeqCst);

    let outcome = resumed(&f, &model(), state.clone(), true).await;
    assert!(
        matches!(outcome, Outcome::Interrupted(_)),
        "the segment is run again: {outcome:?}"
    );
    assert_eq!(
        put.held.lock().unwrap().len(),
        1,
        "not aborted: the turn owes its commit"
    );
    assert_eq!(put2.held.lock().unwrap().len(), 1);
    assert_eq!(f.hooks.owed.lock().unwrap().len(), 2);

    // A colleague changes k1 now: the held change is committed anyway, never compared again.
    f.world.set("k2", &["colleague"]);
    let model = model();
    let outcome = resumed(&f, &model, state, true).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(
        (
            put.writes.load(Ordering::SeqCst),
            put2.writes.load(Ordering::SeqCst)
        ),
        (1, 1),
        "each held change committed once"
    );
    assert!(f.hooks.owed.lock().unwrap().is_empty(), "the debt is paid");
}

#[tokio::test]
async fn a_hold_lost_before_the_commit_point_re_suspends_the_turn_with_nothing_written() {
    let (f, put, put2) = fixture(true, true);
    let state = suspended(&f).await;
    put2.drops_holds.store(true, Ordering::SeqCst);

    let Outcome::Suspended { state: card2, .. } = resumed(&f, &model(), state, true).await else {
        panic!("a lost hold is a moved call");
    };
    assert_eq!(card2.stale_call_indexes, vec![CallIndex::new(1)]);
    assert!(card2.landed_calls.is_empty());
    assert!(
        put.held.lock().unwrap().is_empty(),
        "the other hold is aborted"
    );
    assert_eq!(
        (
            put.writes.load(Ordering::SeqCst),
            put2.writes.load(Ordering::SeqCst)
        ),
        (0, 0)
    );

    put2.drops_holds.store(false, Ordering::SeqCst);
    assert!(matches!(
        resumed(&f, &model(), card2, true).await,
        Outcome::Completed { .. }
    ));
    assert_eq!(
        (f.world.get("k1"), f.world.get("k2")),
        (vec!["x".to_owned()], vec!["y".to_owned()])
    );
}

/// Three appends in one turn: `k1 x`, `{second} y`, `k3 z`, all through `put`.
fn three_model(second: &str) -> TestModel {
    TestModel::new(vec![
        turn(&[
            ("put", json!({"key": "k1", "item": "x"})),
            ("put", json!({"key": second, "item": "y"})),
            ("put", json!({"key": "k1", "item": "z"})),
        ]),
        final_answer("done"),
    ])
}

/// Approves calls 0 and 2 and denies call 1 with a message.
fn zero_and_two() -> Decision {
    Decision {
        approved: true,
        calls: vec![
            CallVerdict {
                index: CallIndex::new(0),
                approved: true,
                message: None,
            },
            CallVerdict {
                index: CallIndex::new(1),
                approved: false,
                message: Some("Not that list.".into()),
            },
            CallVerdict {
                index: CallIndex::new(2),
                approved: true,
                message: None,
            },
        ],
        ..Decision::default()
    }
}

#[tokio::test]
async fn approving_calls_0_and_2_writes_them_as_shown_and_the_model_reads_the_denial_of_1() {
    let (f, put, put2) = fixture(false, true);
    one_resource(&put, &put2, true);
    // Call 1 acts on another list: calls 0 and 2 read the same without it.
    let state = suspended_with(&f, &three_model("k2")).await;
    let model = three_model("k2");
    let outcome = agent_loop::resume(f.segment(&model, "t1"), state, &zero_and_two()).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(f.world.get("k1"), vec!["x", "z"]);
    assert!(
        f.world.get("k2").is_empty(),
        "the denied call wrote nothing"
    );
    let told = told(&model);
    assert_eq!(told[0], "k1 now has 1 item(s)");
    assert!(
        told[1].contains("Not that list."),
        "the model reads the approver's words: {}",
        told[1]
    );
    assert_eq!(told[2], "k1 now has 2 item(s)");
}

#[tokio::test]
async fn a_subset_whose_previews_read_otherwise_without_the_denied_call_re_suspends_and_writes_nothing(
) {
    let (f, put, put2) = fixture(false, true);
    one_resource(&put, &put2, true);
    // Call 2's line counted call 1's item on k1: without it, it reads otherwise.
    let state = suspended_with(&f, &three_model("k1")).await;
    assert_eq!(
        state.call_previews[2].lines,
        vec!["list k1: 2 item(s) → 3, appended last"]
    );
    let outcome =
        agent_loop::resume(f.segment(&three_model("k1"), "t1"), state, &zero_and_two()).await;
    let Outcome::Suspended { state: card, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert!(f.world.get("k1").is_empty(), "nothing of the subset landed");
    assert_eq!(put.writes.load(Ordering::SeqCst), 0);
    assert_eq!(card.stale_call_indexes, vec![CallIndex::new(2)]);
    assert_eq!(card.excluded_calls, vec![CallIndex::new(1)]);
    assert_eq!(
        card.call_previews[2].lines,
        vec!["list k1: 1 item(s) → 2, appended last"],
        "the new card shows the subset as it would land"
    );
    let shown = build_card(&card, &f.registry, Some(&Principal::new("admin", true))).await;
    let excluded: Vec<bool> = shown.calls.iter().map(|c| c.excluded).collect();
    assert_eq!(
        excluded,
        vec![false, true, false],
        "the card says which call was left out"
    );
}

#[tokio::test]
async fn an_edit_re_issues_the_card_marked_and_its_approval_writes_the_edited_call() {
    let (f, _put, _put2) = fixture(false, true);
    let state = suspended(&f).await;
    let seq = state.suspension_seq;
    let edit = Decision {
        edits: vec![CallEdit {
            index: CallIndex::new(1),
            arguments: json!({"key": "k2", "item": "edited"}),
            editor: "alice".into(),
        }],
        ..Decision::default()
    };
    let Outcome::Suspended { state: card, moved } =
        agent_loop::resume(f.segment(&model(), "t1"), state, &edit).await
    else {
        panic!("an edit re-issues the card");
    };
    assert!(moved.is_empty());
    assert_eq!(card.suspension_seq, seq.next());
    assert!(f.world.get("k2").is_empty(), "an edit writes nothing");
    assert_eq!(card.pending_calls[1].arguments["item"], "edited");
    let record = card.edit_of(CallIndex::new(1)).expect("the edit is marked");
    assert_eq!(
        (
            record.editor.as_str(),
            &record.before["item"],
            &record.after["item"]
        ),
        ("alice", &json!("y"), &json!("edited"))
    );
    assert_eq!(card.stale_call_indexes, vec![CallIndex::new(1)]);
    assert_eq!(
        card.call_previews[1].lines,
        vec!["list k2: 0 item(s) → 1, appended last"]
    );
    let shown = build_card(&card, &f.registry, Some(&Principal::new("admin", true))).await;
    let edit = shown.calls[1]
        .edit
        .as_ref()
        .expect("the card marks the edit");
    assert_eq!(
        (edit.editor.as_str(), &edit.before["item"]),
        ("alice", &json!("y"))
    );
    assert!(shown.calls[0].edit.is_none());

    // The re-issued card survives its round trip through the stored state.
    let card = SuspendedRunState::from_json(&card.to_json()).unwrap();
    assert_eq!(card.edits.len(), 1);

    let model = model();
    let outcome = agent_loop::resume(f.segment(&model, "t2"), card, &decision(true)).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(f.world.get("k2"), vec!["edited"]);
    let told = told(&model);
    assert!(
        told[1].contains("alice changed the arguments") && told[1].contains("\"edited\""),
        "the model is told the call as it ran: {}",
        told[1]
    );
    assert!(!told[0].contains("changed the arguments"));
}
