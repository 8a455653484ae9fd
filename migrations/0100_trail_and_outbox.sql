-- The audit trail and the outbox, each written by one function that every transition calls.
--
-- Before, the trail's numbering (the upsert of `run_trails`), the audit row and the outbox row
-- were spelled in each statement that announced something: a reader could not tell a
-- deliberate difference from drift. Now a statement says what it announces and these say how.
--
-- `trail_append` appends one audit row to the run's trail, numbered from the run's counter
-- (`run_trails.last_sequence`): the upsert that takes the number locks the counter until the
-- transaction ends, so appenders serialise there and the numbers stay 1, 2, … without gaps,
-- whatever else the transaction holds. Called for several rows of one statement, it numbers
-- them in the order it is called; a statement that needs an order calls it from a select list
-- under `order by` (such a call is evaluated after the sort). PL/pgSQL rather than SQL for
-- both functions: a session keeps their statements' plans, where a SQL function that writes
-- is planned again at every call.
create function trail_append(for_run uuid, event_kind text, event_payload jsonb,
                             event_sealed bytea default null, event_round integer default null,
                             event_duration_ms bigint default null)
returns bigint
language plpgsql volatile
as $$
declare
    numbered bigint;
begin
    insert into run_trails (run_id, last_sequence) values (for_run, 1)
    on conflict (run_id) do update set last_sequence = run_trails.last_sequence + 1
    returning last_sequence into numbered;
    insert into run_events (run_id, sequence, kind, round, duration_ms, payload, sealed)
    values (for_run, numbered, event_kind, event_round, event_duration_ms, event_payload,
            event_sealed);
    return numbered;
end
$$;

-- `announce` writes an event's outbox row, its body completed by `announced_body` (the row's
-- id and the database clock), and — when the event has an audit payload — its audit row
-- first, through `trail_append`. A null payload announces without a trail: a run request's
-- acceptance, or a refused decision about a run that does not exist.
create function announce(for_run uuid, event_id uuid, event_kind text, event_body jsonb,
                         event_payload jsonb default null, event_sealed bytea default null)
returns event_outbox
language plpgsql volatile
as $$
declare
    announced event_outbox;
begin
    if event_payload is not null then
        perform trail_append(for_run, event_kind, event_payload, event_sealed);
    end if;
    insert into event_outbox (id, run_id, kind, body)
    values (event_id, for_run, event_kind, announced_body(event_body, event_id))
    returning * into announced;
    return announced;
end
$$;

-- A run that is not running holds no lease: whatever stops it running (a suspension, a
-- settlement, a requeue by its worker or the reaper, a failure by the reaper, a cancellation,
-- a colleague's plain UPDATE) gives up the owner, the expiry and the stamp of the effect the
-- holder had under way. The call stamped as sent (`sent_seq`, `sent_call`) is not part of the
-- lease: it stays, naming a call in doubt for the next segment or on a run that failed
-- `outcome_unknown`, until a new card replaces the turn it belonged to.
create function runs_release_lease() returns trigger
language plpgsql
as $$
begin
    new.lease_owner := null;
    new.lease_expires_at := null;
    new.pending_effect := null;
    return new;
end
$$;

create trigger runs_release_lease
    before update of status on runs
    for each row
    when (new.status <> 'running')
    execute function runs_release_lease();
