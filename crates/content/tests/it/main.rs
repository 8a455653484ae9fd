//! The content store's tools against the real PostgreSQL: each test gets its own database,
//! migrated with the engine's and the content store's migrators and seeded with the demo site.

mod support;

mod attach_file;
mod element_draft;
mod fence;
mod file_alternative;
mod json_schema;
mod migrations;
mod move_element;
mod page_draft;
mod page_metadata;
mod previews;
mod readers;
mod schemas;
mod seed;
mod translation;
mod users;
