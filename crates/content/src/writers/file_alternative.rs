//! `set_file_alternative_text`: set the alternative text of one file, in the default language.
//!
//! The default language only, and no language argument: the readers of file metadata address
//! the default-language row, and a writer that could land elsewhere would write what the model
//! cannot read back and the card's "before" could not be trusted to describe. The default
//! language is still checked against the user. The tool never creates a metadata record: a
//! record nobody reviewed is not an edit.

use async_trait::async_trait;
use countersign_core::{Effect, PreviewLine, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{Arguments, Text, Uid};
use crate::datahandler::{DataHandler, Fields};
use crate::records::{File, Metadata};
use crate::refusals::{named, ASSET_NOT_PERMITTED};
use crate::writer::{Planned, Refusal, Row, Writer};
use crate::writers::{change_line, ReadBack};
use countersign_core::preview::quote_excerpt;

#[derive(Debug, Clone)]
pub(crate) struct SetFileAlternativeText;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AlternativeArgs {
    /// The file.
    uid: Uid,
    // Required, and may be empty: clearing an optional field is a write like any other, and
    // the read-back verifies it.
    alternative: Text<1000>,
}

impl Arguments for AlternativeArgs {}

#[derive(Debug, Clone)]
pub(crate) struct AlternativePlan {
    file: File,
    metadata: Metadata,
    alternative: String,
    granted: bool,
}

#[async_trait]
impl Writer for SetFileAlternativeText {
    type Args = AlternativeArgs;
    type Plan = AlternativePlan;

    const NAME: &'static str = "set_file_alternative_text";
    const DESCRIPTION: &'static str =
        "Set the alternative text of one file's metadata in the default language. An empty \
         string clears it. Files without a metadata record are refused. Every call is shown \
         to a human for approval before it runs.";
    const EFFECT: Effect = Effect::IdempotentWrite;
    const NOT_PERMITTED: &'static str = ASSET_NOT_PERMITTED;

    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &AlternativeArgs,
    ) -> Result<Vec<Row>, sqlx::Error> {
        read_set!(
            conn,
            r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_set_file_alternative_text($1, $2)"#,
            user_name,
            args.uid.get()
        )
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &AlternativeArgs,
    ) -> Result<Planned<AlternativePlan>, sqlx::Error> {
        let Some(file) = File::load(conn, args.uid.get()).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !file.permits(user) || !user.may_use_language(0) {
            return Ok(Err(Refusal::NotPermitted));
        }
        let Some(metadata) = Metadata::load_default(conn, file.uid).await? else {
            return Ok(Err(Refusal::invalid(format!(
                "{} has no metadata record in the default language of the live workspace; this \
                 tool never creates one, so nothing was written.",
                named("File", file.uid, &file.name)
            ))));
        };
        let granted = user
            .ungranted_fields("file_metadata", ["alternative"])
            .is_empty();
        Ok(Ok(AlternativePlan {
            file,
            metadata,
            alternative: args.alternative.as_str().to_owned(),
            granted,
        }))
    }

    fn preview(&self, plan: &AlternativePlan) -> Vec<PreviewLine> {
        vec![
            PreviewLine::from(format!(
                "{} — alternative text (default language):",
                named("File", plan.file.uid, &plan.file.name)
            )),
            change_line(
                "alternative",
                &plan.metadata.alternative,
                &plan.alternative,
                !plan.granted,
            ),
        ]
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &AlternativePlan,
    ) -> Result<ToolOutput, sqlx::Error> {
        let fields = Fields::from([("alternative", plan.alternative.clone())]);
        DataHandler::new(user)
            .update_file_metadata(conn, plan.metadata.uid, &fields)
            .await?;
        let stored = Metadata::load_default(conn, plan.file.uid).await?;
        let mut check = ReadBack::default();
        check.field(
            "alternative",
            stored.is_some_and(|m| m.uid == plan.metadata.uid && m.alternative == plan.alternative),
        );
        let subject = format!("The alternative text of file [{}]", plan.file.uid);
        Ok(check.output(
            format!(
                "{subject} (default language) is now {}; the read-back confirms it.",
                quote_excerpt(&plan.alternative)
            ),
            &subject,
            "the acting user may hold no grant for it",
        ))
    }
}
