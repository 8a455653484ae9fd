//! The records the tools address, and how each is looked up.
//!
//! What counts as existing is decided here, once per record type: a deleted page or element is
//! gone (and so is everything on or below a deleted page, through the rootline); a file has no
//! enable columns at all; file metadata is addressed by file, pinned to the default language
//! and the live workspace, because a draft version carries the same file and language.
//! Readers and writers use the same lookups, so they always address the same row.

use sqlx::PgConnection;

use crate::access::User;

/// The descriptive page fields a tool may set (ADR-135's allow-list), in the order they are
/// documented. Nothing that routes, publishes, restricts or relates is in it.
pub const PAGE_METADATA_FIELDS: [&str; 11] = [
    "title",
    "subtitle",
    "nav_title",
    "abstract",
    "description",
    "keywords",
    "seo_title",
    "og_title",
    "og_description",
    "twitter_title",
    "twitter_description",
];

/// The reference fields of a content element.
pub const REFERENCE_FIELDS: [&str; 3] = ["image", "assets", "media"];

/// A page that is not deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    pub uid: i64,
    pub pid: i64,
    pub sorting: i32,
    pub language: i32,
    pub l10n_parent: Option<i64>,
    pub workspace: i32,
    pub hidden: bool,
    pub doktype: i32,
    pub title: String,
    pub subtitle: String,
    pub nav_title: String,
    pub abstract_text: String,
    pub description: String,
    pub keywords: String,
    pub seo_title: String,
    pub og_title: String,
    pub og_description: String,
    pub twitter_title: String,
    pub twitter_description: String,
    /// Own uid, then the ancestors'; `None` when a page on the way up is deleted.
    pub rootline: Option<Vec<i64>>,
}

impl Page {
    pub(crate) async fn load(
        conn: &mut PgConnection,
        uid: i64,
    ) -> Result<Option<Page>, sqlx::Error> {
        sqlx::query_as!(
            Page,
            r#"SELECT uid, pid, sorting, language, l10n_parent, workspace, hidden, doktype,
                      title, subtitle, nav_title, abstract AS abstract_text, description, keywords,
                      seo_title, og_title, og_description, twitter_title, twitter_description,
                      content.rootline(uid) AS rootline
               FROM content.pages
               WHERE uid = $1 AND NOT deleted"#,
            uid
        )
        .fetch_optional(&mut *conn)
        .await
        .map(|page| page.filter(|p| p.rootline.is_some()))
    }

    /// The page as [`Page::load`] reads it, and its live translations (uid and language, by
    /// language then uid), by one statement. A statement of its own rather than a switch in
    /// `load`'s: a parameter that decides whether a subquery runs makes PostgreSQL plan every
    /// execution of a prepared statement anew.
    pub(crate) async fn load_with_translations(
        conn: &mut PgConnection,
        uid: i64,
    ) -> Result<Option<(Page, Vec<(i64, i32)>)>, sqlx::Error> {
        let row = sqlx::query!(
            r#"SELECT p.uid, p.pid, p.sorting, p.language, p.l10n_parent, p.workspace, p.hidden,
                      p.doktype, p.title, p.subtitle, p.nav_title, p.abstract AS abstract_text,
                      p.description, p.keywords, p.seo_title, p.og_title, p.og_description,
                      p.twitter_title, p.twitter_description,
                      content.rootline(p.uid) AS rootline,
                      t.uids AS "translation_uids: Vec<i64>",
                      t.languages AS "translation_languages: Vec<i32>"
               FROM content.pages p,
                    LATERAL (SELECT array_agg(t.uid ORDER BY t.language, t.uid) AS uids,
                                    array_agg(t.language ORDER BY t.language, t.uid) AS languages
                             FROM content.pages t
                             WHERE t.l10n_parent = p.uid AND t.workspace = 0
                               AND NOT t.deleted) t
               WHERE p.uid = $1 AND NOT p.deleted"#,
            uid
        )
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row.filter(|r| r.rootline.is_some()) else {
            return Ok(None);
        };
        let translations = row
            .translation_uids
            .unwrap_or_default()
            .into_iter()
            .zip(row.translation_languages.unwrap_or_default())
            .collect();
        let page = Page {
            uid: row.uid,
            pid: row.pid,
            sorting: row.sorting,
            language: row.language,
            l10n_parent: row.l10n_parent,
            workspace: row.workspace,
            hidden: row.hidden,
            doktype: row.doktype,
            title: row.title,
            subtitle: row.subtitle,
            nav_title: row.nav_title,
            abstract_text: row.abstract_text,
            description: row.description,
            keywords: row.keywords,
            seo_title: row.seo_title,
            og_title: row.og_title,
            og_description: row.og_description,
            twitter_title: row.twitter_title,
            twitter_description: row.twitter_description,
            rootline: row.rootline,
        };
        Ok(Some((page, translations)))
    }

    /// The record check: the page is editable for `user` and in a language `user` may use.
    pub(crate) fn permits(&self, user: &User) -> bool {
        user.may_use_language(self.language) && user.may_edit_rootline(self.rootline.as_deref())
    }

    /// The value of one of [`PAGE_METADATA_FIELDS`].
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        let v = match name {
            "title" => &self.title,
            "subtitle" => &self.subtitle,
            "nav_title" => &self.nav_title,
            "abstract" => &self.abstract_text,
            "description" => &self.description,
            "keywords" => &self.keywords,
            "seo_title" => &self.seo_title,
            "og_title" => &self.og_title,
            "og_description" => &self.og_description,
            "twitter_title" => &self.twitter_title,
            "twitter_description" => &self.twitter_description,
            _ => return None,
        };
        Some(v)
    }
}

/// A content element that is not deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Element {
    pub uid: i64,
    pub pid: i64,
    pub ctype: String,
    pub header: String,
    pub bodytext: String,
    pub colpos: i32,
    pub sorting: i32,
    pub hidden: bool,
    pub language: i32,
    pub l10n_parent: Option<i64>,
    pub workspace: i32,
    /// The rootline of the page the element is on; `None` when that page does not exist.
    pub rootline: Option<Vec<i64>>,
}

impl Element {
    pub(crate) async fn load(
        conn: &mut PgConnection,
        uid: i64,
    ) -> Result<Option<Element>, sqlx::Error> {
        sqlx::query_as!(
            Element,
            r#"SELECT uid, pid, ctype, header, bodytext, colpos, sorting, hidden, language,
                      l10n_parent, workspace, content.rootline(pid) AS rootline
               FROM content.elements
               WHERE uid = $1 AND NOT deleted"#,
            uid
        )
        .fetch_optional(&mut *conn)
        .await
        .map(|e| e.filter(|e| e.rootline.is_some()))
    }

    /// The record check: the element's page is editable for `user`, and the element is in a
    /// language `user` may use.
    pub(crate) fn permits(&self, user: &User) -> bool {
        user.may_use_language(self.language) && user.may_edit_rootline(self.rootline.as_deref())
    }
}

/// A file. Files have no enable columns: a file row exists or it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct File {
    pub uid: i64,
    pub storage: i64,
    pub storage_name: String,
    pub identifier: String,
    pub name: String,
    pub extension: String,
}

impl File {
    pub(crate) async fn load(
        conn: &mut PgConnection,
        uid: i64,
    ) -> Result<Option<File>, sqlx::Error> {
        sqlx::query_as!(
            File,
            r#"SELECT f.uid, f.storage, s.name AS storage_name, f.identifier, f.name, f.extension
               FROM content.files f
               JOIN content.storages s ON s.uid = f.storage
               WHERE f.uid = $1"#,
            uid
        )
        .fetch_optional(&mut *conn)
        .await
    }

    /// The record check: the file is inside one of `user`'s file mounts.
    pub(crate) fn permits(&self, user: &User) -> bool {
        user.may_access_file(self.storage, &self.identifier)
    }
}

/// The metadata record of a file in the default language and the live workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Metadata {
    pub uid: i64,
    pub title: String,
    pub description: String,
    pub alternative: String,
}

impl Metadata {
    /// Pins file, default language and live workspace, plus an order, so exactly one row is
    /// addressed however the table grows.
    pub(crate) async fn load_default(
        conn: &mut PgConnection,
        file: i64,
    ) -> Result<Option<Metadata>, sqlx::Error> {
        sqlx::query_as!(
            Metadata,
            r#"SELECT uid, title, description, alternative
               FROM content.file_metadata
               WHERE file = $1 AND language = 0 AND workspace = 0
               ORDER BY uid
               LIMIT 1"#,
            file
        )
        .fetch_optional(&mut *conn)
        .await
    }
}

/// A record as it is named in a preview line: its uid and its title or header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    pub uid: i64,
    pub label: String,
}

/// The live default-language elements of one column of a page, top to bottom.
pub(crate) async fn column(
    conn: &mut PgConnection,
    pid: i64,
    colpos: i32,
) -> Result<Vec<Named>, sqlx::Error> {
    sqlx::query_as!(
        Named,
        r#"SELECT uid, header AS label
           FROM content.elements
           WHERE pid = $1 AND colpos = $2 AND language = 0 AND workspace = 0 AND NOT deleted
           ORDER BY sorting, uid"#,
        pid,
        colpos
    )
    .fetch_all(&mut *conn)
    .await
}

/// The live default-language subpages of a page, in menu order.
pub(crate) async fn subpages(conn: &mut PgConnection, pid: i64) -> Result<Vec<Named>, sqlx::Error> {
    sqlx::query_as!(
        Named,
        r#"SELECT uid, title AS label
           FROM content.pages
           WHERE pid = $1 AND language = 0 AND workspace = 0 AND NOT deleted
           ORDER BY sorting, uid"#,
        pid
    )
    .fetch_all(&mut *conn)
    .await
}

/// The title of a language, `None` when no such language is configured.
pub(crate) async fn language_title(
    conn: &mut PgConnection,
    language: i32,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT title FROM content.languages WHERE uid = $1"#,
        language
    )
    .fetch_optional(&mut *conn)
    .await
}

/// The files `element`'s reference field `field` refers to, in the order they are shown
/// (sorting, then uid), each as `[uid] name`.
pub(crate) async fn referenced_files(
    conn: &mut PgConnection,
    element: i64,
    field: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT '[' || f.uid || '] ' || f.name AS "file!"
           FROM content.file_references r JOIN content.files f ON f.uid = r.file
           WHERE r.element = $1 AND r.field = $2 AND NOT r.deleted
           ORDER BY r.sorting, r.uid"#,
        element,
        field
    )
    .fetch_all(&mut *conn)
    .await
}

/// The file extensions a reference field accepts, in name order.
pub(crate) async fn allowed_extensions(
    conn: &mut PgConnection,
    field: &str,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT extension FROM content.reference_field_extensions
           WHERE field = $1
           ORDER BY extension"#,
        field
    )
    .fetch_all(&mut *conn)
    .await
}
