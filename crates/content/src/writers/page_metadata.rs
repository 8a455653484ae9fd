//! `update_page_metadata`: set descriptive fields of exactly one page.
//!
//! What it may write is its allow-list ([`PAGE_METADATA_FIELDS`]) intersected with the columns
//! `content.pages` has in the live database ([`LiveColumns`]): a field a migration dropped or
//! renamed is refused by name, never written blindly. The columns are read when the writer is
//! first used and again after the database reports a column missing (a migration ran since).

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use countersign_core::{Effect, PreviewLine, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{ArgResult, Arguments, NonBlank, Text, Uid};
use crate::datahandler::{DataHandler, Fields};
use crate::records::{Page, PAGE_METADATA_FIELDS};
use crate::refusals::{named, PAGE_NOT_PERMITTED};
use crate::writer::{Planned, Refusal, Row, Writer};
use crate::writers::{change_line, ReadBack};

#[derive(Debug, Clone, Default)]
pub(crate) struct UpdatePageMetadata {
    schema: Arc<LiveColumns>,
}

/// The columns of `content.pages` as the database has them, read once and again after a
/// statement found one missing.
#[derive(Debug, Default)]
struct LiveColumns(RwLock<Option<Arc<BTreeSet<String>>>>);

/// PostgreSQL's `undefined_column`: a statement named a column the table no longer has.
const UNDEFINED_COLUMN: &str = "42703";

impl LiveColumns {
    async fn get(&self, conn: &mut PgConnection) -> Result<Arc<BTreeSet<String>>, sqlx::Error> {
        if let Some(columns) = self.0.read().unwrap_or_else(|p| p.into_inner()).clone() {
            return Ok(columns);
        }
        let names = sqlx::query_scalar!(
            r#"SELECT attname::text AS "column!" FROM pg_attribute
               WHERE attrelid = 'content.pages'::regclass AND attnum > 0 AND NOT attisdropped"#
        )
        .fetch_all(conn)
        .await?;
        let columns = Arc::new(names.into_iter().collect::<BTreeSet<String>>());
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&columns));
        Ok(columns)
    }

    /// Reads the columns again at the next use when `result` says one is missing.
    fn check<T>(&self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        if let Err(sqlx::Error::Database(e)) = &result {
            if e.code().as_deref() == Some(UNDEFINED_COLUMN) {
                tracing::warn!(
                    "content.pages lacks a column a statement named; its columns are read again"
                );
                *self.0.write().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
        result
    }
}

/// The refusal of a call that sets `field`, which the live schema does not have.
fn not_in_schema(field: &str) -> Refusal {
    Refusal::invalid(format!(
        "Field {field} is not a column of this installation's pages; nothing was changed."
    ))
}

/// One-line fields take at most 255 characters, prose 2000. The fields are
/// [`PAGE_METADATA_FIELDS`], in its order.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageMetadataArgs {
    /// The page to change.
    uid: Uid,
    // A page needs a title: an empty one would be dropped by the write path as silently as a
    // missing grant, so it is refused up front instead.
    title: Option<NonBlank<255>>,
    subtitle: Option<Text<255>>,
    nav_title: Option<Text<255>>,
    r#abstract: Option<Text<2000>>,
    description: Option<Text<2000>>,
    keywords: Option<Text<2000>>,
    seo_title: Option<Text<255>>,
    og_title: Option<Text<255>>,
    og_description: Option<Text<2000>>,
    twitter_title: Option<Text<255>>,
    twitter_description: Option<Text<2000>>,
}

impl PageMetadataArgs {
    /// The fields the call sets, by name.
    fn fields(&self) -> Fields {
        let given = [
            ("title", self.title.as_ref().map(NonBlank::as_str)),
            ("subtitle", self.subtitle.as_ref().map(Text::as_str)),
            ("nav_title", self.nav_title.as_ref().map(Text::as_str)),
            ("abstract", self.r#abstract.as_ref().map(Text::as_str)),
            ("description", self.description.as_ref().map(Text::as_str)),
            ("keywords", self.keywords.as_ref().map(Text::as_str)),
            ("seo_title", self.seo_title.as_ref().map(Text::as_str)),
            ("og_title", self.og_title.as_ref().map(Text::as_str)),
            (
                "og_description",
                self.og_description.as_ref().map(Text::as_str),
            ),
            (
                "twitter_title",
                self.twitter_title.as_ref().map(Text::as_str),
            ),
            (
                "twitter_description",
                self.twitter_description.as_ref().map(Text::as_str),
            ),
        ];
        given
            .into_iter()
            .filter_map(|(field, value)| Some((field, value?.to_owned())))
            .collect()
    }
}

impl Arguments for PageMetadataArgs {
    fn check(&self) -> ArgResult<()> {
        if self.fields().is_empty() {
            return Err(format!(
                "No field to set; name at least one of: {}.",
                PAGE_METADATA_FIELDS.join(", ")
            ));
        }
        Ok(())
    }
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

    const NAME: &'static str = "update_page_metadata";
    const DESCRIPTION: &'static str =
        "Set descriptive metadata fields (title, subtitle, nav_title, abstract, description, \
         keywords and the SEO/social titles and descriptions) of exactly one live page. Every \
         call is shown to a human for approval before it runs.";
    const EFFECT: Effect = Effect::IdempotentWrite;
    const NOT_PERMITTED: &'static str = PAGE_NOT_PERMITTED;
    const PLAN_IS_ONE_STATEMENT: bool = true;

    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &PageMetadataArgs,
    ) -> Result<Vec<Row>, sqlx::Error> {
        let fields: Vec<String> = args.fields().keys().map(|f| (*f).to_owned()).collect();
        read_set!(
            conn,
            r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_update_page_metadata($1, $2, $3)"#,
            user_name,
            args.uid.get(),
            &fields
        )
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &PageMetadataArgs,
    ) -> Result<Planned<PageMetadataPlan>, sqlx::Error> {
        let fields = args.fields();
        let live = self.schema.get(conn).await?;
        if let Some(missing) = fields.keys().find(|f| !live.contains(**f)) {
            return Ok(Err(not_in_schema(missing)));
        }
        let Some(page) = self.schema.check(Page::load(conn, args.uid.get()).await)? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !page.permits(user) {
            return Ok(Err(Refusal::NotPermitted));
        }
        if page.workspace != 0 {
            return Ok(Err(Refusal::draft("Page", page.uid, page.workspace)));
        }
        let ungranted = user.ungranted_fields("pages", fields.keys().copied());
        Ok(Ok(PageMetadataPlan {
            page,
            fields,
            ungranted,
        }))
    }

    fn preview(&self, plan: &PageMetadataPlan) -> Vec<PreviewLine> {
        let mut lines = vec![PreviewLine::from(format!(
            "{} — {} field(s):",
            named("Page", plan.page.uid, &plan.page.title),
            plan.fields.len()
        ))];
        for (field, new) in &plan.fields {
            let old = plan.page.field(field).unwrap_or_default();
            lines.push(change_line(field, old, new, plan.ungranted.contains(field)));
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
        let written = DataHandler::new(user)
            .update_page(conn, uid, &plan.fields)
            .await;
        let Some(stored) = self.schema.check(written)? else {
            return Ok(ToolOutput::error(format!(
                "Page [{uid}] could not be read back after the write; treat the write as failed."
            )));
        };
        let mut check = ReadBack::default();
        for (field, value) in &plan.fields {
            let took =
                stored.get(*field).and_then(serde_json::Value::as_str) == Some(value.as_str());
            check.field(field, took);
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use super::*;
    use crate::args::{parameters, parse};

    #[test]
    fn the_arguments_are_the_uid_and_the_page_metadata_fields_and_each_lands_under_its_name() {
        let mut call: Map<String, Value> = PAGE_METADATA_FIELDS
            .iter()
            .map(|f| (f.to_string(), json!(f)))
            .collect();
        call.insert("uid".into(), json!(12));
        let args = parse::<PageMetadataArgs>(&Value::Object(call)).expect("every field parses");
        let fields = args.fields();
        assert_eq!(fields.len(), PAGE_METADATA_FIELDS.len());
        let schema = parameters::<PageMetadataArgs>();
        assert_eq!(
            schema["properties"].as_object().map(Map::len),
            Some(PAGE_METADATA_FIELDS.len() + 1)
        );
        for (field, value) in fields {
            assert_eq!(
                field, value,
                "the value given for {field} lands under {value}"
            );
        }
    }
}
