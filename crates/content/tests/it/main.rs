//! The content store's tools against the real PostgreSQL: each test gets its own database,
//! migrated with the store's migrator and seeded with the demo site.
