//! The neutral refusal strings, and the small vocabulary the preview lines share.
//!
//! Each string is shared by a reader and the writers of the same records, and it is the same
//! whether the record does not exist, is deleted, sits outside the user's mounts, is in a
//! language the user may not use, or the user is unknown: a refusal never confirms that an id
//! exists. One string per kind of record, not one for all: a shared string would break the
//! pairing between a reader and its writers in both directions.

use countersign_core::preview::quote_excerpt;

/// `read_page_metadata`, `search_pages`, `update_page_metadata`, `create_page_draft`,
/// `create_content_element_draft`, and `create_translation_draft` for pages.
pub const PAGE_NOT_PERMITTED: &str = "Page not found or not permitted.";
/// `read_fal_asset_meta`, `search_fal_files`, `set_file_alternative_text`.
pub const ASSET_NOT_PERMITTED: &str = "Asset not found or not permitted.";
/// `list_content_elements`, `move_content_element`, and `create_translation_draft` for content.
pub const ELEMENT_NOT_PERMITTED: &str = "Content element not found or not permitted.";
/// `attach_file_to_content_element`.
pub const ELEMENT_OR_FILE_NOT_PERMITTED: &str =
    "Content element or file not found, or not permitted.";

/// The refusal of a writer called without a lease.
pub const NO_LEASE: &str =
    "This tool writes only under a run's lease, and this call has none; nothing was written.";

/// The last line of every preview that creates a record.
pub const HIDDEN_LINE: &str = "visibility: hidden — a human must unhide it before anyone sees it";

/// `Page [12] "Home"`, `content element [5] "Teaser"`: a record named in a line.
pub(crate) fn named(kind: &str, uid: i64, label: &str) -> String {
    format!("{kind} [{uid}] {}", quote_excerpt(label))
}

/// The refusal of a record that is a draft version in a workspace other than live.
pub(crate) fn draft_workspace(kind: &str, uid: i64, workspace: i32) -> String {
    format!(
        "{kind} [{uid}] is a draft version in workspace {workspace}; only the live workspace (0) \
         is read or written by this tool, so nothing was done."
    )
}
