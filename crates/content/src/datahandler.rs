//! The write path, modelled on a CMS's DataHandler — including the behaviour that makes the
//! writers read their rows back.
//!
//! Like the CMS's, this write path applies the descriptive fields of a call only where the
//! acting user may write them: an exclude field the user holds no grant for is SKIPPED, with no
//! error and no log line, and the rest of the record is written. Callers therefore never take a
//! finished write as proof that the values landed; every writer re-reads its row in the same
//! transaction and reports any field whose stored value is not the requested one.
//!
//! Structural fields (where a record sits, its language, that a draft is hidden) are not
//! descriptive and are not filtered: a draft must be hidden whoever creates it.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use sqlx::PgConnection;

use crate::access::User;

/// Descriptive fields of one write, by name.
pub(crate) type Fields = BTreeMap<&'static str, String>;

/// A page to create, hidden.
#[derive(Debug, Clone)]
pub(crate) struct NewPage<'a> {
    pub pid: i64,
    pub sorting: i32,
    pub language: i32,
    pub l10n_parent: Option<i64>,
    pub doktype: i32,
    pub fields: &'a Fields,
}

/// A content element to create, hidden.
#[derive(Debug, Clone)]
pub(crate) struct NewElement<'a> {
    pub pid: i64,
    pub ctype: &'a str,
    pub colpos: i32,
    pub sorting: i32,
    pub language: i32,
    pub l10n_parent: Option<i64>,
    /// `header`, `bodytext`.
    pub fields: &'a Fields,
}

/// A file reference to append.
#[derive(Debug, Clone)]
pub(crate) struct NewReference<'a> {
    pub element: i64,
    pub field: &'a str,
    pub file: i64,
    pub sorting: i32,
    /// `title`, `alternative`, `description`.
    pub fields: &'a Fields,
}

/// The write path for one acting user.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataHandler<'u> {
    user: &'u User,
}

impl<'u> DataHandler<'u> {
    pub(crate) fn new(user: &'u User) -> Self {
        DataHandler { user }
    }

    /// The fields of `table` this user may write, as a JSON object; the others are dropped
    /// without a word, as the CMS does.
    fn writable(&self, table: &str, fields: &Fields) -> Value {
        let kept: Map<String, Value> = fields
            .iter()
            .filter(|(name, _)| {
                !self.user.is_exclude_field(table, name) || self.user.holds_field_grant(table, name)
            })
            .map(|(name, value)| ((*name).to_owned(), Value::String(value.clone())))
            .collect();
        Value::Object(kept)
    }

    /// Sets descriptive fields of one page and reads them back: the row as it now stores them,
    /// its columns by name (the fields are named as their columns; `None`: no such row), from
    /// the same statement.
    pub(crate) async fn update_page(
        &self,
        conn: &mut PgConnection,
        uid: i64,
        fields: &Fields,
    ) -> Result<Option<Value>, sqlx::Error> {
        let set = self.writable("pages", fields);
        sqlx::query_scalar!(
            r#"UPDATE content.pages p SET
                   title = coalesce($2::jsonb ->> 'title', title),
                   subtitle = coalesce($2::jsonb ->> 'subtitle', subtitle),
                   nav_title = coalesce($2::jsonb ->> 'nav_title', nav_title),
                   abstract = coalesce($2::jsonb ->> 'abstract', abstract),
                   description = coalesce($2::jsonb ->> 'description', description),
                   keywords = coalesce($2::jsonb ->> 'keywords', keywords),
                   seo_title = coalesce($2::jsonb ->> 'seo_title', seo_title),
                   og_title = coalesce($2::jsonb ->> 'og_title', og_title),
                   og_description = coalesce($2::jsonb ->> 'og_description', og_description),
                   twitter_title = coalesce($2::jsonb ->> 'twitter_title', twitter_title),
                   twitter_description =
                       coalesce($2::jsonb ->> 'twitter_description', twitter_description)
               WHERE uid = $1
               RETURNING to_jsonb(p) AS "stored!""#,
            uid,
            set
        )
        .fetch_optional(conn)
        .await
    }

    /// Sets descriptive fields of one file metadata record.
    pub(crate) async fn update_file_metadata(
        &self,
        conn: &mut PgConnection,
        uid: i64,
        fields: &Fields,
    ) -> Result<(), sqlx::Error> {
        let set = self.writable("file_metadata", fields);
        execute!(
            conn,
            r#"UPDATE content.file_metadata SET
                   title = coalesce($2::jsonb ->> 'title', title),
                   description = coalesce($2::jsonb ->> 'description', description),
                   alternative = coalesce($2::jsonb ->> 'alternative', alternative)
               WHERE uid = $1"#,
            uid,
            set
        )
    }

    /// Creates a hidden page in the live workspace and returns its uid.
    pub(crate) async fn insert_hidden_page(
        &self,
        conn: &mut PgConnection,
        page: &NewPage<'_>,
    ) -> Result<i64, sqlx::Error> {
        let set = self.writable("pages", page.fields);
        sqlx::query_scalar!(
            r#"INSERT INTO content.pages
                   (pid, sorting, language, l10n_parent, workspace, deleted, hidden, doktype,
                    title, subtitle, nav_title, abstract, description, keywords, seo_title,
                    og_title, og_description, twitter_title, twitter_description)
               VALUES ($1, $2, $3, $4, 0, false, true, $5,
                    coalesce($6::jsonb ->> 'title', ''),
                    coalesce($6::jsonb ->> 'subtitle', ''),
                    coalesce($6::jsonb ->> 'nav_title', ''),
                    coalesce($6::jsonb ->> 'abstract', ''),
                    coalesce($6::jsonb ->> 'description', ''),
                    coalesce($6::jsonb ->> 'keywords', ''),
                    coalesce($6::jsonb ->> 'seo_title', ''),
                    coalesce($6::jsonb ->> 'og_title', ''),
                    coalesce($6::jsonb ->> 'og_description', ''),
                    coalesce($6::jsonb ->> 'twitter_title', ''),
                    coalesce($6::jsonb ->> 'twitter_description', ''))
               RETURNING uid"#,
            page.pid,
            page.sorting,
            page.language,
            page.l10n_parent,
            page.doktype,
            set
        )
        .fetch_one(&mut *conn)
        .await
    }

    /// Creates a hidden content element in the live workspace and returns its uid.
    pub(crate) async fn insert_hidden_element(
        &self,
        conn: &mut PgConnection,
        element: &NewElement<'_>,
    ) -> Result<i64, sqlx::Error> {
        let set = self.writable("elements", element.fields);
        sqlx::query_scalar!(
            r#"INSERT INTO content.elements
                   (pid, ctype, header, bodytext, colpos, sorting, hidden, deleted, language,
                    l10n_parent, workspace)
               VALUES ($1, $2, coalesce($3::jsonb ->> 'header', ''),
                       coalesce($3::jsonb ->> 'bodytext', ''), $4, $5, true, false, $6, $7, 0)
               RETURNING uid"#,
            element.pid,
            element.ctype,
            set,
            element.colpos,
            element.sorting,
            element.language,
            element.l10n_parent
        )
        .fetch_one(&mut *conn)
        .await
    }

    /// Appends a file reference and returns its uid.
    pub(crate) async fn insert_reference(
        &self,
        conn: &mut PgConnection,
        reference: &NewReference<'_>,
    ) -> Result<i64, sqlx::Error> {
        let set = self.writable("file_references", reference.fields);
        sqlx::query_scalar!(
            r#"INSERT INTO content.file_references
                   (element, field, file, sorting, title, alternative, description, deleted)
               VALUES ($1, $2, $3, $4, coalesce($5::jsonb ->> 'title', ''),
                       coalesce($5::jsonb ->> 'alternative', ''),
                       coalesce($5::jsonb ->> 'description', ''), false)
               RETURNING uid"#,
            reference.element,
            reference.field,
            reference.file,
            reference.sorting,
            set
        )
        .fetch_one(&mut *conn)
        .await
    }

    /// Copies the live references of one element to another (a new translation), with their
    /// descriptive texts where the user may write them.
    pub(crate) async fn copy_references(
        &self,
        conn: &mut PgConnection,
        from_element: i64,
        to_element: i64,
    ) -> Result<(), sqlx::Error> {
        let texts: Fields = ["title", "alternative", "description"]
            .into_iter()
            .map(|f| (f, String::new()))
            .collect();
        let set = self.writable("file_references", &texts);
        let keep = |f: &str| set.get(f).is_some();
        execute!(
            conn,
            r#"INSERT INTO content.file_references
                   (element, field, file, sorting, title, alternative, description, deleted)
               SELECT $2, field, file, sorting,
                      CASE WHEN $3 THEN title ELSE '' END,
                      CASE WHEN $4 THEN alternative ELSE '' END,
                      CASE WHEN $5 THEN description ELSE '' END,
                      false
               FROM content.file_references
               WHERE element = $1 AND NOT deleted
               ORDER BY field, sorting, uid"#,
            from_element,
            to_element,
            keep("title"),
            keep("alternative"),
            keep("description")
        )
    }

    /// Puts a content element onto another page and column (its position is set by
    /// [`DataHandler::order_column`]).
    pub(crate) async fn place_element(
        &self,
        conn: &mut PgConnection,
        uid: i64,
        pid: i64,
        colpos: i32,
    ) -> Result<(), sqlx::Error> {
        execute!(
            conn,
            r#"UPDATE content.elements SET pid = $2, colpos = $3 WHERE uid = $1"#,
            uid,
            pid,
            colpos
        )
    }

    /// Gives the elements of one column the sortings of `order` (top to bottom), and moves
    /// their translations along: a translation sits where its default-language element sits.
    pub(crate) async fn order_column(
        &self,
        conn: &mut PgConnection,
        order: &[i64],
    ) -> Result<(), sqlx::Error> {
        execute!(
            conn,
            r#"UPDATE content.elements e SET sorting = (o.ord * 256)::integer
               FROM unnest($1::bigint[]) WITH ORDINALITY AS o (uid, ord)
               WHERE e.uid = o.uid AND e.sorting <> (o.ord * 256)::integer"#,
            order
        )?;
        execute!(
            conn,
            r#"UPDATE content.elements t
               SET pid = p.pid, colpos = p.colpos, sorting = p.sorting
               FROM content.elements p
               WHERE t.l10n_parent = p.uid AND p.uid = ANY($1) AND NOT t.deleted
                 AND (t.pid, t.colpos, t.sorting) IS DISTINCT FROM (p.pid, p.colpos, p.sorting)"#,
            order
        )
    }

    /// Gives the subpages of one page the sortings of `order` (menu order), and their
    /// translations the same.
    pub(crate) async fn order_subpages(
        &self,
        conn: &mut PgConnection,
        order: &[i64],
    ) -> Result<(), sqlx::Error> {
        execute!(
            conn,
            r#"UPDATE content.pages p SET sorting = (o.ord * 256)::integer
               FROM unnest($1::bigint[]) WITH ORDINALITY AS o (uid, ord)
               WHERE p.uid = o.uid AND p.sorting <> (o.ord * 256)::integer"#,
            order
        )?;
        execute!(
            conn,
            r#"UPDATE content.pages t SET sorting = p.sorting
               FROM content.pages p
               WHERE t.l10n_parent = p.uid AND p.uid = ANY($1) AND NOT t.deleted
                 AND t.sorting <> p.sorting"#,
            order
        )
    }

    /// Marks pages deleted (a discarded translation).
    pub(crate) async fn delete_pages(
        &self,
        conn: &mut PgConnection,
        uids: &[i64],
    ) -> Result<(), sqlx::Error> {
        execute!(
            conn,
            r#"UPDATE content.pages SET deleted = true WHERE uid = ANY($1)"#,
            uids
        )
    }

    /// Marks content elements deleted, with their file references (a discarded translation).
    pub(crate) async fn delete_elements(
        &self,
        conn: &mut PgConnection,
        uids: &[i64],
    ) -> Result<(), sqlx::Error> {
        execute!(
            conn,
            r#"UPDATE content.elements SET deleted = true WHERE uid = ANY($1)"#,
            uids
        )?;
        execute!(
            conn,
            r#"UPDATE content.file_references SET deleted = true WHERE element = ANY($1)"#,
            uids
        )
    }
}
