-- Settles many runs in one statement, each under its own lease: `running` → `completed` or
-- `failed` with its reason, error code and counters, and its `run.completed`/`run.failed`
-- announced (audit row and outbox row). The rows are locked in id order, so two batches never
-- deadlock each other; a settlement whose lease is no longer held writes nothing.
-- $1..$9 the runs (id, owner, epoch, status, reason, error code, iterations, prompt and
-- completion tokens), $10..$14 their events (kind, audit payload, sealed answer, id, body).
WITH given AS (
    SELECT DISTINCT ON (id) *
    FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::text[], $5::text[],
                $6::text[], $7::int4[], $8::int8[], $9::int8[], $10::text[],
                $11::jsonb[], $12::bytea[], $13::uuid[], $14::jsonb[])
         AS g (id, owner, epoch, status, reason, error_code, iterations,
               prompt_tokens, completion_tokens, kind, payload, sealed,
               event_id, body)),
held AS (
    SELECT r.id FROM runs r JOIN given g ON r.id = g.id
    WHERE r.status = 'running' AND r.lease_owner = g.owner
      AND r.lease_epoch = g.epoch
    ORDER BY r.id
    FOR UPDATE OF r),
settled AS (
    UPDATE runs r
    SET status = g.status, termination_reason = g.reason,
        error_code = g.error_code,
        iterations = coalesce(g.iterations, r.iterations),
        prompt_tokens = coalesce(g.prompt_tokens, r.prompt_tokens),
        completion_tokens = coalesce(g.completion_tokens, r.completion_tokens),
        updated_at = now()
    FROM given g
    WHERE r.id = g.id AND r.id IN (SELECT id FROM held)
      AND r.status = 'running' AND r.lease_owner = g.owner
      AND r.lease_epoch = g.epoch
    RETURNING r.id),
announced AS (
    SELECT announce(s.id, g.event_id, g.kind, g.body, g.payload, g.sealed) AS e
    FROM settled s JOIN given g ON g.id = s.id)
SELECT (e).id AS "id!", (e).run_id, (e).kind AS "kind!", (e).body AS "body!",
       (e).created_at AS "created_at!"
FROM announced
