-- content.rootline in PL/pgSQL, with the same query and the same answers (a page's uid and its
-- ancestors', nearest first, from the default-language page of a translation; NULL when the
-- page, or any page above it, is deleted or missing). A SQL function that cannot be inlined
-- plans its query again in every statement that calls it; PL/pgSQL keeps the plan for the
-- session, and every page and element a tool reads calls this once.
CREATE OR REPLACE FUNCTION content.rootline(p_uid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        WITH RECURSIVE up (uid, pid, deleted, depth) AS (
            SELECT p.uid, p.pid, p.deleted, 0
            FROM content.pages p
            WHERE p.uid = (SELECT coalesce(s.l10n_parent, s.uid)
                           FROM content.pages s WHERE s.uid = p_uid)
          UNION ALL
            SELECT p.uid, p.pid, p.deleted, up.depth + 1
            FROM content.pages p
            JOIN up ON p.uid = up.pid
            WHERE up.depth < 64
        )
        SELECT CASE WHEN bool_or(up.deleted) THEN NULL ELSE array_agg(up.uid ORDER BY up.depth) END
        FROM up);
END
$$;
