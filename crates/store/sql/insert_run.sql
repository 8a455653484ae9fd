-- Creates a run in one statement, one commit: the gates' facts (the producer may assert the
-- acting user for `$11`, the agent is active), then the run and its `run.accepted` outbox row —
-- or, when a fact refuses or the request id is a duplicate, neither. The facts are returned
-- either way.
-- $1 run, $2 request id, $3 agent, $4 acting user, $5 sealed request, $6 event id, $7 event,
-- $8 body, $9 producer, $10 traceparent, $11 the grant's kind (null: no gate).
WITH facts AS (
    SELECT $11::text IS NULL OR producer_may_assert($9, $11, $4) AS granted,
           $11::text IS NULL
               OR EXISTS (SELECT 1 FROM agents WHERE name = $3 AND active)
               AS active),
created AS (
    INSERT INTO runs (id, request_id, producer, agent, acting_user, status, segment,
                      request, request_traceparent)
    SELECT $1, $2, $9, $3, $4, 'queued', 'start', $5, $10
    FROM facts
    WHERE facts.granted AND facts.active
      AND NOT EXISTS (SELECT 1 FROM runs
                      WHERE request_id = $2 AND producer IS NULL)
    ON CONFLICT (producer, request_id) DO NOTHING
    RETURNING id),
announced AS (
    SELECT e.* FROM created, announce(created.id, $6, $7, $8) AS e)
SELECT f.granted AS "granted!", f.active AS "active!",
       a.id AS "id?", a.run_id, a.kind AS "kind?", a.body AS "body?",
       a.created_at AS "created_at?"
FROM facts f LEFT JOIN announced a ON true
