//! Who may do what: the users of the content store and the checks every tool runs.
//!
//! Every check is made against an explicit user, looked up by name — the run's acting user, or
//! the person looking at an approval card — never against an ambient one. The admin flag that
//! counts is the one stored here: a [`countersign_core::Principal`] names the user, the content
//! store decides what that user may do with its records.
//!
//! The four checks:
//! - a page is editable for an admin, or when it sits at or below one of the user's page mounts;
//!   a deleted page, or a page below one, does not exist for anybody;
//! - a language is usable when it is among the user's allowed languages (admins: all);
//! - a file is accessible when one of the user's file mounts (storage + path prefix) covers it
//!   (admins: all);
//! - an exclude field is writable with the matching field grant `<table>:<field>` (admins: all).

use async_trait::async_trait;
use countersign_core::{Approver, Approves, DirectoryError, Principal, UserDirectory};
use sqlx::{PgConnection, PgPool};

/// The grant that lets a user decide approvals without being admin or the run's owner.
pub const AGENT_APPROVE: &str = "agent_approve";

/// A file mount: the files of one storage whose identifier starts with a path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMount {
    pub storage: i64,
    /// Starts and ends with `/`.
    pub path_prefix: String,
}

/// A user of the content store, with everything the permission checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: i64,
    pub name: String,
    pub admin: bool,
    /// Tool-level grants such as [`AGENT_APPROVE`].
    pub grants: Vec<String>,
    pub allowed_languages: Vec<i32>,
    pub page_mounts: Vec<i64>,
    /// `<table>:<field>` entries for exclude fields.
    pub field_grants: Vec<String>,
    pub file_mounts: Vec<FileMount>,
    /// The exclude fields of the store as `<table>:<field>`, in order, read with the user:
    /// what [`User::holds_field_grant`] is asked about.
    pub exclude_fields: Vec<String>,
}

impl User {
    /// Loads an enabled user by name; `None` for an unknown or disabled user.
    pub async fn load(conn: &mut PgConnection, name: &str) -> Result<Option<User>, sqlx::Error> {
        // One statement, the store's exclude fields included: a segment reads its user once
        // (see [`User::of`]), a gate or a card's viewer once per question.
        let Some(row) = sqlx::query!(
            r#"SELECT u.uid, u.name, u.admin, u.grants, u.allowed_languages, u.page_mounts,
                      u.field_grants,
                      coalesce(m.storages, '{}') AS "mount_storages!",
                      coalesce(m.prefixes, '{}') AS "mount_prefixes!",
                      coalesce((SELECT array_agg(e.table_name || ':' || e.field
                                                 ORDER BY e.table_name, e.field)
                                FROM content.exclude_fields e), '{}') AS "exclude_fields!"
               FROM content.users u
               LEFT JOIN LATERAL (
                   SELECT array_agg(storage ORDER BY storage, path_prefix) AS storages,
                          array_agg(path_prefix ORDER BY storage, path_prefix) AS prefixes
                   FROM content.file_mounts WHERE user_uid = u.uid) m ON true
               WHERE u.name = $1 AND NOT u.disabled"#,
            name
        )
        .fetch_optional(&mut *conn)
        .await?
        else {
            return Ok(None);
        };
        let file_mounts = row
            .mount_storages
            .into_iter()
            .zip(row.mount_prefixes)
            .map(|(storage, path_prefix)| FileMount {
                storage,
                path_prefix,
            })
            .collect();
        Ok(Some(User {
            uid: row.uid,
            name: row.name,
            admin: row.admin,
            grants: row.grants,
            allowed_languages: row.allowed_languages,
            page_mounts: row.page_mounts,
            field_grants: row.field_grants,
            file_mounts,
            exclude_fields: row.exclude_fields,
        }))
    }

    /// The user `principal` names: the one its directory attached ([`ContentUsers`] does, for
    /// the run's acting user, once per segment), or else read now. `None` for an unknown or
    /// disabled user.
    ///
    /// So every call of a segment — previews, the re-preview and the writes of an approved
    /// turn — checks permissions against the user as the segment found them when it started,
    /// a few seconds at most before; a user disabled meanwhile is refused by the next segment.
    pub async fn of(
        conn: &mut PgConnection,
        principal: &Principal,
    ) -> Result<Option<User>, sqlx::Error> {
        match principal.profile::<User>() {
            Some(user) if user.name == principal.name => Ok(Some(user.clone())),
            _ => User::load(conn, &principal.name).await,
        }
    }

    /// The principal this user acts as, carrying the user: the tools of a segment check against
    /// it instead of reading it again (see [`User::of`]).
    fn into_principal(self) -> Principal {
        Principal::new(self.name.clone(), self.admin).with_profile(self)
    }

    /// Whether `table.field` is an exclude field: one only holders of its field grant write.
    pub fn is_exclude_field(&self, table: &str, field: &str) -> bool {
        self.exclude_fields.iter().any(|e| {
            e.split_once(':')
                .is_some_and(|(t, f)| t == table && f == field)
        })
    }

    /// The exclude fields of `table` among `fields` that this user holds no grant for.
    pub(crate) fn ungranted_fields<'f>(
        &self,
        table: &str,
        fields: impl IntoIterator<Item = &'f str>,
    ) -> Vec<&'f str> {
        fields
            .into_iter()
            .filter(|f| self.is_exclude_field(table, f) && !self.holds_field_grant(table, f))
            .collect()
    }

    /// Whether the user holds a tool-level grant such as [`AGENT_APPROVE`].
    pub fn has_grant(&self, grant: &str) -> bool {
        self.grants.iter().any(|g| g == grant)
    }

    /// Whether the user may read and write records in `language`.
    pub fn may_use_language(&self, language: i32) -> bool {
        self.admin || self.allowed_languages.contains(&language)
    }

    /// Whether the user may edit the page with this rootline (its own uid first, then its
    /// ancestors; `None` when the page or a page above it is deleted, i.e. does not exist).
    pub fn may_edit_rootline(&self, rootline: Option<&[i64]>) -> bool {
        match rootline {
            None => false,
            Some([]) => false,
            Some(uids) => self.admin || uids.iter().any(|uid| self.page_mounts.contains(uid)),
        }
    }

    /// Whether the file `identifier` in `storage` is inside one of the user's file mounts.
    pub fn may_access_file(&self, storage: i64, identifier: &str) -> bool {
        self.admin
            || self
                .file_mounts
                .iter()
                .any(|m| m.storage == storage && identifier.starts_with(&m.path_prefix))
    }

    /// Whether the user holds the grant for `table.field` (only asked about exclude fields).
    pub fn holds_field_grant(&self, table: &str, field: &str) -> bool {
        self.admin
            || self.field_grants.iter().any(|g| {
                g.split_once(':')
                    .is_some_and(|(t, f)| t == table && f == field)
            })
    }
}

/// Looks a user up by name, with everything the permission checks need. `None` for an unknown
/// or disabled user. Outside this crate, ask [`ContentUsers`] instead: the gates and surfaces
/// know users only through [`UserDirectory`].
pub async fn lookup_user(pool: &PgPool, name: &str) -> Result<Option<User>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    User::load(&mut conn, name).await
}

/// The content store's users as a [`UserDirectory`]: the principals runs act as (the worker
/// asks for the acting user's admin flag before it resolves which tools a run is offered), who
/// may be a run's acting user, and who may approve runs — an administrator or a holder of
/// [`AGENT_APPROVE`]. Each answer is one statement ([`User::load`]).
#[derive(Debug, Clone)]
pub struct ContentUsers {
    pool: PgPool,
}

impl ContentUsers {
    pub fn new(pool: PgPool) -> Self {
        ContentUsers { pool }
    }

    async fn user(&self, name: &str) -> Result<Option<User>, DirectoryError> {
        lookup_user(&self.pool, name)
            .await
            .map_err(DirectoryError::database)
    }
}

#[async_trait]
impl UserDirectory for ContentUsers {
    async fn principal(&self, name: &str) -> Result<Option<Principal>, DirectoryError> {
        Ok(self.user(name).await?.map(User::into_principal))
    }

    async fn approver(&self, name: &str) -> Result<Option<Approver>, DirectoryError> {
        Ok(self.user(name).await?.map(|u| {
            // The content store's grant is not scoped: it covers every agent's runs.
            let approves = if u.has_grant(AGENT_APPROVE) {
                Approves::Every
            } else {
                Approves::Nothing
            };
            Approver::new(u.into_principal(), approves)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn editor() -> User {
        User {
            uid: 2,
            name: "editor".into(),
            admin: false,
            grants: vec![],
            allowed_languages: vec![0],
            page_mounts: vec![10],
            field_grants: vec!["pages:seo_title".into()],
            file_mounts: vec![FileMount {
                storage: 1,
                path_prefix: "/images/".into(),
            }],
            exclude_fields: vec!["pages:seo_title".into(), "pages:og_title".into()],
        }
    }

    #[test]
    fn a_page_below_a_mount_is_editable_and_one_beside_it_is_not() {
        let u = editor();
        assert!(u.may_edit_rootline(Some(&[15, 14, 10])));
        assert!(u.may_edit_rootline(Some(&[10])));
        assert!(!u.may_edit_rootline(Some(&[21, 20])));
    }

    #[test]
    fn a_deleted_rootline_is_editable_for_nobody_not_even_an_admin() {
        let admin = User {
            admin: true,
            ..editor()
        };
        assert!(!admin.may_edit_rootline(None));
        assert!(!admin.may_edit_rootline(Some(&[])));
        assert!(admin.may_edit_rootline(Some(&[21, 20])));
    }

    #[test]
    fn a_file_mount_covers_its_prefix_in_its_own_storage_only() {
        let u = editor();
        assert!(u.may_access_file(1, "/images/hero.jpg"));
        assert!(u.may_access_file(1, "/images/sub/deep.png"));
        assert!(!u.may_access_file(2, "/images/hero.jpg"));
        assert!(!u.may_access_file(1, "/imagesX/hero.jpg"));
        assert!(!u.may_access_file(1, "/documents/a.pdf"));
    }

    #[test]
    fn a_field_grant_names_table_and_field_exactly() {
        let u = editor();
        assert!(u.holds_field_grant("pages", "seo_title"));
        assert!(!u.holds_field_grant("pages", "og_title"));
        assert!(!u.holds_field_grant("elements", "seo_title"));
    }

    #[test]
    fn languages_outside_the_allowed_list_are_refused_except_to_admins() {
        let u = editor();
        assert!(u.may_use_language(0));
        assert!(!u.may_use_language(1));
        assert!(User {
            admin: true,
            ..editor()
        }
        .may_use_language(1));
    }

    #[test]
    fn only_exclude_fields_without_a_grant_are_ungranted() {
        let u = editor();
        assert_eq!(
            u.ungranted_fields("pages", ["seo_title", "og_title", "title"]),
            vec!["og_title"]
        );
        let admin = User {
            admin: true,
            ..editor()
        };
        assert!(admin.ungranted_fields("pages", ["og_title"]).is_empty());
    }
}
