//! `move_content_element`: move one content element to a page, column and position.
//!
//! The position is given relative to a neighbour (`after_content_uid`) or as the top of the
//! column, and the preview names both ends with their positions, so a column that changed since
//! the approver looked shows up as a different preview. A translation sits where its
//! default-language element sits and moves with it; it is never moved on its own.

use async_trait::async_trait;
use countersign_core::{Effect, PreviewLine, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use sqlx::PgConnection;

use crate::access::User;
use crate::args::{Arguments, Int, Uid};
use crate::datahandler::DataHandler;
use crate::records::{column, Element, Named, Page};
use crate::refusals::{named, ELEMENT_NOT_PERMITTED};
use crate::writer::{Planned, Refusal, Row, Writer};
use crate::writers::{text_lines, uids, ReadBack, Slot};

/// Columns are numbered from 0; no layout has anywhere near this many.
pub(crate) const MAX_COLUMN: i64 = 99;
/// A column of a page.
pub(crate) type Column = Int<0, MAX_COLUMN>;

#[derive(Debug, Clone)]
pub(crate) struct MoveElement;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveArgs {
    /// The content element to move.
    uid: Uid,
    /// The page to move it to.
    target_page: Uid,
    // Omitted: the element's current column.
    column: Option<Column>,
    /// Place it after this element of the target column; omit for the top.
    after_content_uid: Option<Uid>,
}

impl Arguments for MoveArgs {}

#[derive(Debug, Clone)]
pub(crate) struct MovePlan {
    element: Element,
    from_page: Named,
    from_index: usize,
    from_total: usize,
    to_page: Named,
    column: i32,
    /// The element's place in the target column.
    slot: Slot,
    translations: i64,
}

/// Refuses an `after` element that is not in the target column (same words whether it exists
/// elsewhere or not, so it confirms nothing).
pub(crate) fn check_neighbour(
    after: &Element,
    page: i64,
    colpos: i32,
    subject: Option<i64>,
) -> Option<Refusal> {
    if subject == Some(after.uid) {
        return Some(Refusal::invalid(format!(
            "Content element [{}] cannot be placed after itself; nothing was written.",
            after.uid
        )));
    }
    let in_column =
        after.pid == page && after.colpos == colpos && after.language == 0 && after.workspace == 0;
    (!in_column).then(|| {
        Refusal::invalid(format!(
            "Content element [{}] is not in column {colpos} of page [{page}] in the default \
             language, so nothing can be placed after it; nothing was written.",
            after.uid
        ))
    })
}

/// Refuses a page that content cannot be placed on: a draft version or a translation.
pub(crate) fn check_content_page(page: &Page) -> Option<Refusal> {
    if page.workspace != 0 {
        return Some(Refusal::draft("Page", page.uid, page.workspace));
    }
    page.l10n_parent.map(|parent| {
        Refusal::invalid(format!(
            "Page [{}] is a translation; content is placed on its default-language page \
             [{parent}], and translated with create_translation_draft. Nothing was written.",
            page.uid
        ))
    })
}

/// The records a move involves.
struct MoveRecords {
    element: Element,
    /// The page the element is on.
    source: Page,
    target: Page,
    /// The element to place it after, if any.
    after: Option<Element>,
}

/// The records `args` names, if they all exist and `user` may edit them.
async fn load_records(
    conn: &mut PgConnection,
    user: &User,
    args: &MoveArgs,
) -> Result<Planned<MoveRecords>, sqlx::Error> {
    let element = Element::load(conn, args.uid.get()).await?;
    let target = Page::load(conn, args.target_page.get()).await?;
    let after = match args.after_content_uid {
        Some(uid) => match Element::load(conn, uid.get()).await? {
            Some(a) => Some(a),
            None => return Ok(Err(Refusal::NotPermitted)),
        },
        None => None,
    };
    let (Some(element), Some(target)) = (element, target) else {
        return Ok(Err(Refusal::NotPermitted));
    };
    let source = Page::load(conn, element.pid).await?;
    let Some(source) = source else {
        return Ok(Err(Refusal::NotPermitted));
    };
    if !element.permits(user)
        || !target.permits(user)
        || after.as_ref().is_some_and(|a| !a.permits(user))
    {
        return Ok(Err(Refusal::NotPermitted));
    }
    Ok(Ok(MoveRecords {
        element,
        source,
        target,
        after,
    }))
}

#[async_trait]
impl Writer for MoveElement {
    type Args = MoveArgs;
    type Plan = MovePlan;

    const NAME: &'static str = "move_content_element";
    const DESCRIPTION: &'static str =
        "Move one content element (default language; its translations follow it) to a page, \
         a column (default: its current column) and a position: after the element \
         `after_content_uid`, or at the top of the column when it is not given. Every call \
         is shown to a human for approval before it runs.";
    const EFFECT: Effect = Effect::IdempotentWrite;
    const NOT_PERMITTED: &'static str = ELEMENT_NOT_PERMITTED;

    async fn read_set(
        &self,
        conn: &mut PgConnection,
        user_name: &str,
        args: &MoveArgs,
    ) -> Result<Vec<Row>, sqlx::Error> {
        read_set!(
            conn,
            r#"SELECT rank AS "rank!", id AS "id!", mode AS "mode!"
               FROM content.read_set_move_content_element($1, $2, $3, $4, $5)"#,
            user_name,
            args.uid.get(),
            args.target_page.get(),
            args.column.map(|c| c.get() as i32),
            args.after_content_uid.map(Uid::get)
        )
    }

    async fn plan(
        &self,
        conn: &mut PgConnection,
        user: &User,
        args: &MoveArgs,
    ) -> Result<Planned<MovePlan>, sqlx::Error> {
        let MoveRecords {
            element,
            source,
            target,
            after,
        } = match load_records(conn, user, args).await? {
            Ok(records) => records,
            Err(refusal) => return Ok(Err(refusal)),
        };

        let colpos = args.column.map_or(element.colpos, |c| c.get() as i32);
        if let Some(refusal) = refuse_move(&element, &target, after.as_ref(), colpos) {
            return Ok(Err(refusal));
        }

        let from = column(conn, element.pid, element.colpos).await?;
        let from_index = from.iter().position(|e| e.uid == element.uid).unwrap_or(0);
        let mut to = column(conn, target.uid, colpos).await?;
        to.retain(|e| e.uid != element.uid);
        let Some(slot) = Slot::after(to, after.map(|a| a.uid)) else {
            return Ok(Err(Refusal::NotPermitted));
        };
        let translations = sqlx::query_scalar!(
            r#"SELECT count(*) AS "count!" FROM content.elements
               WHERE l10n_parent = $1 AND NOT deleted"#,
            element.uid
        )
        .fetch_one(&mut *conn)
        .await?;

        Ok(Ok(MovePlan {
            from_page: Named {
                uid: source.uid,
                label: source.title,
            },
            from_index,
            from_total: from.len(),
            to_page: Named {
                uid: target.uid,
                label: target.title,
            },
            column: colpos,
            slot,
            translations,
            element,
        }))
    }

    fn preview(&self, plan: &MovePlan) -> Vec<PreviewLine> {
        let mut lines = vec![
            named("Content element", plan.element.uid, &plan.element.header),
            format!(
                "from: {}, column {}, position {} of {}",
                named("page", plan.from_page.uid, &plan.from_page.label),
                plan.element.colpos,
                plan.from_index + 1,
                plan.from_total
            ),
            format!(
                "to: {}, column {}, position {}",
                named("page", plan.to_page.uid, &plan.to_page.label),
                plan.column,
                plan.slot.place("content element")
            ),
        ];
        if plan.translations > 0 {
            lines.push(format!("translations: {} move with it", plan.translations));
        }
        text_lines(lines)
    }

    async fn apply(
        &self,
        conn: &mut PgConnection,
        user: &User,
        plan: &MovePlan,
    ) -> Result<ToolOutput, sqlx::Error> {
        let uid = plan.element.uid;
        let order = plan.slot.order(uid);
        let handler = DataHandler::new(user);
        handler
            .place_element(conn, uid, plan.to_page.uid, plan.column)
            .await?;
        handler.order_column(conn, &order).await?;

        let mut check = ReadBack::default();
        let stored = Element::load(conn, uid).await?;
        check.field(
            "page and column",
            stored
                .as_ref()
                .is_some_and(|e| e.pid == plan.to_page.uid && e.colpos == plan.column),
        );
        let now = column(conn, plan.to_page.uid, plan.column).await?;
        check.field("position", uids(&now) == order);
        let strays = sqlx::query_scalar!(
            r#"SELECT count(*) AS "count!" FROM content.elements
               WHERE l10n_parent = $1 AND NOT deleted AND (pid, colpos) <> ($2, $3)"#,
            uid,
            plan.to_page.uid,
            plan.column
        )
        .fetch_one(&mut *conn)
        .await?;
        check.field("translations", strays == 0);
        let success = format!(
            "Moved content element [{uid}] to page [{}], column {}, position {}; the read-back \
             confirms it.",
            plan.to_page.uid,
            plan.column,
            plan.slot.place("content element")
        );
        Ok(check.output(
            success,
            &format!("Content element [{uid}]"),
            "the move did not land where it was planned",
        ))
    }
}

/// Why moving `element` to `target`, column `colpos`, after `after`, is refused, if it is: a
/// draft, a translation (it moves with its default-language element), a target page that holds
/// no content, or a neighbour that is not there.
fn refuse_move(
    element: &Element,
    target: &Page,
    after: Option<&Element>,
    colpos: i32,
) -> Option<Refusal> {
    if element.workspace != 0 {
        return Some(Refusal::draft(
            "Content element",
            element.uid,
            element.workspace,
        ));
    }
    if let Some(parent) = element.l10n_parent {
        return Some(Refusal::invalid(format!(
            "Content element [{}] is a translation; it moves with its default-language \
             element [{parent}], so move that one instead. Nothing was written.",
            element.uid
        )));
    }
    check_content_page(target)
        .or_else(|| after.and_then(|a| check_neighbour(a, target.uid, colpos, Some(element.uid))))
}
