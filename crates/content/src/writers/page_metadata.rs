//! `update_page_metadata`: set descriptive fields of exactly one page.

use async_trait::async_trait;
use countersign_core::preview::quote_excerpt;
use countersign_core::{Effect, ToolOutput, ToolSpec};
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::access::{ungranted_fields, User};
use crate::args::Args;
use crate::datahandler::{DataHandler, Fields};
use crate::records::{Page, PAGE_METADATA_FIELDS};
use crate::refusals::{draft_workspace, named, PAGE_NOT_PERMITTED};
use crate::writer::{writer_spec, Planned, Refusal, Subject, Writer};
use crate::writers::ReadBack;

pub(crate) const NAME: &str = "update_page_metadata";

/// The longest value accepted for a field: one-line fields 255 characters, prose 2000.
fn cap(field: &str) -> usize {
    match field {
        "abstract" | "description" | "keywords" | "og_description" | "twitter_description" => 2000,
        _ => 255,
    }
}

#[derive(Debug, Clone)]
pub(crate) struct UpdatePageMetadata;

#[derive(Debug, Clone)]
pub(crate) struct PageMetadataArgs {
    uid: i64,
    fields: Fields,
}

#[derive(Debug, Clone)]
pub(crate) struct PageMetadataPlan {
    page: Page,
    fields: Fields,
    /// Requested exclude fields the acting user holds no grant for.
    ungranted: Vec<&'static str>,
}

#[async_trait]
impl Writer for UpdatePageMetadata {
    type Args = PageMetadataArgs;
    type Plan = PageMetadataPlan;

    fn spec(&self) -> ToolSpec {
        let mut properties = serde_json::Map::new();
        properties.insert(
            "uid".into(),
            json!({"type": "integer", "minimum": 1, "description": "The page to change."}),
        );
        for field in PAGE_METADATA_FIELDS {
            properties.insert(
                field.into(),
                json!({"type": "string", "maxLength": cap(field)}),
            );
        }
        writer_spec(
            NAME,
            "Set descriptive metadata fields (title, subtitle, nav_title, abstract, description, \
             keywords and the SEO/social titles and descriptions) of exactly one live page. Every \
             call is shown to a human for approval before it runs.",
            Effect::IdempotentWrite,
            json!({
                "type": "object",
                "properties": properties,
                "required": ["uid"],
                "additionalProperties": false,
            }),
        )
    }

    fn parse(&self, value: &Value) -> Result<PageMetadataArgs, String> {
        let mut accepted = vec!["uid"];
        accepted.extend(PAGE_METADATA_FIELDS);
        let args = Args::parse(value, &accepted)?;
        let uid = args.uid("uid")?;
        let mut fields = Fields::new();
        for field in PAGE_METADATA_FIELDS {
            // A page needs a title: an empty one would be dropped by the write path as
            // silently as a missing grant, so it is refused here instead.
            if let Some(v) = args.opt_text(field, cap(field), field == "title")? {
                fields.insert(field, v);
            }
        }
        if fields.is_empty() {
            return Err(format!(
                "No field to set; name at least one of: {}.",
                PAGE_METADATA_FIELDS.join(", ")
            ));
        }
        Ok(PageMetadataArgs { uid, fields })
    }

    fn not_permitted(&self, _args: &PageMetadataArgs) -> &'static str {
        PAGE_NOT_PERMITTED
    }

    async fn subjects(
        &self,
        _conn: &mut PgConnection,
        args: &PageMetadataArgs,
    ) -> Result<Vec<Subject>, sqlx::Error> {
        Ok(vec![Subject::Page(args.uid)])
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &PageMetadataArgs,
    ) -> Result<Planned<PageMetadataPlan>, sqlx::Error> {
        let Some(page) = Page::load(conn, args.uid).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !page.permits(user) {
            return Ok(Err(Refusal::NotPermitted));
        }
        if page.workspace != 0 {
            return Ok(Err(Refusal::invalid(draft_workspace(
                "Page",
                page.uid,
                page.workspace,
            ))));
        }
        let ungranted = ungranted_fields(conn, user, "pages", args.fields.keys().copied()).await?;
        Ok(Ok(PageMetadataPlan {
            page,
            fields: args.fields.clone(),
            ungranted,
        }))
    }

    fn preview(&self, plan: &PageMetadataPlan) -> Vec<String> {
        let mut lines = vec![format!(
            "{} — {} field(s):",
            named("Page", plan.page.uid, &plan.page.title),
            plan.fields.len()
        )];
        for (field, new) in &plan.fields {
            let old = plan.page.field(field).unwrap_or_default();
            if old == new {
                lines.push(format!("{field}: unchanged ({})", quote_excerpt(old)));
            } else if plan.ungranted.contains(field) {
                lines.push(format!(
                    "{field}: {} → {} — will not be stored: the acting user holds no grant for \
                     this field",
                    quote_excerpt(old),
                    quote_excerpt(new)
                ));
            } else {
                lines.push(format!(
                    "{field}: {} → {}",
                    quote_excerpt(old),
                    quote_excerpt(new)
                ));
            }
        }
        lines
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &PageMetadataPlan,
    ) -> Result<ToolOutput, sqlx::Error> {
        let uid = plan.page.uid;
        DataHandler::new(user)
            .update_page(conn, uid, &plan.fields)
            .await?;
        let Some(stored) = Page::load(conn, uid).await? else {
            return Ok(ToolOutput::error(format!(
                "Page [{uid}] could not be read back after the write; treat the write as failed."
            )));
        };
        let mut check = ReadBack::default();
        for (field, value) in &plan.fields {
            check.field(field, stored.field(field) == Some(value.as_str()));
        }
        let success = format!(
            "Page [{uid}] updated; the read-back confirms {}.",
            check.took().join(", ")
        );
        Ok(check.output(
            success,
            &format!("Page [{uid}]"),
            "the acting user may hold no grant for it",
        ))
    }
}
