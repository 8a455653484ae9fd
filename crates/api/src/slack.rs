//! Deciding from Slack: the Block Kit message of a card, with Approve and Deny buttons, and the
//! endpoint Slack posts a button press to (`POST /slack/interactions`).
//!
//! Slack signs every request with the app's signing secret: `v0=` and the hex HMAC-SHA256 of
//! `v0:{timestamp}:{body}`. A request whose signature does not verify, or whose timestamp is
//! more than five minutes from the database-independent wall clock, is refused before anything
//! of it is read — a forged or replayed press decides nothing. The Slack user is mapped to a
//! directory user only through the explicit mapping an operator keeps (`countersign slack
//! map`), never a channel's membership; an unmapped user decides nothing.
//!
//! A button carries the card it was shown with (run, suspension number, digest), so a press on
//! an out-of-date message goes through the gates as a decision on the old card and is refused
//! `stale_turn`; the answer replaces the message. Its decision id is derived from the press
//! (workspace, user, action time, card), so Slack's retries of one press are one decision.
//!
//! By default the message shows no content: how many writes, on which pages, and a link to the
//! card. What a write would do stays behind the inbox's read gate — unless the message is asked
//! for a channel an operator cleared for a data class (`countersign slack clear`): then it shows
//! the preview of each call of that class or a lower one whose preview the viewer may see on
//! the card, bounded and escaped.

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use countersign_core::card::{ApprovalCard, CardPreview};
use countersign_core::{DataClass, DecisionMessage, RunId, SuspensionSeq, TurnDigest};
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::auth::{Caller, Via, CALLER_PROBLEMS};
use crate::cards::{card_for, CARD_PROBLEMS};
use crate::problem::{route_problems, unavailable, Problem, ProblemCode, EVERY_REQUEST};
use crate::queries::{visible_run, VISIBLE_RUN_PROBLEMS};
use crate::v1::DecisionAccepted;
use crate::AppState;

/// How far a request's timestamp may be from now, in seconds: Slack's own advice.
pub const REPLAY_WINDOW_SECS: i64 = 300;

/// The Slack app's settings.
#[derive(Debug, Clone)]
pub struct SlackConfig {
    /// The app's signing secret.
    pub signing_secret: SecretString,
    /// The producer its decisions are gated as; the registry must let it assert approvers
    /// (`countersign producers allow <it> approver '*'`).
    pub producer: String,
    /// The inbox's address, for the message's link to the card.
    pub inbox_url: Option<String>,
}

/// Why a request is not Slack's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsigned {
    /// No or unreadable timestamp or signature headers.
    Missing,
    /// The timestamp is outside the replay window.
    Replayed,
    /// The signature does not verify.
    Forged,
}

/// Verifies Slack's signature of `body` at `now` (seconds since the epoch).
pub fn verify(
    secret: &[u8],
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), Unsigned> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(Unsigned::Missing);
    };
    let at: i64 = timestamp.parse().map_err(|_| Unsigned::Missing)?;
    if (now - at).abs() > REPLAY_WINDOW_SECS {
        return Err(Unsigned::Replayed);
    }
    let given = signature
        .strip_prefix("v0=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or(Unsigned::Forged)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| Unsigned::Forged)?;
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac.verify_slice(&given).map_err(|_| Unsigned::Forged)
}

/// The button value: the card a press decides on.
fn button_value(run_id: RunId, seq: SuspensionSeq, digest: &TurnDigest) -> String {
    format!("{run_id}:{}:{}", seq.get(), digest.as_str())
}

/// Lines of one call's preview a message shows at most.
pub const PREVIEW_LINES: usize = 20;
/// Characters of one call's preview block at most (Slack takes 3000 in a section).
const PREVIEW_CHARS: usize = 2_500;

/// A call whose preview a message may show: the channel is cleared for its data class and the
/// viewer may see its preview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownPreview {
    pub index: usize,
    pub tool: String,
    pub lines: Vec<String>,
}

/// `text` as Slack's mrkdwn shows it literally inside a code block: `&`, `<` and `>` escaped
/// (so no mention, link or command is made), a run of three backticks broken (so the block
/// cannot be closed early).
fn mrkdwn_literal(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace("```", "`\u{200b}``")
}

/// The section block of one call's preview: its first [`PREVIEW_LINES`] lines, cut to
/// [`PREVIEW_CHARS`], and how many more there are.
fn preview_block(p: &ShownPreview) -> Value {
    let mut body = String::new();
    let mut shown = 0;
    for line in p.lines.iter().take(PREVIEW_LINES) {
        let line = mrkdwn_literal(line);
        if body.len() + line.len() + 1 > PREVIEW_CHARS {
            break;
        }
        body.push_str(&line);
        body.push('\n');
        shown += 1;
    }
    let more = p.lines.len() - shown;
    let tail = if more > 0 {
        format!(
            "\n…and {more} more line{} on the card",
            if more == 1 { "" } else { "s" }
        )
    } else {
        String::new()
    };
    json!({"type": "section", "block_id": format!("countersign_preview_{}", p.index),
           "text": {"type": "mrkdwn",
                    "text": format!("*Call {}* `{}`\n```{body}```{tail}",
                                    p.index, mrkdwn_literal(&p.tool))}})
}

/// The Block Kit message of `card`: how many writes on which pages, the previews in `previews`
/// (none unless the channel is cleared for them), the buttons and a link to the card.
pub fn card_message(
    run_id: RunId,
    card: &ApprovalCard,
    writes: usize,
    inbox_url: Option<&str>,
    previews: &[ShownPreview],
) -> Value {
    let mut pages: Vec<i64> = card
        .calls
        .iter()
        .filter(|c| c.tool.contains("page"))
        .filter_map(|c| c.arguments.get("uid").and_then(Value::as_i64))
        .collect();
    pages.sort_unstable();
    pages.dedup();
    let what = format!("{writes} write{}", if writes == 1 { "" } else { "s" });
    let on = match pages.as_slice() {
        [] => String::new(),
        [one] => format!(" on page {one}"),
        many => {
            let list: Vec<String> = many.iter().map(i64::to_string).collect();
            format!(" on pages {}", list.join(", "))
        }
    };
    let text = format!("{what}{on} — open the card");
    let value = button_value(run_id, card.suspension_seq, &card.turn_digest);
    let mut buttons = vec![
        json!({"type": "button", "action_id": "countersign_approve", "style": "primary",
               "text": {"type": "plain_text", "text": "Approve"}, "value": value}),
        json!({"type": "button", "action_id": "countersign_deny", "style": "danger",
               "text": {"type": "plain_text", "text": "Deny"}, "value": value}),
    ];
    if let Some(base) = inbox_url {
        buttons.push(json!({"type": "button", "action_id": "countersign_open",
                            "text": {"type": "plain_text", "text": "Open the card"},
                            "url": format!("{}/runs/{run_id}", base.trim_end_matches('/'))}));
    }
    let mut blocks = vec![json!({"type": "section", "block_id": "countersign_card",
                                 "text": {"type": "mrkdwn", "text": text}})];
    blocks.extend(previews.iter().map(preview_block));
    blocks.push(json!({"type": "actions", "block_id": "countersign_decide", "elements": buttons}));
    json!({"text": text, "blocks": blocks})
}

route_problems!(
    /// The problems of `GET /v1/runs/{run_id}/slack-message`.
    MessageProblems = [
        EVERY_REQUEST,
        CALLER_PROBLEMS,
        [ProblemCode::NotFound, ProblemCode::InvalidQuery, ProblemCode::Unavailable],
        VISIBLE_RUN_PROBLEMS,
        CARD_PROBLEMS,
    ]
);

/// Query of `GET /v1/runs/{run_id}/slack-message`: the channel the message is for.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MessageQuery {
    /// The Slack workspace's id (e.g. `T0123ABCD`); with `channel`.
    pub team: Option<String>,
    /// The channel's id (e.g. `C0456EFGH`): when an operator cleared it for a data class, the
    /// message shows the previews of the calls of that class and below that the caller may see.
    pub channel: Option<String>,
}

/// The Block Kit message to post to Slack for the card, as the caller may see it: how many
/// writes on which pages, Approve and Deny buttons carrying the card — and no content, unless
/// `team` and `channel` name a channel cleared for the calls' data class.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/slack-message",
    operation_id = "slack_message",
    tag = "inbox",
    params(("run_id" = Uuid, Path, description = "The run."), MessageQuery),
    responses(
        (status = 200, description = "A message for `chat.postMessage`: `text` and `blocks`."),
        MessageProblems,
    ),
    security(("bearer" = []))
)]
pub async fn message(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    query: Result<Query<MessageQuery>, QueryRejection>,
) -> Result<Json<Value>, Problem> {
    let Query(query) = query.map_err(|_| Problem::new(ProblemCode::InvalidQuery))?;
    let run_id = RunId::parse(&run_id).map_err(|_| Problem::new(ProblemCode::NotFound))?;
    let (run, access) = visible_run(&state, &caller, run_id).await?;
    let card = card_for(&state, &run, &access).await?;
    let registry = &state.coordinator.registry;
    let writes = card
        .calls
        .iter()
        .filter(|c| {
            registry
                .get(&c.tool)
                .is_none_or(|t| t.spec().effect.is_write())
        })
        .count();
    let cleared = match (&query.team, &query.channel) {
        (Some(team), Some(channel)) => state
            .coordinator
            .store
            .slack_channel_class(team, channel)
            .await
            .map_err(|e| unavailable("slack channels", e.code(), &e))?,
        _ => None,
    };
    let previews = cleared.map_or_else(Vec::new, |class| {
        shown_previews(&card, class, |tool| {
            registry
                .get(tool)
                .map_or(DataClass::FAIL_CLOSED, |t| t.spec().data_class)
        })
    });
    let inbox = state.slack.as_ref().and_then(|s| s.inbox_url.as_deref());
    Ok(Json(card_message(run_id, &card, writes, inbox, &previews)))
}

/// The previews of `card` a channel cleared for `cleared` may show: each call of that class or
/// a lower one (`class_of` its tool's) whose preview the card shows its viewer. A withheld,
/// failed or absent preview is never shown.
pub fn shown_previews(
    card: &ApprovalCard,
    cleared: DataClass,
    class_of: impl Fn(&str) -> DataClass,
) -> Vec<ShownPreview> {
    card.calls
        .iter()
        .filter(|c| class_of(&c.tool) <= cleared)
        .filter_map(|c| match &c.preview {
            CardPreview::Shown { lines, .. } => Some(ShownPreview {
                index: c.index.get(),
                tool: c.tool.clone(),
                lines: lines.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// A press of one of the card's buttons, as Slack's `block_actions` payload carries it.
struct Press {
    team: String,
    user: String,
    approve: bool,
    action_ts: String,
    run_id: RunId,
    seq: SuspensionSeq,
    digest: TurnDigest,
}

fn press(body: &[u8]) -> Option<Press> {
    let form: Vec<(String, String)> = serde_urlencoded::from_bytes(body).ok()?;
    let payload = form.into_iter().find(|(k, _)| k == "payload")?.1;
    let p: Value = serde_json::from_str(&payload).ok()?;
    let action = p.get("actions")?.get(0)?;
    let approve = match action.get("action_id")?.as_str()? {
        "countersign_approve" => true,
        "countersign_deny" => false,
        _ => return None,
    };
    let mut card = action.get("value")?.as_str()?.splitn(3, ':');
    let run_id = RunId::parse(card.next()?).ok()?;
    let seq = SuspensionSeq::new(card.next()?.parse().ok()?).ok()?;
    let digest = TurnDigest::parse(card.next()?).ok()?;
    let team = p
        .pointer("/team/id")
        .or_else(|| p.pointer("/user/team_id"))?
        .as_str()?;
    Some(Press {
        team: team.to_owned(),
        user: p.pointer("/user/id")?.as_str()?.to_owned(),
        approve,
        action_ts: action.get("action_ts")?.as_str()?.to_owned(),
        run_id,
        seq,
        digest,
    })
}

impl Press {
    /// The decision the press makes on the whole turn, as `approver`.
    fn decision(&self, approver: &str) -> DecisionMessage {
        DecisionMessage {
            decision_id: decision_id(self),
            run_id: self.run_id,
            suspension_seq: self.seq,
            turn_digest: self.digest.clone(),
            approved: self.approve,
            calls: vec![],
            edits: vec![],
            approver: approver.to_owned(),
            comment: None,
        }
    }
}

/// The decision id of a press: one press, one decision, however often Slack sends it.
fn decision_id(p: &Press) -> Uuid {
    let hash = Sha256::new()
        .chain_update(format!(
            "{}:{}:{}:{}:{}:{}",
            p.team,
            p.user,
            p.action_ts,
            button_value(p.run_id, p.seq, &p.digest),
            p.approve,
            "slack"
        ))
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

fn reply(outcome: &str, text: String) -> Response {
    (
        StatusCode::OK,
        Json(json!({"replace_original": true, "text": text, "outcome": outcome})),
    )
        .into_response()
}

/// `POST /slack/interactions`: a button press, verified, mapped, and gated as a decision.
pub async fn interactions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(slack) = state.slack.clone() else {
        return Problem::new(ProblemCode::NotFound).into_response();
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let now = chrono::Utc::now().timestamp();
    if let Err(why) = verify(
        slack.signing_secret.expose_secret().as_bytes(),
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
        &body,
        now,
    ) {
        tracing::warn!(?why, "Slack interaction refused: not signed by Slack");
        return Problem::new(ProblemCode::Unauthenticated).into_response();
    }
    let Some(press) = press(&body) else {
        return Problem::malformed("payload".to_owned()).into_response();
    };
    let user = match state.coordinator.store.slack_user(&press.team, &press.user).await {
        Ok(Some(user)) => user,
        Ok(None) => {
            return reply(
                "unmapped",
                "Your Slack user is not mapped to a countersign user: ask an operator to map it (countersign slack map)."
                    .to_owned(),
            )
        }
        Err(e) => return unavailable("slack users", e.code(), &e).into_response(),
    };
    let message = press.decision(&user);
    let caller = Caller {
        user: user.clone(),
        producer: slack.producer.clone(),
        via: Via::Proxy,
    };
    let decided = crate::v1::take_decision(&state, &caller, Ok(message)).await;
    decided_reply(&press, &user, decided)
}

/// The reply to `press` by `user` once its decision was taken: what became of it, in words.
fn decided_reply(
    press: &Press,
    user: &str,
    decided: Result<Result<DecisionAccepted, Problem>, Problem>,
) -> Response {
    match decided {
        Ok(Ok(accepted)) => {
            let verb = if press.approve { "Approved" } else { "Denied" };
            let text = match accepted.outcome {
                "accepted" => format!("{verb} by {user} — card {}", press.seq.get()),
                _ => format!(
                    "{} recorded for {user} — card {}; waiting for the other approvers",
                    if press.approve { "Approval" } else { "Denial" },
                    press.seq.get()
                ),
            };
            reply(accepted.outcome, text)
        }
        Ok(Err(problem)) => {
            let code = problem.code.code();
            let text = match problem.code {
                ProblemCode::Decision(countersign_store::DecisionOutcome::StaleTurn) => {
                    "This card is out of date: open the run for its current card.".to_owned()
                }
                other => format!("Not decided: {}", other.title()),
            };
            reply(code, text)
        }
        Err(problem) => problem.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &[u8], ts: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap();
        mac.update(format!("v0:{ts}:").as_bytes());
        mac.update(body);
        format!("v0={}", hex::encode(mac.finalize().into_bytes()))
    }

    fn call(index: usize, tool: &str, preview: CardPreview) -> countersign_core::card::CardCall {
        countersign_core::card::CardCall {
            index: countersign_core::CallIndex::new(index),
            tool: tool.to_owned(),
            arguments: json!({}),
            preview,
            moved: false,
            landed: false,
            alone: false,
            edit: None,
            excluded: false,
        }
    }

    fn shown(lines: &[&str]) -> CardPreview {
        CardPreview::Shown {
            lines: lines.iter().map(|l| (*l).to_owned()).collect(),
            forms: Vec::new(),
            full: Vec::new(),
        }
    }

    #[test]
    fn a_cleared_channel_shows_only_shown_previews_of_its_class_and_below() {
        let card = ApprovalCard {
            suspension_seq: SuspensionSeq::new(1).unwrap(),
            turn_digest: TurnDigest::parse(&"ab".repeat(32)).unwrap(),
            captured_at: String::new(),
            caption: "",
            moved_notice: None,
            calls: vec![
                call(0, "page", shown(&["description: old → new"])),
                call(1, "person", shown(&["email: a@example.org"])),
                call(2, "page", CardPreview::Withheld { notice: "withheld" }),
                call(3, "page", CardPreview::None),
            ],
        };
        let class_of = |tool: &str| match tool {
            "page" => DataClass::EditorContent,
            _ => DataClass::PersonalData,
        };
        let editors = shown_previews(&card, DataClass::EditorContent, class_of);
        assert_eq!(
            editors,
            vec![ShownPreview {
                index: 0,
                tool: "page".into(),
                lines: vec!["description: old → new".into()]
            }]
        );
        assert!(shown_previews(&card, DataClass::Public, class_of).is_empty());
        let people = shown_previews(&card, DataClass::PersonalData, class_of);
        assert_eq!(people.iter().map(|p| p.index).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn a_preview_block_is_literal_and_bounded() {
        let hostile = ShownPreview {
            index: 2,
            tool: "t".into(),
            lines: vec!["<!channel> & <https://evil.example|click> ``` done".into()],
        };
        let text = preview_block(&hostile)["text"]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            !text.contains("<!channel>") && !text.contains("<https"),
            "{text}"
        );
        assert!(text.contains("&lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;"));
        assert_eq!(
            text.matches("```").count(),
            2,
            "only the block's own fences: {text}"
        );

        let long = ShownPreview {
            index: 0,
            tool: "t".into(),
            lines: (0..100).map(|i| format!("line {i}")).collect(),
        };
        let text = preview_block(&long)["text"]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(
            text.contains("line 19\n") && !text.contains("line 20\n"),
            "{text}"
        );
        assert!(text.ends_with("…and 80 more lines on the card"), "{text}");
        let wide = ShownPreview {
            index: 0,
            tool: "t".into(),
            lines: vec!["x".repeat(1_000); 5],
        };
        let text = preview_block(&wide)["text"]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(text.len() < 3_000, "{}", text.len());
        assert!(text.ends_with("…and 3 more lines on the card"), "{text}");
    }

    #[test]
    fn a_signed_request_verifies_and_a_forged_or_replayed_one_does_not() {
        let body = b"payload=%7B%7D";
        let sig = sign(b"secret", "1700000000", body);
        assert_eq!(
            verify(b"secret", Some("1700000000"), Some(&sig), body, 1700000100),
            Ok(())
        );
        assert_eq!(
            verify(b"other", Some("1700000000"), Some(&sig), body, 1700000100),
            Err(Unsigned::Forged)
        );
        assert_eq!(
            verify(
                b"secret",
                Some("1700000000"),
                Some(&sig),
                b"payload=x",
                1700000100
            ),
            Err(Unsigned::Forged)
        );
        assert_eq!(
            verify(b"secret", Some("1700000000"), Some(&sig), body, 1700000301),
            Err(Unsigned::Replayed)
        );
        assert_eq!(
            verify(b"secret", None, Some(&sig), body, 1700000100),
            Err(Unsigned::Missing)
        );
    }
}
