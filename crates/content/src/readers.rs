//! The five readers. Read-only, in one snapshot, as the explicit acting user; each shares its
//! neutral refusal string with the writers of the same records, and the lists leave out what
//! the user may not see rather than refusing.

use std::fmt;

use async_trait::async_trait;
use countersign_core::{Effect, ExecContext, Tool, ToolError, ToolOutput, ToolSpec};
use countersign_store::Store;
use serde_json::{json, Value};
use sqlx::PgConnection;

use crate::access::User;
use crate::args::Args;
use crate::records::{File, Metadata, Page, PAGE_METADATA_FIELDS};
use crate::refusals::{
    draft_workspace, ASSET_NOT_PERMITTED, ELEMENT_NOT_PERMITTED, PAGE_NOT_PERMITTED,
};
use crate::writer::{database_error, read_only_snapshot, Planned, Refusal};
use crate::writers::uid_schema;

/// At most this many rows are considered by a search before the permission filter.
const SEARCH_SCAN: i64 = 1000;
const SEARCH_QUERY_CAP: usize = 200;
const MAX_LIMIT: i64 = 50;
const DEFAULT_LIMIT: i64 = 20;

/// One reading tool's decisions.
#[async_trait]
pub(crate) trait Reader: Send + Sync + 'static {
    fn spec(&self) -> ToolSpec;
    fn not_permitted(&self) -> &'static str;
    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Value,
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
        let spec = reader.spec();
        debug_assert_eq!(spec.effect, Effect::ReadOnly);
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
        let mut tx = read_only_snapshot(self.store.pool())
            .await
            .map_err(database_error)?;
        let outcome = match User::load(&mut tx, &ctx.acting_user.name)
            .await
            .map_err(database_error)?
        {
            None => Err(Refusal::NotPermitted),
            Some(user) => self
                .reader
                .read(&mut tx, &user, args)
                .await
                .map_err(database_error)?,
        };
        tx.rollback().await.map_err(database_error)?;
        Ok(match outcome {
            Ok(value) => ToolOutput::ok(
                serde_json::to_string_pretty(&value)
                    .map_err(|e| ToolError::failed("serialization_error", e))?,
            ),
            Err(Refusal::NotPermitted) => ToolOutput::error(self.reader.not_permitted()),
            Err(Refusal::Invalid(message)) => ToolOutput::error(message),
        })
    }
}

fn reader_spec(
    name: &str,
    description: &str,
    group: &str,
    admin: bool,
    parameters: Value,
) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
        group: group.to_owned(),
        effect: Effect::ReadOnly,
        enabled_by_default: true,
        requires_admin: admin,
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

fn refuse_args<T>(message: String) -> Result<Planned<T>, sqlx::Error> {
    Ok(Err(Refusal::Invalid(message)))
}

/// `read_page_metadata`.
#[derive(Debug, Clone)]
pub(crate) struct ReadPageMetadata;

#[async_trait]
impl Reader for ReadPageMetadata {
    fn spec(&self) -> ToolSpec {
        reader_spec(
            "read_page_metadata",
            "Read the descriptive metadata fields of one live page, and which translations it has.",
            "content",
            false,
            json!({
                "type": "object",
                "properties": {"uid": uid_schema("The page.")},
                "required": ["uid"],
                "additionalProperties": false,
            }),
        )
    }

    fn not_permitted(&self) -> &'static str {
        PAGE_NOT_PERMITTED
    }

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Value,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let uid = match Args::parse(args, &["uid"]).and_then(|a| a.uid("uid")) {
            Ok(uid) => uid,
            Err(message) => return refuse_args(message),
        };
        let Some(page) = Page::load(conn, uid).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !page.permits(user) {
            return Ok(Err(Refusal::NotPermitted));
        }
        if page.workspace != 0 {
            return refuse_args(draft_workspace("Page", page.uid, page.workspace));
        }
        let translations = sqlx::query!(
            r#"SELECT uid, language FROM content.pages
               WHERE l10n_parent = $1 AND workspace = 0 AND NOT deleted
               ORDER BY language, uid"#,
            page.uid
        )
        .fetch_all(&mut *conn)
        .await?;
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
                .filter(|t| user.may_use_language(t.language))
                .map(|t| json!({"uid": t.uid, "language": t.language}))
                .collect(),
        );
        Ok(Ok(Value::Object(out)))
    }
}

/// `search_pages`.
#[derive(Debug, Clone)]
pub(crate) struct SearchPages;

#[async_trait]
impl Reader for SearchPages {
    fn spec(&self) -> ToolSpec {
        reader_spec(
            "search_pages",
            "Find live pages whose title, navigation title, subtitle, description or keywords \
             contain a text. Only pages the acting user may edit are listed.",
            "content",
            false,
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": SEARCH_QUERY_CAP},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                              "default": DEFAULT_LIMIT},
                },
                "required": ["query"],
                "additionalProperties": false,
            }),
        )
    }

    fn not_permitted(&self) -> &'static str {
        PAGE_NOT_PERMITTED
    }

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Value,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let parsed = Args::parse(args, &["query", "limit"]).and_then(|a| {
            Ok((
                a.text("query", SEARCH_QUERY_CAP)?,
                a.opt_int("limit", 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT),
            ))
        });
        let (query, limit) = match parsed {
            Ok(p) => p,
            Err(message) => return refuse_args(message),
        };
        let rows = sqlx::query!(
            r#"SELECT uid, pid, language, hidden, title, nav_title,
                      content.rootline(uid) AS rootline
               FROM content.pages
               WHERE NOT deleted AND workspace = 0
                 AND (title ILIKE $1 OR nav_title ILIKE $1 OR subtitle ILIKE $1
                      OR description ILIKE $1 OR keywords ILIKE $1)
               ORDER BY uid
               LIMIT $2"#,
            like_pattern(&query),
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
        let truncated = visible.len() as i64 > limit;
        let pages: Vec<Value> = visible.into_iter().take(limit as usize).collect();
        Ok(Ok(json!({"pages": pages, "truncated": truncated})))
    }
}

/// `list_content_elements`.
#[derive(Debug, Clone)]
pub(crate) struct ListContentElements;

#[async_trait]
impl Reader for ListContentElements {
    fn spec(&self) -> ToolSpec {
        reader_spec(
            "list_content_elements",
            "List the content elements of one live page in one language (default 0), column by \
             column from top to bottom, with their file references.",
            "content",
            false,
            json!({
                "type": "object",
                "properties": {
                    "page": uid_schema("The default-language page."),
                    "language": {"type": "integer", "minimum": 0, "default": 0},
                },
                "required": ["page"],
                "additionalProperties": false,
            }),
        )
    }

    fn not_permitted(&self) -> &'static str {
        ELEMENT_NOT_PERMITTED
    }

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Value,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let parsed = Args::parse(args, &["page", "language"]).and_then(|a| {
            Ok((
                a.uid("page")?,
                a.opt_int("language", 0, i64::from(i32::MAX))?.unwrap_or(0) as i32,
            ))
        });
        let (uid, language) = match parsed {
            Ok(p) => p,
            Err(message) => return refuse_args(message),
        };
        let Some(page) = Page::load(conn, uid).await? else {
            return Ok(Err(Refusal::NotPermitted));
        };
        if !page.permits(user) || !user.may_use_language(language) {
            return Ok(Err(Refusal::NotPermitted));
        }
        if page.workspace != 0 {
            return refuse_args(draft_workspace("Page", page.uid, page.workspace));
        }
        if let Some(default) = page.l10n_parent {
            return refuse_args(format!(
                "Page [{}] is a translation; content elements sit on its default-language page \
                 [{default}]: list that page with \"language\": {}.",
                page.uid, page.language
            ));
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
        let references = sqlx::query!(
            r#"SELECT r.element, r.field, r.file, r.title, r.alternative, f.storage, f.identifier,
                      f.name
               FROM content.file_references r
               JOIN content.files f ON f.uid = r.file
               WHERE r.element = ANY($1) AND NOT r.deleted
               ORDER BY r.element, r.field, r.sorting, r.uid"#,
            &uids
        )
        .fetch_all(&mut *conn)
        .await?;
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
                    .filter(|r| r.element == e.uid)
                    .map(|r| {
                        // A reference to a file outside the user's mounts is listed without
                        // anything that describes the file.
                        if user.may_access_file(r.storage, &r.identifier) {
                            json!({"field": r.field, "file": r.file, "name": r.name,
                                   "identifier": r.identifier, "title": r.title,
                                   "alternative": r.alternative})
                        } else {
                            json!({"field": r.field, "file": r.file, "accessible": false})
                        }
                    })
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

/// `read_fal_asset_meta`: admin only.
#[derive(Debug, Clone)]
pub(crate) struct ReadFalAssetMeta;

#[async_trait]
impl Reader for ReadFalAssetMeta {
    fn spec(&self) -> ToolSpec {
        reader_spec(
            "read_fal_asset_meta",
            "Read one file: storage, path, name, extension, its metadata in the default language \
             (title, description, alternative text) and how many references use it. Admins only.",
            "structure",
            true,
            json!({
                "type": "object",
                "properties": {"uid": uid_schema("The file.")},
                "required": ["uid"],
                "additionalProperties": false,
            }),
        )
    }

    fn not_permitted(&self) -> &'static str {
        ASSET_NOT_PERMITTED
    }

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Value,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let uid = match Args::parse(args, &["uid"]).and_then(|a| a.uid("uid")) {
            Ok(uid) => uid,
            Err(message) => return refuse_args(message),
        };
        // The spec says admin only; the stored flag decides, whatever the caller was offered.
        if !user.admin {
            return Ok(Err(Refusal::NotPermitted));
        }
        let Some(file) = File::load(conn, uid).await? else {
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

#[async_trait]
impl Reader for SearchFalFiles {
    fn spec(&self) -> ToolSpec {
        reader_spec(
            "search_fal_files",
            "Find files by a text in their name, path, title or alternative text (default \
             language) and/or by extension. Only files inside the acting user's file mounts are \
             listed.",
            "content",
            false,
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": SEARCH_QUERY_CAP},
                    "extension": {"type": "string", "maxLength": 16},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                              "default": DEFAULT_LIMIT},
                },
                "additionalProperties": false,
            }),
        )
    }

    fn not_permitted(&self) -> &'static str {
        ASSET_NOT_PERMITTED
    }

    async fn read(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &Value,
    ) -> Result<Planned<Value>, sqlx::Error> {
        let parsed = Args::parse(args, &["query", "extension", "limit"]).and_then(|a| {
            Ok((
                a.opt_text("query", SEARCH_QUERY_CAP, true)?,
                a.opt_text("extension", 16, true)?,
                a.opt_int("limit", 1, MAX_LIMIT)?.unwrap_or(DEFAULT_LIMIT),
            ))
        });
        let (query, extension, limit) = match parsed {
            Ok(p) => p,
            Err(message) => return refuse_args(message),
        };
        if query.is_none() && extension.is_none() {
            return refuse_args("Give a \"query\", an \"extension\", or both.".into());
        }
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
            query.as_deref().map(like_pattern),
            extension,
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
        let truncated = visible.len() as i64 > limit;
        let files: Vec<Value> = visible.into_iter().take(limit as usize).collect();
        Ok(Ok(json!({"files": files, "truncated": truncated})))
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
