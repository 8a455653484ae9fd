//! `create_content_element_draft`: create one content element, hidden, on a page.
//!
//! Always hidden: the agent drafts, a human publishes. The element is created in the default
//! language of the live workspace; translations are made with `create_translation_draft`.

use async_trait::async_trait;
use countersign_core::preview::quote_excerpt;
use countersign_core::{Effect, PreviewLine, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{choice, Arguments, Choice, Int, NonBlank, Text, Uid};
use crate::datahandler::{DataHandler, Fields, NewElement};
use crate::records::{column, Element, Named, Page};
use crate::refusals::{named, HIDDEN_LINE, PAGE_NOT_PERMITTED};
use crate::writer::{Planned, Refusal, Row, Writer};
use crate::writers::move_element::{check_content_page, check_neighbour, Column};
use crate::writers::{text_lines, uids, ReadBack, Slot};

choice! {
    /// The content types an agent may create: text and media, nothing that embeds code or forms.
    pub(crate) enum ContentType {
        Text = "text",
        Textpic = "textpic",
        Textmedia = "textmedia",
        Header = "header",
        Bullets = "bullets",
    }
}

const DEFAULT_TYPE: ContentType = ContentType::Text;
const DEFAULT_COLUMN: i64 = 0;

#[derive(Debug, Clone)]
pub(crate) struct CreateElementDraft;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ElementDraftArgs {
    /// The page to create it on.
    page: Uid,
    #[serde(rename = "type")]
    #[schemars(extend("default" = DEFAULT_TYPE.as_str()))]
    ctype: Option<ContentType>,
    header: NonBlank<255>,
    bodytext: Option<Text<20_000>>,
    #[schemars(extend("default" = DEFAULT_COLUMN))]
    column: Option<Column>,
    /// Place it after this element of the column; omit for the top.
    after_content_uid: Option<Uid>,
}

impl ElementDraftArgs {
    fn column(&self) -> i32 {
        self.column.map_or(DEFAULT_COLUMN, Int::get) as i32
    }
}

impl Arguments for ElementDraftArgs {}

/// The fields of the new element a draft sets.
const DRAFT_FIELDS: [&str; 2] = ["header", "bodytext"];

#[derive(Debug, Clone)]
pub(crate) struct ElementDraftPlan {
    page: Named,
    ctype: &'static str,
    column: i32,
    slot: Slot,
    fields: Fields,
}

#[async_trait]
impl Writer for CreateElementDraft {
    type Args = ElementDraftArgs;
    type Plan = ElementDraftPlan;

    const NAME: &'static str = "create_content_element_draft";
    const DESCRIPTION: &'static str =
        "Create one content element, HIDDEN, on a page in the default language: a type, a \
         header, an optional body text, a column (default 0) and a position (after \
         `after_content_uid`, or at the top of the column). A human must unhide it before \
         anyone sees it. Every call is shown to a human for approval before it runs.";
    const EFFECT: Effect = Effect::NonIdempotentWrite;
    const NOT_PERMITTED: &'static str = PAGE_NOT_PERMITTED;

    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &ElementDraftArgs,
    ) -> Result<Vec<Row>, sqlx::Error> {
        read_set!(
            conn,
            r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_create_content_element_draft($1, $2, $3, $4, $5)"#,
            user_name,
            args.page.get(),
            args.column(),
            args.after_content_uid.map(Uid::get),
            &DRAFT_FIELDS.map(str::to_owned)
        )
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &ElementDraftArgs,
    ) -> Result<Planned<ElementDraftPlan>, sqlx::Error> {
        let Some(page) = Page::load(conn, args.page.get()).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        let after = match args.after_content_uid {
            Some(uid) => match Element::load(conn, uid.get()).await? {
                Some(a) => Some(a),
                None => return Ok(Err(Refusal::NotPermitted)),
            },
            None => None,
        };
        if !page.permits(user)
            || !user.may_use_language(0)
            || after.as_ref().is_some_and(|a| !a.permits(user))
        {
            return Ok(Err(Refusal::NotPermitted));
        }
        if let Some(refusal) = check_content_page(&page) {
            return Ok(Err(refusal));
        }
        if let Some(refusal) = after
            .as_ref()
            .and_then(|a| check_neighbour(a, page.uid, args.column(), None))
        {
            return Ok(Err(refusal));
        }
        let existing = column(conn, page.uid, args.column()).await?;
        let Some(slot) = Slot::after(existing, after.map(|a| a.uid)) else {
            return Ok(Err(Refusal::NotPermitted));
        };
        Ok(Ok(ElementDraftPlan {
            page: Named {
                uid: page.uid,
                label: page.title,
            },
            ctype: args.ctype.unwrap_or(DEFAULT_TYPE).as_str(),
            column: args.column(),
            slot,
            fields: Fields::from([
                ("header", args.header.as_str().to_owned()),
                (
                    "bodytext",
                    args.bodytext.as_ref().map_or("", Text::as_str).to_owned(),
                ),
            ]),
        }))
    }

    fn preview(&self, plan: &ElementDraftPlan) -> Vec<PreviewLine> {
        let text = |f: &str| quote_excerpt(plan.fields.get(f).map_or("", String::as_str));
        text_lines(vec![
            format!(
                "New content element on {}",
                named("page", plan.page.uid, &plan.page.label)
            ),
            format!("type: {}", plan.ctype),
            format!("header: {}", text("header")),
            format!("bodytext: {}", text("bodytext")),
            format!(
                "position: column {}, {}",
                plan.column,
                plan.slot.place("content element")
            ),
            HIDDEN_LINE.to_owned(),
        ])
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &ElementDraftPlan,
    ) -> Result<ToolOutput, sqlx::Error> {
        let handler = DataHandler::new(user);
        let uid = handler
            .insert_hidden_element(
                conn,
                &NewElement {
                    pid: plan.page.uid,
                    ctype: plan.ctype,
                    colpos: plan.column,
                    sorting: 0,
                    language: 0,
                    l10n_parent: None,
                    fields: &plan.fields,
                },
            )
            .await?;
        let order = plan.slot.order(uid);
        handler.order_column(conn, &order).await?;

        let mut check = ReadBack::default();
        match Element::load(conn, uid).await? {
            None => check.field("record", false),
            Some(e) => {
                check.field("hidden", e.hidden);
                check.field("type", e.ctype == plan.ctype);
                check.field(
                    "page and column",
                    e.pid == plan.page.uid && e.colpos == plan.column && e.language == 0,
                );
                check.field("header", Some(&e.header) == plan.fields.get("header"));
                check.field("bodytext", Some(&e.bodytext) == plan.fields.get("bodytext"));
            }
        }
        let now = column(conn, plan.page.uid, plan.column).await?;
        check.field("position", uids(&now) == order);
        let success = format!(
            "Created content element [{uid}] on page [{}], column {}, position {} — hidden: a human must \
             unhide it before anyone sees it. The read-back confirms it.",
            plan.page.uid,
            plan.column,
            plan.slot.place("content element")
        );
        Ok(check.output(
            success,
            &format!("New content element [{uid}]"),
            "the acting user may hold no grant for a field",
        ))
    }
}
