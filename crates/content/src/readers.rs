//! The five readers. Read-only, in one snapshot, as the explicit acting user; each shares its
//! neutral refusal string with the writers of the same records, and the lists leave out what
//! the user may not see rather than refusing.

use std::fmt;

use async_trait::async_trait;
use countersign_core::{Effect, ExecContext, Tool, ToolError, ToolOutput, ToolSpec};
use countersign_store::Store;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{self, ArgResult, Arguments, Int, NonBlank, Uid};
use crate::records::{File, Metadata, Page, PAGE_METADATA_FIELDS};
use crate::refusals::{ASSET_NOT_PERMITTED, ELEMENT_NOT_PERMITTED, PAGE_NOT_PERMITTED};
use crate::writer::{database_error, Planned, ReadScope, Refusal};

/// At most this many rows are considered by a search before the permission filter.
const SEARCH_SCAN: i64 = 1000;
const SEARCH_QUERY_CAP: usize = 200;
const MAX_LIMIT: i64 = 50;
const DEFAULT_LIMIT: i64 = 20;

/// A page of results: at most 50, by default 20.
type Limit = Int<1, MAX_LIMIT>;

/// One reading tool's decisions.
#[async_trait]
pub(crate) trait Reader: Send + Sync + 'static {
    /// The arguments, parsed by [`args::parse`] before anything is read; the spec's
    /// `parameters` are their derived schema.
    type Args: Arguments;

    const NAME: &'static str;
    /// What the model is told the tool does.
    const DESCRIPTION: &'static str;
    const GROUP: &'static str = "content";
    const REQUIRES_ADMIN: bool = false;
    /// The neutral refusal string, shared with the writers of the same records.
    const NOT_PERMITTED: &'static str;
    /// Whether `read` reads with exactly one statement, whatever the arguments and the records:
    /// it then needs no snapshot transaction around it ([`ReadScope`]). A reader that may take a
    /// second statement leaves this `false`.
    const ONE_STATEMENT: bool = false;

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Self::Args,
    ) -> Result<Planned<Value>, sqlx::Error>;
}

/// A [`Reader`] as a [`Tool`].
pub(crate) struct ReaderTool<R> {
    reader: R,
    spec: ToolSpec,
    store: Store,
}

impl<R: Reader> ReaderTool<R> {
    pub(crate) fn new(reader: R, store: Store) -> Self {
        let spec = ToolSpec {
            name: R::NAME.to_owned(),
            description: R::DESCRIPTION.to_owned(),
            parameters: args::parameters::<R::Args>(),
            group: R::GROUP.to_owned(),
            data_class: crate::data_class_of(R::GROUP),
            effect: Effect::ReadOnly,
            enabled_by_default: true,
            requires_admin: R::REQUIRES_ADMIN,
        };
        ReaderTool {
            reader,
            spec,
            store,
        }
    }
}

impl<R> fmt::Debug for ReaderTool<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReaderTool")
            .field("name", &self.spec.name)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<R: Reader> Tool for ReaderTool<R> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, ctx: &ExecContext, args: &Value) -> Result<ToolOutput, ToolError> {
        // The arguments first, as a writer checks them: a refusal of arguments names no record.
        let args = match args::parse::<R::Args>(args) {
            Ok(args) => args,
            Err(message) => return Ok(ToolOutput::error(message)),
        };
        let mut scope = ReadScope::open(self.store.pool(), R::ONE_STATEMENT)
            .await
            .map_err(database_error)?;
        let outcome = match User::of(scope.conn(), &ctx.acting_user)
            .await
            .map_err(database_error)?
        {
            None => Err(Refusal::NotPermitted),
            Some(user) => self
                .reader
                .read(scope.conn(), &user, &args)
                .await
                .map_err(database_error)?,
        };
        scope.close().await.map_err(database_error)?;
        Ok(match outcome {
            Ok(value) => ToolOutput::ok(
                serde_json::to_string_pretty(&value)
                    .map_err(|e| ToolError::failed("serialization_error", e))?,
            ),
            Err(Refusal::NotPermitted) => ToolOutput::error(R::NOT_PERMITTED),
            Err(Refusal::Invalid(message)) => ToolOutput::error(message),
        })
    }
}

/// `%query%` for ILIKE, with the pattern characters of the query taken literally.
fn like_pattern(query: &str) -> String {
    let mut p = String::with_capacity(query.len() + 2);
    p.push('%');
    for c in query.chars() {
        if matches!(c, '\\' | '%' | '_') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

/// The first `limit` (by default 20) of the `visible` results, under `key`, and whether there
/// were more.
fn first_of(key: &str, visible: Vec<Value>, limit: Option<Limit>) -> Value {
    let limit = limit.map_or(DEFAULT_LIMIT, Int::get) as usize;
    let truncated = visible.len() > limit;
    let first: Vec<Value> = visible.into_iter().take(limit).collect();
    json!({key: first, "truncated": truncated})
}

/// `read_page_metadata`.
#[derive(Debug, Clone)]
pub(crate) struct ReadPageMetadata;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadPageMetadataArgs {
    /// The page.
    uid: Uid,
}

impl Arguments for ReadPageMetadataArgs {}

#[async_trait]
impl Reader for ReadPageMetadata {
    type Args = ReadPageMetadataArgs;

    const NAME: &'static str = "read_page_metadata";
    const DESCRIPTION: &'static str =
        "Read the descriptive metadata fields of one live page, and which translations it has.";
    const NOT_PERMITTED: &'static str = PAGE_NOT_PERMITTED;
    const ONE_STATEMENT: bool = true;

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &ReadPageMetadataArgs,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let Some((page, translations)) = Page::load_with_translations(conn, args.uid.get()).await?
        else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !page.permits(user) {
            return Ok(Err(Refusal::NotPermitted));
        }
        if page.workspace != 0 {
            return Ok(Err(Refusal::draft("Page", page.uid, page.workspace)));
        }
        let mut out = serde_json::Map::new();
        out.insert("uid".into(), json!(page.uid));
        out.insert("parent".into(), json!(page.pid));
        out.insert("language".into(), json!(page.language));
        out.insert("translation_of".into(), json!(page.l10n_parent));
        out.insert("hidden".into(), json!(page.hidden));
        out.insert("doktype".into(), json!(page.doktype));
        for field in PAGE_METADATA_FIELDS {
            out.insert(field.into(), json!(page.field(field).unwrap_or_default()));
        }
        out.insert(
            "translations".into(),
            translations
                .iter()
                .filter(|(_, language)| user.may_use_language(*language))
                .map(|(uid, language)| json!({"uid": uid, "language": language}))
                .collect(),
        );
        Ok(Ok(Value::Object(out)))
    }
}

/// `search_pages`.
#[derive(Debug, Clone)]
pub(crate) struct SearchPages;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SearchPagesArgs {
    query: NonBlank<SEARCH_QUERY_CAP>,
    #[schemars(extend("default" = DEFAULT_LIMIT))]
    limit: Option<Limit>,
}

impl Arguments for SearchPagesArgs {}

#[async_trait]
impl Reader for SearchPages {
    type Args = SearchPagesArgs;

    const NAME: &'static str = "search_pages";
    const DESCRIPTION: &'static str =
        "Find live pages whose title, navigation title, subtitle, description or keywords \
         contain a text. Only pages the acting user may edit are listed.";
    const NOT_PERMITTED: &'static str = PAGE_NOT_PERMITTED;
    const ONE_STATEMENT: bool = true;

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &SearchPagesArgs,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let rows = sqlx::query!(
            r#"SELECT uid, pid, language, hidden, title, nav_title,
                      content.rootline(uid) AS rootline
               FROM content.pages
               WHERE NOT deleted AND workspace = 0
                 AND (title ILIKE $1 OR nav_title ILIKE $1 OR subtitle ILIKE $1
                      OR description ILIKE $1 OR keywords ILIKE $1)
               ORDER BY uid
               LIMIT $2"#,
            like_pattern(args.query.as_str()),
            SEARCH_SCAN
        )
        .fetch_all(&mut *conn)
        .await?;
        let visible: Vec<Value> = rows
            .iter()
            .filter(|r| {
                user.may_use_language(r.language) && user.may_edit_rootline(r.rootline.as_deref())
            })
            .map(|r| {
                json!({
                    "uid": r.uid, "parent": r.pid, "language": r.language,
                    "hidden": r.hidden, "title": r.title, "nav_title": r.nav_title,
                })
            })
            .collect();
        Ok(Ok(first_of("pages", visible, args.limit)))
    }
}

/// `list_content_elements`.
#[derive(Debug, Clone)]
pub(crate) struct ListContentElements;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListContentElementsArgs {
    /// The default-language page.
    page: Uid,
    #[schemars(extend("default" = 0))]
    language: Option<Int<0, { i32::MAX as i64 }>>,
}

impl Arguments for ListContentElementsArgs {}

#[async_trait]
impl Reader for ListContentElements {
    type Args = ListContentElementsArgs;

    const NAME: &'static str = "list_content_elements";
    const DESCRIPTION: &'static str =
        "List the content elements of one live page in one language (default 0), column by \
         column from top to bottom, with their file references.";
    const NOT_PERMITTED: &'static str = ELEMENT_NOT_PERMITTED;

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &ListContentElementsArgs,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let language = args.language.map_or(0, Int::get) as i32;
        let Some(page) = Page::load(conn, args.page.get()).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if let Some(refusal) = refuse_listing(&page, user, language) {
            return Ok(Err(refusal));
        }
        let elements = sqlx::query!(
            r#"SELECT uid, ctype, colpos, header, bodytext, hidden, l10n_parent
               FROM content.elements
               WHERE pid = $1 AND language = $2 AND workspace = 0 AND NOT deleted
               ORDER BY colpos, sorting, uid"#,
            page.uid,
            language
        )
        .fetch_all(&mut *conn)
        .await?;
        let uids: Vec<i64> = elements.iter().map(|e| e.uid).collect();
        let references = Self::references(conn, user, &uids).await?;
        let mut position = 0;
        let mut column = None;
        let list: Vec<Value> = elements
            .iter()
            .map(|e| {
                if column != Some(e.colpos) {
                    column = Some(e.colpos);
                    position = 0;
                }
                position += 1;
                let refs: Vec<Value> = references
                    .iter()
                    .filter(|(element, _)| *element == e.uid)
                    .map(|(_, shown)| shown.clone())
                    .collect();
                json!({
                    "uid": e.uid, "type": e.ctype, "column": e.colpos, "position": position,
                    "header": e.header, "bodytext": e.bodytext, "hidden": e.hidden,
                    "translation_of": e.l10n_parent, "references": refs,
                })
            })
            .collect();
        Ok(Ok(
            json!({"page": page.uid, "language": language, "elements": list}),
        ))
    }
}

impl ListContentElements {
    /// The live file references of the elements `uids`, in listing order, each as `user` is
    /// shown it, beside the element it belongs to.
    async fn references(
        conn: &mut PgConnection,
        user: &User,
        uids: &[i64],
    ) -> Result<Vec<(i64, Value)>, sqlx::Error> {
        let references = sqlx::query!(
            r#"SELECT r.element, r.field, r.file, r.title, r.alternative, f.storage, f.identifier,
                      f.name
               FROM content.file_references r
               JOIN content.files f ON f.uid = r.file
               WHERE r.element = ANY($1) AND NOT r.deleted
               ORDER BY r.element, r.field, r.sorting, r.uid"#,
            uids
        )
        .fetch_all(&mut *conn)
        .await?;
        Ok(references
            .iter()
            .map(|r| {
                // A reference to a file outside the user's mounts is listed without
                // anything that describes the file.
                let shown = if user.may_access_file(r.storage, &r.identifier) {
                    json!({"field": r.field, "file": r.file, "name": r.name,
                           "identifier": r.identifier, "title": r.title,
                           "alternative": r.alternative})
                } else {
                    json!({"field": r.field, "file": r.file, "accessible": false})
                };
                (r.element, shown)
            })
            .collect())
    }
}

/// Why `user` may not list the elements of `page` in `language`, if they may not: no access, a
/// draft, or a translation (its elements sit on the default-language page).
fn refuse_listing(page: &Page, user: &User, language: i32) -> Option<Refusal> {
    if !page.permits(user) || !user.may_use_language(language) {
        return Some(Refusal::NotPermitted);
    }
    if page.workspace != 0 {
        return Some(Refusal::draft("Page", page.uid, page.workspace));
    }
    page.l10n_parent.map(|default| {
        Refusal::Invalid(format!(
            "Page [{}] is a translation; content elements sit on its default-language page \
             [{default}]: list that page with \"language\": {}.",
            page.uid, page.language
        ))
    })
}

/// `read_fal_asset_meta`: admin only.
#[derive(Debug, Clone)]
pub(crate) struct ReadFalAssetMeta;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadFalAssetMetaArgs {
    /// The file.
    uid: Uid,
}

impl Arguments for ReadFalAssetMetaArgs {}

#[async_trait]
impl Reader for ReadFalAssetMeta {
    type Args = ReadFalAssetMetaArgs;

    const NAME: &'static str = "read_fal_asset_meta";
    const DESCRIPTION: &'static str =
        "Read one file: storage, path, name, extension, its metadata in the default language \
         (title, description, alternative text) and how many references use it. Admins only.";
    const GROUP: &'static str = "structure";
    const REQUIRES_ADMIN: bool = true;
    const NOT_PERMITTED: &'static str = ASSET_NOT_PERMITTED;

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &ReadFalAssetMetaArgs,
    ) -> Result<Planned<Value>, sqlx::Error> {
        // The spec says admin only; the stored flag decides, whatever the caller was offered.
        if !user.admin {
            return Ok(Err(Refusal::NotPermitted));
        }
        let Some(file) = File::load(conn, args.uid.get()).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !file.permits(user) {
            return Ok(Err(Refusal::NotPermitted));
        }
        let metadata = Metadata::load_default(conn, file.uid).await?;
        let references = sqlx::query_scalar!(
            r#"SELECT count(*) AS "count!" FROM content.file_references
               WHERE file = $1 AND NOT deleted"#,
            file.uid
        )
        .fetch_one(&mut *conn)
        .await?;
        Ok(Ok(json!({
            "uid": file.uid,
            "storage": file.storage,
            "storage_name": file.storage_name,
            "identifier": file.identifier,
            "name": file.name,
            "extension": file.extension,
            "metadata": metadata.map(|m| json!({
                "title": m.title, "description": m.description, "alternative": m.alternative,
            })),
            "references": references,
        })))
    }
}

/// `search_fal_files`.
#[derive(Debug, Clone)]
pub(crate) struct SearchFalFiles;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SearchFalFilesArgs {
    query: Option<NonBlank<SEARCH_QUERY_CAP>>,
    extension: Option<NonBlank<16>>,
    #[schemars(extend("default" = DEFAULT_LIMIT))]
    limit: Option<Limit>,
}

impl Arguments for SearchFalFilesArgs {
    fn check(&self) -> ArgResult<()> {
        if self.query.is_none() && self.extension.is_none() {
            return Err("Give a \"query\", an \"extension\", or both.".into());
        }
        Ok(())
    }
}

#[async_trait]
impl Reader for SearchFalFiles {
    type Args = SearchFalFilesArgs;

    const NAME: &'static str = "search_fal_files";
    const DESCRIPTION: &'static str =
        "Find files by a text in their name, path, title or alternative text (default \
         language) and/or by extension. Only files inside the acting user's file mounts are \
         listed.";
    const NOT_PERMITTED: &'static str = ASSET_NOT_PERMITTED;

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &SearchFalFilesArgs,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let rows = sqlx::query!(
            r#"SELECT f.uid, f.storage, s.name AS storage_name, f.identifier, f.name, f.extension,
                      m.title AS "title?", m.alternative AS "alternative?"
               FROM content.files f
               JOIN content.storages s ON s.uid = f.storage
               LEFT JOIN content.file_metadata m
                      ON m.file = f.uid AND m.language = 0 AND m.workspace = 0
               WHERE ($1::text IS NULL OR f.name ILIKE $1 OR f.identifier ILIKE $1
                      OR m.title ILIKE $1 OR m.alternative ILIKE $1)
                 AND ($2::text IS NULL OR f.extension = lower($2))
               ORDER BY f.uid
               LIMIT $3"#,
            args.query.as_ref().map(|q| like_pattern(q.as_str())),
            args.extension.as_ref().map(NonBlank::as_str),
            SEARCH_SCAN
        )
        .fetch_all(&mut *conn)
        .await?;
        let default_language = user.may_use_language(0);
        let visible: Vec<Value> = rows
            .iter()
            .filter(|r| user.may_access_file(r.storage, &r.identifier))
            .map(|r| {
                let (title, alternative) = if default_language {
                    (r.title.clone(), r.alternative.clone())
                } else {
                    (None, None)
                };
                json!({
                    "uid": r.uid, "storage": r.storage, "storage_name": r.storage_name,
                    "identifier": r.identifier, "name": r.name, "extension": r.extension,
                    "title": title, "alternative": alternative,
                })
            })
            .collect();
        Ok(Ok(first_of("files", visible, args.limit)))
    }
}

#[cfg(test)]
mod tests {
    use super::like_pattern;

    #[test]
    fn a_search_text_is_taken_literally() {
        assert_eq!(like_pattern("50%_off\\"), "%50\\%\\_off\\\\%");
    }
}
