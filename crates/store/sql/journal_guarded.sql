/* journal_guarded */
-- The journal of a turn's calls, under the lease, in one statement: the lease's guarded UPDATE
-- of the run row (renewing it, clearing the stamp of a call sent), the journal row of every
-- entry not journaled yet, the `tool_write` audit row of each new write in call order, and the
-- commits the turn owes from now on. Nothing is written when the guard loses.
-- $1 run, $2 owner, $3 epoch, $4 suspension, $5 renewal (ms, or null), $6 clear the stamp,
-- $7..$10 the entries (index, tool, effect, sealed result), $11..$12 their audit payloads and
-- sealed outputs, $13 the calls whose commit is owed.
WITH fenced AS (
    UPDATE runs
    SET lease_expires_at =
            coalesce(now() + $5 * interval '1 millisecond', lease_expires_at),
        pending_effect = CASE WHEN $6 THEN NULL ELSE pending_effect END,
        sent_seq = CASE WHEN $6 THEN NULL ELSE sent_seq END,
        sent_call = CASE WHEN $6 THEN NULL ELSE sent_call END
    WHERE id = $1 AND status = 'running' AND lease_owner = $2 AND lease_epoch = $3
    RETURNING id),
journaled AS (
    INSERT INTO run_journal (run_id, suspension_seq, call_index, tool, effect, result,
                             lease_epoch, created_at)
    SELECT f.id, $4, e.call_index, e.tool, e.effect, e.result, $3, clock_timestamp()
    FROM fenced f,
         unnest($7::int[], $8::text[], $9::text[], $10::bytea[])
             AS e (call_index, tool, effect, result)
    ORDER BY e.call_index
    ON CONFLICT (run_id, suspension_seq, call_index) DO NOTHING
    RETURNING call_index),
audited AS (
    SELECT trail_append($1, 'tool_write', a.payload, a.sealed) AS sequence
    FROM unnest($7::int[], $11::jsonb[], $12::bytea[]) AS a (call_index, payload, sealed)
    JOIN journaled j ON j.call_index = a.call_index
    WHERE a.payload IS NOT NULL
    ORDER BY a.call_index),
owed AS (
    INSERT INTO run_owed_commits (run_id, suspension_seq, call_index)
    SELECT f.id, $4, o.call_index FROM fenced f, unnest($13::int[]) AS o (call_index)
    ON CONFLICT DO NOTHING
    RETURNING call_index),
paid AS (
    DELETE FROM run_owed_commits d USING fenced f
    WHERE $6 AND d.run_id = f.id AND d.suspension_seq = $4
      AND d.call_index = ANY ($7::int[])
    RETURNING d.call_index)
SELECT (SELECT count(*) FROM fenced) AS "fenced!",
       (SELECT count(*) FROM journaled) AS "inserted!",
       (SELECT count(*) FROM audited) AS "audited!"
