//! `create_translation_draft`: copy one default-language page or content element into another
//! language, hidden.
//!
//! The language is an argument here, unlike for the file alternative text, because deciding
//! the language is this tool's whole purpose; it is checked against the user like any record.
//! A record that already has a translation in that language is refused unless the call says
//! `overwrite: true`, and then the preview says in so many words that the existing translation
//! is DISCARDED: replacing someone's translated text is not a detail.

use std::borrow::Cow;

use async_trait::async_trait;
use countersign_core::preview::quote_excerpt;
use countersign_core::{Effect, PreviewLine, ToolOutput};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{choice, integer, Arguments, Flag, Int, Uid};
use crate::datahandler::{DataHandler, Fields, NewElement, NewPage};
use crate::records::{language_title, Element, Named, Page, PAGE_METADATA_FIELDS};
use crate::refusals::{named, ELEMENT_NOT_PERMITTED, HIDDEN_LINE, PAGE_NOT_PERMITTED};
use crate::writer::{Planned, Refusal, Row, Writer};
use crate::writers::{text_lines, ReadBack};

const MAX_LANGUAGE: i64 = 9999;

#[derive(Debug, Clone)]
pub(crate) struct CreateTranslationDraft;

choice! {
    /// What is translated: a page or a content element.
    pub(crate) enum Table {
        Pages = "pages",
        Content = "content",
    }
}

impl Table {
    fn kind(self) -> &'static str {
        match self {
            Table::Pages => "page",
            Table::Content => "content element",
        }
    }

    /// The kind, as a sentence begins with it.
    fn capitalised(self) -> &'static str {
        match self {
            Table::Pages => "Page",
            Table::Content => "Content element",
        }
    }
}

/// The language to translate into: any but the default language 0, which is refused in words
/// of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TargetLanguage(i32);

type LanguageRange = Int<1, MAX_LANGUAGE>;

impl<'de> Deserialize<'de> for TargetLanguage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        if integer(&value) == Some(0) {
            return Err(serde::de::Error::custom(
                "must not be 0: the default language is the original, not a translation.",
            ));
        }
        let language = LanguageRange::try_from(value).map_err(serde::de::Error::custom)?;
        Ok(TargetLanguage(language.get() as i32))
    }
}

impl JsonSchema for TargetLanguage {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "TargetLanguage".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        LanguageRange::json_schema(generator)
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TranslationArgs {
    table: Table,
    /// The default-language page or content element.
    uid: Uid,
    language: TargetLanguage,
    #[schemars(extend("default" = false))]
    overwrite: Option<Flag>,
}

impl TranslationArgs {
    fn uid(&self) -> i64 {
        self.uid.get()
    }

    fn language(&self) -> i32 {
        self.language.0
    }

    fn overwrite(&self) -> bool {
        self.overwrite.is_some_and(Flag::get)
    }
}

impl Arguments for TranslationArgs {}

#[derive(Debug, Clone)]
enum Source {
    Page(Page),
    Element {
        element: Element,
        /// Live references per field, in field order.
        references: Vec<(String, i64)>,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct TranslationPlan {
    table: Table,
    source: Source,
    language: i32,
    language_title: String,
    /// Live translations in the language that the call discards.
    discarded: Vec<Named>,
    fields: Fields,
}

impl Source {
    /// The workspace of the record, and the default-language record it translates, if any.
    fn origin(&self) -> (i32, Option<i64>) {
        match self {
            Source::Page(page) => (page.workspace, page.l10n_parent),
            Source::Element { element, .. } => (element.workspace, element.l10n_parent),
        }
    }
}

impl TranslationPlan {
    fn source_uid(&self) -> i64 {
        match &self.source {
            Source::Page(p) => p.uid,
            Source::Element { element, .. } => element.uid,
        }
    }

    fn language_name(&self) -> String {
        format!("{} (language {})", self.language_title, self.language)
    }
}

/// The record a translation copies, if `user` may translate it.
async fn load_source(
    conn: &mut PgConnection,
    user: &User,
    args: &TranslationArgs,
) -> Result<Planned<Source>, sqlx::Error> {
    Ok(match args.table {
        Table::Pages => match Page::load(conn, args.uid()).await? {
            Some(page) if page.permits(user) => Ok(Source::Page(page)),
            _ => Err(Refusal::NotPermitted),
        },
        Table::Content => match Element::load(conn, args.uid()).await? {
            Some(element) if element.permits(user) => {
                let references = references_per_field(conn, element.uid).await?;
                Ok(Source::Element {
                    element,
                    references,
                })
            }
            _ => Err(Refusal::NotPermitted),
        },
    })
}

/// Why the source record of `args` cannot be translated, if it cannot: it is a draft
/// (`workspace`), or itself a translation (of `translated_from`).
fn refuse_origin(
    args: &TranslationArgs,
    workspace: i32,
    translated_from: Option<i64>,
) -> Option<Refusal> {
    let kind = args.table.kind();
    let capitalised = args.table.capitalised();
    if workspace != 0 {
        return Some(Refusal::draft(capitalised, args.uid(), workspace));
    }
    let default = translated_from?;
    Some(Refusal::invalid(format!(
        "{capitalised} [{}] is itself a translation; translate its default-language \
         {kind} [{default}] instead. Nothing was written.",
        args.uid()
    )))
}

/// The refusal of a call that would discard the `existing` translations in `language_name`
/// without saying `overwrite`.
fn refuse_overwrite(
    args: &TranslationArgs,
    existing: &[Named],
    language_name: &str,
) -> Option<Refusal> {
    if existing.is_empty() || args.overwrite() {
        return None;
    }
    let list: Vec<String> = existing
        .iter()
        .map(|e| named(args.table.kind(), e.uid, &e.label))
        .collect();
    Some(Refusal::invalid(format!(
        "{} [{}] already has a translation in {language_name}: {}. Nothing \
         was written; to discard it and start again from the default language, call \
         again with \"overwrite\": true.",
        args.table.capitalised(),
        args.uid(),
        list.join(", ")
    )))
}

/// The live translations of `source` into `language` a translation would discard, and the
/// fields it copies; refused when an element's page has no translation into it yet.
async fn existing_and_fields(
    conn: &mut PgConnection,
    source: &Source,
    language: i32,
    language_name: &str,
) -> Result<Planned<(Vec<Named>, Fields)>, sqlx::Error> {
    Ok(Ok(match source {
        Source::Page(page) => {
            let fields: Fields = PAGE_METADATA_FIELDS
                .iter()
                .map(|f| (*f, page.field(f).unwrap_or_default().to_owned()))
                .collect();
            (
                existing_page_translations(conn, page.uid, language).await?,
                fields,
            )
        }
        Source::Element { element, .. } => {
            let page_translated = sqlx::query_scalar!(
                r#"SELECT uid FROM content.pages
                       WHERE l10n_parent = $1 AND language = $2 AND workspace = 0 AND NOT deleted
                       ORDER BY uid
                       LIMIT 1"#,
                element.pid,
                language
            )
            .fetch_optional(&mut *conn)
            .await?;
            if page_translated.is_none() {
                return Ok(Err(Refusal::invalid(format!(
                    "Page [{}] has no translation in {language_name} yet; translate the page \
                     first (table \"pages\"). Nothing was written.",
                    element.pid
                ))));
            }
            let fields = Fields::from([
                ("header", element.header.clone()),
                ("bodytext", element.bodytext.clone()),
            ]);
            (
                existing_element_translations(conn, element.uid, language).await?,
                fields,
            )
        }
    }))
}

/// Discards the page translations `discarded`, creates the hidden translation of `page` the
/// plan describes, and reads it back into `check`; returns its uid.
async fn create_page(
    conn: &mut PgConnection,
    handler: &DataHandler<'_>,
    plan: &TranslationPlan,
    page: &Page,
    discarded: &[i64],
    check: &mut ReadBack,
) -> Result<i64, sqlx::Error> {
    if !discarded.is_empty() {
        handler.delete_pages(conn, discarded).await?;
    }
    let uid = handler
        .insert_hidden_page(
            conn,
            &NewPage {
                pid: page.pid,
                sorting: page.sorting,
                language: plan.language,
                l10n_parent: Some(page.uid),
                doktype: page.doktype,
                fields: &plan.fields,
            },
        )
        .await?;
    match Page::load(conn, uid).await? {
        None => check.field("record", false),
        Some(p) => {
            check.field("hidden", p.hidden);
            check.field(
                "language",
                p.language == plan.language && p.l10n_parent == Some(page.uid),
            );
            for (field, value) in &plan.fields {
                check.field(field, p.field(field) == Some(value.as_str()));
            }
        }
    }
    let live = existing_page_translations(conn, page.uid, plan.language).await?;
    check.field(
        "discarded translation",
        live.len() == 1 && live[0].uid == uid,
    );
    Ok(uid)
}

/// Discards the element translations `discarded`, creates the hidden translation of the
/// element (with copies of its file `references`) the plan describes, and reads it back into
/// `check`; returns its uid.
async fn create_element(
    conn: &mut PgConnection,
    handler: &DataHandler<'_>,
    plan: &TranslationPlan,
    (element, references): (&Element, &[(String, i64)]),
    discarded: &[i64],
    check: &mut ReadBack,
) -> Result<i64, sqlx::Error> {
    if !discarded.is_empty() {
        handler.delete_elements(conn, discarded).await?;
    }
    let uid = handler
        .insert_hidden_element(
            conn,
            &NewElement {
                pid: element.pid,
                ctype: &element.ctype,
                colpos: element.colpos,
                sorting: element.sorting,
                language: plan.language,
                l10n_parent: Some(element.uid),
                fields: &plan.fields,
            },
        )
        .await?;
    handler.copy_references(conn, element.uid, uid).await?;
    match Element::load(conn, uid).await? {
        None => check.field("record", false),
        Some(e) => {
            check.field("hidden", e.hidden);
            check.field(
                "language",
                e.language == plan.language && e.l10n_parent == Some(element.uid),
            );
            check.field("type", e.ctype == element.ctype);
            check.field("place", e.pid == element.pid && e.colpos == element.colpos);
            check.field("header", e.header == element.header);
            check.field("bodytext", e.bodytext == element.bodytext);
        }
    }
    check.field(
        "file references",
        references_per_field(conn, uid).await? == references,
    );
    let live = existing_element_translations(conn, element.uid, plan.language).await?;
    check.field(
        "discarded translation",
        live.len() == 1 && live[0].uid == uid,
    );
    Ok(uid)
}

async fn existing_page_translations(
    conn: &mut PgConnection,
    uid: i64,
    language: i32,
) -> Result<Vec<Named>, sqlx::Error> {
    sqlx::query_as!(
        Named,
        r#"SELECT uid, title AS label FROM content.pages
           WHERE l10n_parent = $1 AND language = $2 AND workspace = 0 AND NOT deleted
           ORDER BY uid"#,
        uid,
        language
    )
    .fetch_all(&mut *conn)
    .await
}

async fn existing_element_translations(
    conn: &mut PgConnection,
    uid: i64,
    language: i32,
) -> Result<Vec<Named>, sqlx::Error> {
    sqlx::query_as!(
        Named,
        r#"SELECT uid, header AS label FROM content.elements
           WHERE l10n_parent = $1 AND language = $2 AND workspace = 0 AND NOT deleted
           ORDER BY uid"#,
        uid,
        language
    )
    .fetch_all(&mut *conn)
    .await
}

async fn references_per_field(
    conn: &mut PgConnection,
    element: i64,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"SELECT field, count(*) AS "count!" FROM content.file_references
           WHERE element = $1 AND NOT deleted
           GROUP BY field
           ORDER BY field"#,
        element
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.field, r.count)).collect())
}

#[async_trait]
impl Writer for CreateTranslationDraft {
    type Args = TranslationArgs;
    type Plan = TranslationPlan;

    const NAME: &'static str = "create_translation_draft";
    const DESCRIPTION: &'static str =
        "Create a HIDDEN translation of one default-language page (table \"pages\") or content \
         element (table \"content\") in another language, copied from the default language \
         (an element's file references are copied with it; its page must be translated \
         first). An existing translation in that language is refused unless `overwrite` is \
         true, which DISCARDS it. Every call is shown to a human for approval before it runs.";
    const EFFECT: Effect = Effect::NonIdempotentWrite;
    const NOT_PERMITTED: &'static str = PAGE_NOT_PERMITTED;

    fn not_permitted(&self, args: &TranslationArgs) -> &'static str {
        match args.table {
            Table::Pages => PAGE_NOT_PERMITTED,
            Table::Content => ELEMENT_NOT_PERMITTED,
        }
    }

    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &TranslationArgs,
    ) -> Result<Vec<Row>, sqlx::Error> {
        match args.table {
            Table::Pages => read_set!(
                conn,
                r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_translate_page($1, $2, $3)"#,
                user_name,
                args.uid(),
                args.language()
            ),
            Table::Content => read_set!(
                conn,
                r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_translate_element($1, $2, $3)"#,
                user_name,
                args.uid(),
                args.language()
            ),
        }
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &TranslationArgs,
    ) -> Result<Planned<TranslationPlan>, sqlx::Error> {
        // The record checks first, for both tables: the source record, then the language.
        let source = match load_source(conn, user, args).await? {
            Ok(source) => source,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let (workspace, translated_from) = source.origin();
        if !user.may_use_language(args.language()) {
            return Ok(Err(Refusal::NotPermitted));
        }
        if let Some(refusal) = refuse_origin(args, workspace, translated_from) {
            return Ok(Err(refusal));
        }
        let Some(title) = language_title(conn, args.language()).await? else {
            return Ok(Err(Refusal::invalid(format!(
                "Language {} is not configured on this site; nothing was written.",
                args.language()
            ))));
        };
        let language_name = format!("{title} (language {})", args.language());

        let (existing, fields) =
            match existing_and_fields(conn, &source, args.language(), &language_name).await? {
                Ok(found) => found,
                Err(refusal) => return Ok(Err(refusal)),
            };
        if let Some(refusal) = refuse_overwrite(args, &existing, &language_name) {
            return Ok(Err(refusal));
        }

        Ok(Ok(TranslationPlan {
            table: args.table,
            source,
            language: args.language(),
            language_title: title,
            discarded: existing,
            fields,
        }))
    }

    fn preview(&self, plan: &TranslationPlan) -> Vec<PreviewLine> {
        let kind = plan.table.kind();
        let mut lines = Vec::new();
        match &plan.source {
            Source::Page(page) => {
                lines.push(format!(
                    "New translation of {} into {}, copied from the default language:",
                    named("page", page.uid, &page.title),
                    plan.language_name()
                ));
                for field in PAGE_METADATA_FIELDS {
                    let value = plan.fields.get(field).map_or("", String::as_str);
                    if field == "title" || !value.trim().is_empty() {
                        lines.push(format!("{field}: {}", quote_excerpt(value)));
                    }
                }
            }
            Source::Element {
                element,
                references,
            } => {
                lines.push(format!(
                    "New translation of {} on page [{}] into {}, copied from the default language:",
                    named("content element", element.uid, &element.header),
                    element.pid,
                    plan.language_name()
                ));
                lines.push(format!("type: {}", element.ctype));
                lines.push(format!("header: {}", quote_excerpt(&element.header)));
                lines.push(format!("bodytext: {}", quote_excerpt(&element.bodytext)));
                if !references.is_empty() {
                    let per_field: Vec<String> = references
                        .iter()
                        .map(|(field, n)| format!("{n} in {field}"))
                        .collect();
                    lines.push(format!("file references copied: {}", per_field.join(", ")));
                }
            }
        }
        for old in &plan.discarded {
            lines.push(format!(
                "DISCARDS the existing translation {}: it is marked deleted and replaced by this \
                 copy",
                named(kind, old.uid, &old.label)
            ));
        }
        lines.push(HIDDEN_LINE.to_owned());
        text_lines(lines)
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &TranslationPlan,
    ) -> Result<ToolOutput, sqlx::Error> {
        let handler = DataHandler::new(user);
        let discarded: Vec<i64> = plan.discarded.iter().map(|d| d.uid).collect();
        let source_uid = plan.source_uid();
        let mut check = ReadBack::default();
        let created = match &plan.source {
            Source::Page(page) => {
                create_page(conn, &handler, plan, page, &discarded, &mut check).await?
            }
            Source::Element {
                element,
                references,
            } => {
                let copied = (element, references.as_slice());
                create_element(conn, &handler, plan, copied, &discarded, &mut check).await?
            }
        };
        let kind = plan.table.kind();
        let discarded_text = if discarded.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = discarded.iter().map(|d| format!("[{d}]")).collect();
            format!(
                " Discarded the previous translation {kind} {}.",
                list.join(", ")
            )
        };
        let success = format!(
            "Created translation {kind} [{created}] of {kind} [{source_uid}] in {} — hidden: a \
             human must unhide it before anyone sees it.{discarded_text} The read-back confirms it.",
            plan.language_name()
        );
        Ok(check.output(
            success,
            &format!("Translation {kind} [{created}]"),
            "the acting user may hold no grant for a field",
        ))
    }
}
