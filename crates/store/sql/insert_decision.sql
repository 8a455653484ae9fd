-- Records a decision in one statement: an accepted one releases the turn it names
-- (`waiting_for_approval` → `queued` for the resume, only for that suspension and digest), and
-- is recorded only if it did; any other outcome is recorded as it is. The decision is announced
-- (its audit row too when `$13` and the run exists). A decision id recorded before writes
-- nothing. Returns the outbox row and how long the run waited, when something was recorded.
-- $1 decision, $2 run, $3 suspension, $4 digest, $5 approved, $6 approver, $7 sealed comment,
-- $8 outcome, $9 event, $10 audit payload, $11 event id, $12 body, $13 in the trail, $14 kind,
-- $15 sealed detail.
WITH released AS (
    UPDATE runs
    SET status = 'queued', segment = 'resume', available_at = now(),
        dispatched_at = NULL, approval_deadline = NULL, requeue_count = 0,
        updated_at = now()
    WHERE $8 = 'accepted' AND id = $2 AND status = 'waiting_for_approval'
      AND suspension_seq = $3 AND turn_digest = $4
      AND NOT EXISTS (SELECT 1 FROM run_decisions WHERE decision_id = $1)
    RETURNING extract(epoch FROM now() - (SELECT w.updated_at FROM runs w
                                          WHERE w.id = $2))::float8 AS waited),
decided AS (
    INSERT INTO run_decisions
        (decision_id, run_id, suspension_seq, turn_digest, approved, approver,
         comment, outcome, kind, detail)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $14, $15
    WHERE $8 <> 'accepted' OR EXISTS (SELECT 1 FROM released)
    ON CONFLICT (decision_id) DO NOTHING
    RETURNING decision_id),
announced AS (
    SELECT announce($2, $11, $9, $12,
                    CASE WHEN $13 AND EXISTS (SELECT 1 FROM runs WHERE id = $2)
                         THEN $10::jsonb END) AS e
    FROM decided)
SELECT (e).id AS "id!", (e).run_id, (e).kind AS "kind!", (e).body AS "body!",
       (e).created_at AS "created_at!", (SELECT waited FROM released) AS waited
FROM announced
