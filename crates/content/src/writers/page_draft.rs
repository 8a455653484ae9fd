//! `create_page_draft`: create one standard page, hidden, below a page.
//!
//! Always hidden, always a standard page in the default language of the live workspace: what a
//! page routes to, who may see it and when it is published are not a model's to decide.

use async_trait::async_trait;
use countersign_core::preview::quote_excerpt;
use countersign_core::{Effect, PreviewLine, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{Arguments, NonBlank, Text, Uid};
use crate::datahandler::{DataHandler, Fields, NewPage};
use crate::records::{subpages, Named, Page};
use crate::refusals::{named, HIDDEN_LINE, PAGE_NOT_PERMITTED};
use crate::writer::{Planned, Refusal, Row, Writer};
use crate::writers::{text_lines, uids, ReadBack, Slot};

/// The standard page type.
const STANDARD_PAGE: i32 = 1;

#[derive(Debug, Clone)]
pub(crate) struct CreatePageDraft;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageDraftArgs {
    /// The page to create it below.
    parent: Uid,
    title: NonBlank<255>,
    nav_title: Option<Text<255>>,
    /// Place it after this subpage of the parent; omit for first.
    after_page_uid: Option<Uid>,
}

impl Arguments for PageDraftArgs {}

/// The fields of the new page a draft sets.
const DRAFT_FIELDS: [&str; 2] = ["title", "nav_title"];

#[derive(Debug, Clone)]
pub(crate) struct PageDraftPlan {
    parent: Named,
    slot: Slot,
    fields: Fields,
}

#[async_trait]
impl Writer for CreatePageDraft {
    type Args = PageDraftArgs;
    type Plan = PageDraftPlan;

    const NAME: &'static str = "create_page_draft";
    const DESCRIPTION: &'static str =
        "Create one standard page, HIDDEN, in the default language below a parent page, with \
         a title, an optional navigation title and a position among the parent's subpages \
         (after `after_page_uid`, or first when it is not given). A human must unhide it \
         before anyone sees it. Every call is shown to a human for approval before it runs.";
    const EFFECT: Effect = Effect::NonIdempotentWrite;
    const NOT_PERMITTED: &'static str = PAGE_NOT_PERMITTED;

    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &PageDraftArgs,
    ) -> Result<Vec<Row>, sqlx::Error> {
        read_set!(
            conn,
            r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_create_page_draft($1, $2, $3, $4)"#,
            user_name,
            args.parent.get(),
            args.after_page_uid.map(Uid::get),
            &DRAFT_FIELDS.map(str::to_owned)
        )
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &PageDraftArgs,
    ) -> Result<Planned<PageDraftPlan>, sqlx::Error> {
        let Some(parent) = Page::load(conn, args.parent.get()).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        let after = match args.after_page_uid {
            Some(uid) => match Page::load(conn, uid.get()).await? {
                Some(a) => Some(a),
                None => return Ok(Err(Refusal::NotPermitted)),
            },
            None => None,
        };
        if !parent.permits(user)
            || !user.may_use_language(0)
            || after.as_ref().is_some_and(|a| !a.permits(user))
        {
            return Ok(Err(Refusal::NotPermitted));
        }
        if parent.workspace != 0 {
            return Ok(Err(Refusal::draft("Page", parent.uid, parent.workspace)));
        }
        if let Some(default) = parent.l10n_parent {
            return Ok(Err(Refusal::invalid(format!(
                "Page [{}] is a translation; new pages go below its default-language page \
                 [{default}]. Nothing was written.",
                parent.uid
            ))));
        }
        let existing = subpages(conn, parent.uid).await?;
        let after = after.map(|a| a.uid);
        let Some(slot) = Slot::after(existing, after) else {
            return Ok(Err(Refusal::invalid(format!(
                "Page [{}] is not a live subpage of page [{}] in the default language, so \
                 nothing can be placed after it; nothing was written.",
                after.unwrap_or_default(),
                parent.uid
            ))));
        };
        Ok(Ok(PageDraftPlan {
            parent: Named {
                uid: parent.uid,
                label: parent.title,
            },
            slot,
            fields: Fields::from([
                ("title", args.title.as_str().to_owned()),
                (
                    "nav_title",
                    args.nav_title.as_ref().map_or("", Text::as_str).to_owned(),
                ),
            ]),
        }))
    }

    fn preview(&self, plan: &PageDraftPlan) -> Vec<PreviewLine> {
        let text = |f: &str| quote_excerpt(plan.fields.get(f).map_or("", String::as_str));
        text_lines(vec![
            format!(
                "New standard page in the default language under {}",
                named("page", plan.parent.uid, &plan.parent.label)
            ),
            format!("title: {}", text("title")),
            format!("navigation title: {}", text("nav_title")),
            format!("position: {}", plan.slot.place("page")),
            HIDDEN_LINE.to_owned(),
        ])
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &PageDraftPlan,
    ) -> Result<ToolOutput, sqlx::Error> {
        let handler = DataHandler::new(user);
        let uid = handler
            .insert_hidden_page(
                conn,
                &NewPage {
                    pid: plan.parent.uid,
                    sorting: 0,
                    language: 0,
                    l10n_parent: None,
                    doktype: STANDARD_PAGE,
                    fields: &plan.fields,
                },
            )
            .await?;
        let order = plan.slot.order(uid);
        handler.order_subpages(conn, &order).await?;

        let mut check = ReadBack::default();
        match Page::load(conn, uid).await? {
            None => check.field("record", false),
            Some(p) => {
                check.field("hidden", p.hidden);
                check.field(
                    "parent",
                    p.pid == plan.parent.uid && p.language == 0 && p.doktype == STANDARD_PAGE,
                );
                for (field, value) in &plan.fields {
                    check.field(field, p.field(field) == Some(value.as_str()));
                }
            }
        }
        let now = subpages(conn, plan.parent.uid).await?;
        check.field("position", uids(&now) == order);
        let success = format!(
            "Created page [{uid}] under page [{}], position {} — hidden: a human must unhide it \
             before anyone sees it. The read-back confirms it.",
            plan.parent.uid,
            plan.slot.place("page")
        );
        Ok(check.output(
            success,
            &format!("New page [{uid}]"),
            "the acting user may hold no grant for a field",
        ))
    }
}
