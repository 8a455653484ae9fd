-- The transactional outbox of the public events (`countersign.events`).
--
-- A transition that announces an event writes its row here in the same transaction as the
-- transition, so the announcement exists exactly when the change does: a crash between the
-- commit and the broker can no longer lose a `run.suspended`. A relay publishes unpublished
-- rows with publisher confirms and sets `published_at`; the reaper republishes rows left
-- unpublished. Delivery is therefore at least once, and consumers deduplicate by `id`, which
-- the body carries as `event_id`.
--
-- Not an extension of `run_events`: that is the audit trail of one run (a foreign key to the
-- run, sealed content, audit-only kinds such as `tool_write`, payloads that name the approver),
-- while this table holds exactly the public bodies, including events that name no stored run
-- (a refused run request, a refused decision naming an unknown run), and its rows are a
-- transport's bookkeeping that may be pruned once published.

create table event_outbox (
    -- The event id consumers deduplicate by; also `body ->> 'event_id'`.
    id           uuid primary key,
    -- No foreign key: a refused decision may name a run that does not exist, and a refused run
    -- request names none.
    run_id       uuid,
    -- The event name, which is the routing key.
    kind         text not null check (kind ~ '^[a-z]+\.[a-z_]+$'),
    -- The full public body, as published: ids, codes and counts, never content.
    body         jsonb not null check (
                     jsonb_typeof(body) = 'object'
                     and body ->> 'event_id' = id::text
                     and body ->> 'event' = kind),
    created_at   timestamptz not null default now(),
    published_at timestamptz
);

-- The relay's and the reaper's scan: oldest unpublished first.
create index event_outbox_unpublished_idx on event_outbox (created_at, id) where published_at is null;
-- What was announced about a run.
create index event_outbox_run_idx on event_outbox (run_id, created_at);
