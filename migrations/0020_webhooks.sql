-- Webhook endpoints and their deliveries: the Standard Webhooks way for approvers (and their
-- chat tools) to hear of a card without consuming the events exchange.
--
-- A delivery is a row written by a trigger on `event_outbox`, in the transaction that writes
-- the event: every event an endpoint subscribes to has its delivery exactly when the event
-- exists, and nothing a crash can lose in between. A deliverer claims due rows with a short
-- claim (as the relay claims outbox rows), posts them, and records each attempt; a delivery
-- is retried with backoff until it is delivered or its time runs out (`failed`).

create table webhook_endpoints (
    id         uuid primary key,
    -- Absolute http(s) URL without credentials or fragment; one endpoint per URL.
    url        text not null unique,
    -- The event names delivered (`run.suspended`, …).
    events     text[] not null check (cardinality(events) > 0),
    -- Only runs of this agent; every run when null.
    agent      text,
    -- The signing secret (`whsec_…`), sealed (purpose `webhook_secret`, under `id`).
    secret     bytea not null,
    created_at timestamptz not null default now()
);

create table webhook_deliveries (
    endpoint_id     uuid not null references webhook_endpoints (id) on delete cascade,
    -- The event's id: the `webhook-id` receivers deduplicate by.
    event_id        uuid not null,
    run_id          uuid,
    kind            text not null,
    -- The event's public body (ids, codes, counts; never content).
    body            jsonb not null,
    status          text not null default 'pending'
                    check (status in ('pending', 'delivered', 'failed')),
    attempts        integer not null default 0,
    next_attempt_at timestamptz not null default now(),
    claimed_until   timestamptz,
    created_at      timestamptz not null default now(),
    finished_at     timestamptz,
    primary key (endpoint_id, event_id)
);

-- The deliverer's scan: due pending rows, oldest first.
create index webhook_deliveries_due_idx on webhook_deliveries (next_attempt_at)
    where status = 'pending';

-- Every attempt, for `countersign webhooks deliveries`: when, the HTTP status (none when no
-- answer came), and the code of a failure.
create table webhook_attempts (
    endpoint_id  uuid not null,
    event_id     uuid not null,
    attempt      integer not null,
    at           timestamptz not null default now(),
    http_status  integer,
    code         text,
    primary key (endpoint_id, event_id, attempt),
    foreign key (endpoint_id, event_id)
        references webhook_deliveries (endpoint_id, event_id) on delete cascade
);

-- One statement per batch of events: the endpoints subscribed to each new event (and to its
-- run's agent, when they name one) get a delivery.
create function webhook_fan_out() returns trigger
language plpgsql
as $$
begin
    if exists (select 1 from webhook_endpoints) then
        insert into webhook_deliveries (endpoint_id, event_id, run_id, kind, body)
        select e.id, n.id, n.run_id, n.kind, n.body
        from new_events n
        join webhook_endpoints e on n.kind = any (e.events)
        left join runs r on r.id = n.run_id
        where e.agent is null or e.agent = r.agent
        on conflict do nothing;
    end if;
    return null;
end
$$;

create trigger event_outbox_webhooks
    after insert on event_outbox
    referencing new table as new_events
    for each statement execute function webhook_fan_out();
