//! `attach_file_to_content_element`: append one file reference to a content element's field.
//!
//! A RELATIVE write: how many references the field holds, and so where the new one lands, is
//! an operand of the write, and the preview says so (`2 reference(s) → 3, appended last`). The
//! element row is locked before the count is read, so two appends cannot both land third.

use async_trait::async_trait;
use countersign_core::preview::quote_excerpt;
use countersign_core::{Effect, LineForm, PreviewLine, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{choice, Arguments, Choice, Text, Uid};
use crate::datahandler::{DataHandler, Fields, NewReference};
use crate::records::{allowed_extensions, referenced_files, Element, File};
use crate::refusals::{named, ELEMENT_OR_FILE_NOT_PERMITTED};
use crate::writer::{Planned, Refusal, Row, Writer};
use crate::writers::ReadBack;

choice! {
    /// The reference fields of a content element, as [`crate::REFERENCE_FIELDS`] lists them.
    pub(crate) enum ReferenceField {
        Image = "image",
        Assets = "assets",
        Media = "media",
    }
}

const DEFAULT_FIELD: ReferenceField = ReferenceField::Image;
/// The reference's texts, in the order a preview shows them.
const TEXTS: [&str; 3] = ["title", "alternative", "description"];

#[derive(Debug, Clone)]
pub(crate) struct AttachFile;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttachArgs {
    /// The content element.
    content_element: Uid,
    /// The file to reference.
    file: Uid,
    #[schemars(extend("default" = DEFAULT_FIELD.as_str()))]
    field: Option<ReferenceField>,
    title: Option<Text<255>>,
    alternative: Option<Text<1000>>,
    description: Option<Text<2000>>,
}

impl AttachArgs {
    fn field(&self) -> &'static str {
        self.field.unwrap_or(DEFAULT_FIELD).as_str()
    }

    /// The reference's texts the call sets.
    fn texts(&self) -> Fields {
        let given = [
            ("title", self.title.as_ref().map(Text::as_str)),
            ("alternative", self.alternative.as_ref().map(Text::as_str)),
            ("description", self.description.as_ref().map(Text::as_str)),
        ];
        given
            .into_iter()
            .filter_map(|(name, value)| Some((name, value?.to_owned())))
            .collect()
    }
}

impl Arguments for AttachArgs {}

#[derive(Debug, Clone)]
pub(crate) struct AttachPlan {
    element: Element,
    file: File,
    field: &'static str,
    texts: Fields,
    /// The files the field refers to now, in order.
    referenced: Vec<String>,
}

#[async_trait]
impl Writer for AttachFile {
    type Args = AttachArgs;
    type Plan = AttachPlan;

    const NAME: &'static str = "attach_file_to_content_element";
    const DESCRIPTION: &'static str =
        "Append a reference to one file at the end of a content element's image, assets or \
         media field (default image), with optional title, alternative text and description. \
         The file's extension must be one the field accepts. Every call is shown to a human \
         for approval before it runs.";
    const EFFECT: Effect = Effect::NonIdempotentWrite;
    const NOT_PERMITTED: &'static str = ELEMENT_OR_FILE_NOT_PERMITTED;

    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &AttachArgs,
    ) -> Result<Vec<Row>, sqlx::Error> {
        let texts: Vec<String> = args.texts().keys().map(|f| (*f).to_owned()).collect();
        read_set!(
            conn,
            r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_attach_file_to_content_element($1, $2, $3, $4, $5)"#,
            user_name,
            args.content_element.get(),
            args.file.get(),
            args.field(),
            &texts
        )
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &AttachArgs,
    ) -> Result<Planned<AttachPlan>, sqlx::Error> {
        let element = Element::load(conn, args.content_element.get()).await?;
        let file = File::load(conn, args.file.get()).await?;
        let (Some(element), Some(file)) = (element, file) else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !element.permits(user) || !file.permits(user) {
            return Ok(Err(Refusal::NotPermitted));
        }
        if element.workspace != 0 {
            return Ok(Err(Refusal::draft(
                "Content element",
                element.uid,
                element.workspace,
            )));
        }
        let field = args.field();
        let allowed = allowed_extensions(conn, field).await?;
        if !allowed.contains(&file.extension) {
            return Ok(Err(Refusal::invalid(format!(
                "{} has the extension \"{}\", which field {} does not accept (it accepts: {}); \
                 nothing was written.",
                named("File", file.uid, &file.name),
                file.extension,
                field,
                allowed.join(", ")
            ))));
        }
        let referenced = referenced_files(conn, element.uid, field).await?;
        Ok(Ok(AttachPlan {
            element,
            file,
            field,
            texts: args.texts(),
            referenced,
        }))
    }

    fn preview(&self, plan: &AttachPlan) -> Vec<PreviewLine> {
        let count = plan.referenced.len();
        let new = format!("[{}] {}", plan.file.uid, plan.file.name);
        let mut items = plan.referenced.clone();
        items.push(new);
        let mut lines = vec![
            PreviewLine::from(format!(
                "{} on page [{}]",
                named("Content element", plan.element.uid, &plan.element.header),
                plan.element.pid
            )),
            PreviewLine::with_form(
                format!(
                    "field {}: {count} reference(s) → {}, appended last",
                    plan.field,
                    count + 1
                ),
                LineForm::List {
                    items,
                    added: count,
                },
            ),
            PreviewLine::from(format!(
                "{} ({})",
                named("file", plan.file.uid, &plan.file.name),
                plan.file.identifier
            )),
        ];
        for name in TEXTS {
            if let Some(value) = plan.texts.get(name) {
                lines.push(PreviewLine::from(format!(
                    "{name}: {}",
                    quote_excerpt(value)
                )));
            }
        }
        lines
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &AttachPlan,
    ) -> Result<ToolOutput, sqlx::Error> {
        let element = plan.element.uid;
        let sorting = sqlx::query_scalar!(
            r#"SELECT coalesce(max(sorting), 0) + 1 AS "next!"
               FROM content.file_references
               WHERE element = $1 AND field = $2"#,
            element,
            plan.field
        )
        .fetch_one(&mut *conn)
        .await?;
        let reference = DataHandler::new(user)
            .insert_reference(
                conn,
                &NewReference {
                    element,
                    field: plan.field,
                    file: plan.file.uid,
                    sorting,
                    fields: &plan.texts,
                },
            )
            .await?;

        let (check, total) = plan.read_back(conn, reference).await?;
        let success = format!(
            "Attached file [{}] {} to field {} of content element [{element}] as reference \
             [{reference}], last of {total}; the read-back confirms it.",
            plan.file.uid,
            quote_excerpt(&plan.file.name),
            plan.field,
        );
        Ok(check.output(
            success,
            &format!("Reference [{reference}] of content element [{element}]"),
            "the acting user may hold no grant for a text field",
        ))
    }
}

impl AttachPlan {
    /// Reads the new reference back: which of the values this plan asked for it holds, and
    /// how many references its field now has.
    async fn read_back(
        &self,
        conn: &mut PgConnection,
        reference: i64,
    ) -> Result<(ReadBack, i64), sqlx::Error> {
        let stored = sqlx::query!(
            r#"SELECT r.element, r.field, r.file, r.title, r.alternative, r.description, r.deleted,
                      (SELECT count(*) FROM content.file_references o
                        WHERE o.element = r.element AND o.field = r.field AND NOT o.deleted)
                          AS "total!",
                      (SELECT count(*) FROM content.file_references o
                        WHERE o.element = r.element AND o.field = r.field AND NOT o.deleted
                          AND (o.sorting, o.uid) > (r.sorting, r.uid)) AS "after!"
               FROM content.file_references r
               WHERE r.uid = $1"#,
            reference
        )
        .fetch_optional(&mut *conn)
        .await?;
        let mut check = ReadBack::default();
        match &stored {
            None => check.field("reference", false),
            Some(r) => {
                check.field(
                    "reference",
                    r.element == self.element.uid
                        && r.field == self.field
                        && r.file == self.file.uid,
                );
                check.field("position", !r.deleted && r.after == 0);
                for (name, value) in &self.texts {
                    let got = match *name {
                        "title" => &r.title,
                        "alternative" => &r.alternative,
                        _ => &r.description,
                    };
                    check.field(name, got == value);
                }
            }
        }
        let total = stored.as_ref().map_or(0, |r| r.total);
        Ok((check, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::REFERENCE_FIELDS;

    #[test]
    fn the_field_argument_offers_the_reference_fields() {
        let words: Vec<&str> = ReferenceField::CHOICES.iter().map(|(w, _)| *w).collect();
        assert_eq!(words, REFERENCE_FIELDS);
    }
}
