-- The statements a key rotation runs on each sealed column, written once here.
--
-- A rotation walks every sealed column in primary-key order, a page at a time, and writes back
-- the envelopes it re-sealed as a compare-and-set on the old envelope (crates/store, rotation).
-- The columns differ only in their table, key and run; so that the walk is one loop over a list
-- of names, each column's page and write are branches of these two functions. A key is
-- `(key_id, key_seq, key_index)`: a column keyed by one uuid leaves the other two at 0.

-- Up to `page_size` envelopes of `sealed_column` after the key `(after_id, after_seq,
-- after_index)`, in key order, each with the run (or endpoint) it is sealed under.
create function sealed_page(sealed_column text, after_id uuid, after_seq bigint,
                            after_index bigint, page_size bigint)
returns table (key_id uuid, key_seq bigint, key_index bigint, sealed_under uuid, envelope bytea)
language plpgsql stable
as $$
begin
    case sealed_column
    when 'runs.state' then
        return query select r.id, 0::bigint, 0::bigint, r.id, r.state from runs r
                     where r.id > after_id and r.state is not null order by r.id limit page_size;
    when 'runs.request' then
        return query select r.id, 0::bigint, 0::bigint, r.id, r.request from runs r
                     where r.id > after_id and r.request is not null order by r.id limit page_size;
    when 'run_events.sealed' then
        return query select e.run_id, e.sequence, 0::bigint, e.run_id, e.sealed from run_events e
                     where (e.run_id, e.sequence) > (after_id, after_seq) and e.sealed is not null
                     order by e.run_id, e.sequence limit page_size;
    when 'run_decisions.comment' then
        return query select d.decision_id, 0::bigint, 0::bigint, d.run_id, d.comment
                     from run_decisions d
                     where d.decision_id > after_id and d.comment is not null
                     order by d.decision_id limit page_size;
    when 'run_journal.result' then
        return query select j.run_id, j.suspension_seq::bigint, j.call_index::bigint, j.run_id,
                            j.result
                     from run_journal j
                     where (j.run_id, j.suspension_seq, j.call_index)
                           > (after_id, after_seq::integer, after_index::integer)
                     order by j.run_id, j.suspension_seq, j.call_index limit page_size;
    when 'webhook_endpoints.secret' then
        return query select w.id, 0::bigint, 0::bigint, w.id, w.secret from webhook_endpoints w
                     where w.id > after_id order by w.id limit page_size;
    else
        raise exception 'no sealed column %', sealed_column using errcode = '22023';
    end case;
end
$$;

-- Writes each `news[i]` into the row keyed `(ids[i], seqs[i], indexes[i])` of `sealed_column`
-- whose envelope is still `olds[i]`; the number of rows written.
create function sealed_write(sealed_column text, ids uuid[], seqs bigint[], indexes bigint[],
                             olds bytea[], news bytea[])
returns bigint
language plpgsql volatile
as $$
declare
    written bigint;
begin
    case sealed_column
    when 'runs.state' then
        update runs r set state = v.new from unnest(ids, olds, news) as v(id, old, new)
        where r.id = v.id and r.state = v.old;
    when 'runs.request' then
        update runs r set request = v.new from unnest(ids, olds, news) as v(id, old, new)
        where r.id = v.id and r.request = v.old;
    when 'run_events.sealed' then
        update run_events e set sealed = v.new
        from unnest(ids, seqs, olds, news) as v(id, seq, old, new)
        where e.run_id = v.id and e.sequence = v.seq and e.sealed = v.old;
    when 'run_decisions.comment' then
        update run_decisions d set comment = v.new from unnest(ids, olds, news) as v(id, old, new)
        where d.decision_id = v.id and d.comment = v.old;
    when 'run_journal.result' then
        update run_journal j set result = v.new
        from unnest(ids, seqs, indexes, olds, news) as v(id, seq, idx, old, new)
        where j.run_id = v.id and j.suspension_seq = v.seq and j.call_index = v.idx
          and j.result = v.old;
    when 'webhook_endpoints.secret' then
        update webhook_endpoints w set secret = v.new
        from unnest(ids, olds, news) as v(id, old, new)
        where w.id = v.id and w.secret = v.old;
    else
        raise exception 'no sealed column %', sealed_column using errcode = '22023';
    end case;
    get diagnostics written = row_count;
    return written;
end
$$;
