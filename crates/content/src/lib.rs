#![doc = include_str!("../README.md")]

/// Runs one statement, checked at compile time, for its effect only (a write, or the row locks
/// a `SELECT` takes), its rows dropped: `Ok(())` once it is done. Declared before the modules,
/// which all use it.
macro_rules! execute {
    ($conn:expr, $sql:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!($sql $(, $arg)*)
            .fetch_all(&mut *$conn)
            .await
            .map(drop)
    };
}

/// Reads a writer's read set: `$sql` selects `rank AS "rank!", id AS "id!", mode AS "mode!"`
/// from its `content.read_set_<tool>` function.
macro_rules! read_set {
    ($conn:expr, $sql:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(crate::writer::Row, $sql $(, $arg)*)
            .fetch_all(&mut *$conn)
            .await
    };
}

pub mod access;
mod args;
mod datahandler;
mod readers;
mod records;
pub mod refusals;
mod writer;
mod writers;

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};

use countersign_core::{DataClass, LocalWriter, LocalWriters, Tool, ToolRegistry};
use countersign_store::{FencedWrite, Store};
use sqlx::migrate::Migrator;
use sqlx::PgPool;

/// The content store's migrations (`crates/content/migrations/`): the schema `content`, beside
/// the engine's in the same `_sqlx_migrations` table. Its versions are unique across both
/// migrators: 0002 (first shipped with the engine's, so databases that have it keep it), then
/// from 10001. Apply [`countersign_store::MIGRATOR`] first.
pub static MIGRATOR: Migrator = Migrator {
    ignore_missing: true,
    ..sqlx::migrate!("./migrations")
};

/// The engine's migrations and the content store's as one, in version order: a database with
/// the content store enabled (`countersign migrate --with-content`, and the test suites that
/// use both).
pub static WITH_ENGINE: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrations: Vec<_> = countersign_store::MIGRATOR
        .iter()
        .chain(MIGRATOR.iter())
        .cloned()
        .collect();
    migrations.sort_by_key(|m| m.version);
    Migrator {
        migrations: Cow::Owned(migrations),
        ignore_missing: true,
        ..Migrator::DEFAULT
    }
});

/// Whether `pool`'s database has the content store's schema: one of the content store's
/// migrations has been applied there.
pub async fn is_installed(pool: &PgPool) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar::<_, bool>("SELECT to_regclass('content.users') IS NOT NULL")
        .fetch_one(pool)
        .await
}

pub use access::{lookup_user, ContentUsers, User, AGENT_APPROVE};
pub use records::{PAGE_METADATA_FIELDS, REFERENCE_FIELDS};

use readers::{
    ListContentElements, ReadFalAssetMeta, ReadPageMetadata, Reader, ReaderTool, SearchFalFiles,
    SearchPages,
};
use writer::{Writer, WriterTool};
use writers::attach_file::AttachFile;
use writers::element_draft::CreateElementDraft;
use writers::file_alternative::SetFileAlternativeText;
use writers::move_element::MoveElement;
use writers::page_draft::CreatePageDraft;
use writers::page_metadata::UpdatePageMetadata;
use writers::translation::CreateTranslationDraft;

/// The data class of each of the content store's tool groups. `content` and `editing` read and
/// write what editors write for the site; `structure` reads file records and the storages'
/// internal paths, which stay inside the installation unless a provider is configured for them
/// — as does any group this list does not know.
pub fn data_class_of(group: &str) -> DataClass {
    match group {
        "content" | "editing" => DataClass::EditorContent,
        _ => DataClass::FAIL_CLOSED,
    }
}

/// The names of the readers, in name order.
pub const READER_NAMES: [&str; 5] = [
    ListContentElements::NAME,
    ReadFalAssetMeta::NAME,
    ReadPageMetadata::NAME,
    SearchFalFiles::NAME,
    SearchPages::NAME,
];

/// The names of the writers, in name order.
pub const WRITER_NAMES: [&str; 7] = [
    AttachFile::NAME,
    CreateElementDraft::NAME,
    CreatePageDraft::NAME,
    CreateTranslationDraft::NAME,
    MoveElement::NAME,
    SetFileAlternativeText::NAME,
    UpdatePageMetadata::NAME,
];

/// A writer as a tool and as the local writer an approved turn plans and writes it with.
type Both = (Arc<dyn Tool>, Arc<dyn LocalWriter<FencedWrite>>);

/// The seven writers of the content store, in name order.
fn writers(store: &Store) -> Vec<Both> {
    fn both<W: Writer>(writer: W, store: &Store) -> Both {
        let tool = Arc::new(WriterTool::new(writer, store.clone()));
        (tool.clone(), tool)
    }
    vec![
        both(AttachFile, store),
        both(CreateElementDraft, store),
        both(CreatePageDraft, store),
        both(CreateTranslationDraft, store),
        both(MoveElement, store),
        both(SetFileAlternativeText, store),
        both(UpdatePageMetadata::default(), store),
    ]
}

fn readers(store: &Store) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ReaderTool::new(ListContentElements, store.clone())),
        Arc::new(ReaderTool::new(ReadFalAssetMeta, store.clone())),
        Arc::new(ReaderTool::new(ReadPageMetadata, store.clone())),
        Arc::new(ReaderTool::new(SearchFalFiles, store.clone())),
        Arc::new(ReaderTool::new(SearchPages, store.clone())),
    ]
}

/// All twelve tools of the content store, readers then writers, each in name order. The
/// writers are disabled by default; an agent configuration enables them one by one.
pub fn tools(store: Store) -> Vec<Arc<dyn Tool>> {
    let mut tools = readers(&store);
    tools.extend(writers(&store).into_iter().map(|(tool, _)| tool));
    tools
}

/// Registers all twelve tools in `registry`, and the seven writers — the same tools — in
/// `local`: the approval pipeline plans and writes them in the run store's own transaction.
pub fn register(registry: &mut ToolRegistry, local: &mut LocalWriters<FencedWrite>, store: Store) {
    for tool in readers(&store) {
        registry.register(tool);
    }
    for (tool, writer) in writers(&store) {
        local.register(tool.spec().name.clone(), writer);
        registry.register(tool);
    }
}

/// The demo site's SQL, documented in the file itself.
pub const DEMO_SITE_SQL: &str = include_str!("../seed/demo_site.sql");

/// Seeds the demo site: a small two-language site (pages, elements with images, files in two
/// storages) and the users `admin`, `editor`, `approver` (holds [`AGENT_APPROVE`]) and
/// `restricted` (an editor without the SEO field grants). Seeding twice changes nothing.
pub async fn seed_demo_site(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(DEMO_SITE_SQL).execute(pool).await?;
    Ok(())
}
