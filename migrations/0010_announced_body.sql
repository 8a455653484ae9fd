-- The public body of an event as the outbox stores it: the event's fields with `event_id` (the
-- row's id, for consumers to deduplicate by) and `at`, the time of the transaction that
-- announces it by the database clock (RFC 3339, UTC, microseconds). The one statement of the
-- rule, for every transition that writes an outbox row.
create function announced_body(body jsonb, event_id uuid)
returns jsonb
language sql stable
as $$
    select body || jsonb_build_object(
        'event_id', event_id,
        'at', to_char(now() at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$$;
