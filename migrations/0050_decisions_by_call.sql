-- Decisions call by call, and edits of a call's arguments before approving.
--
-- A decision may decide the turn call by call (`kind` 'calls') or give calls new arguments
-- (`kind` 'edit', which approves nothing: the worker issues the card anew with them). What it
-- says of each call — the verdicts with the words the model reads, the new arguments — is
-- content: it is sealed in `detail`, as the comment is, and rotated with the other sealed
-- columns. The audit keeps the call indexes only.

alter table run_decisions add column kind text not null default 'turn'
    check (kind in ('turn', 'calls', 'edit'));
alter table run_decisions add column detail bytea;
alter table run_decisions add constraint run_decisions_detail_kind
    check ((kind = 'turn') = (detail is null));

-- The outcomes only such decisions have; the list names every outcome a decision can have.
alter table run_decisions drop constraint run_decisions_outcome_check;
alter table run_decisions add constraint run_decisions_outcome_check check (outcome in
    ('accepted', 'not_awaiting_approval', 'stale_turn', 'access_denied', 'configuration_gone',
     'self_approval_denied', 'approver_not_permitted', 'not_auditable', 'idempotency_conflict',
     'calls_not_of_the_card', 'edit_not_of_the_card', 'edit_changes_tool',
     'edit_invalid_arguments', 'editor_approval_denied'));

-- What the decision gates read of the card beside its digest, in clear: the calls that landed
-- under an earlier card of the turn (not to be edited), and who edited the card (who may not
-- approve it alone under four-eyes). Written with the card at each suspension.
alter table runs add column card_landed integer[] not null default '{}';
alter table runs add column card_editors text[] not null default '{}';

-- `claim_runs` as in 0021, also giving a resume the accepted decision's sealed detail and its
-- approver (who made an edit).
drop function claim_runs(uuid[], boolean, bigint, text, float8);
create function claim_runs(asked uuid[], skip_locked boolean, free_limit bigint,
                                      claimer text, ttl_ms float8)
returns table (id uuid, lease_epoch bigint, lease_expires_at timestamptz, segment text,
               agent text, acting_user text, suspension_seq integer, requeue_count integer,
               sent_call integer, request bytea, state bytea, settings agent_settings,
               decision_id uuid, approved boolean, comment bytea,
               decided_secs_ago float8, detail bytea, approver text)
language plpgsql volatile
as $$
#variable_conflict use_column
declare
    ids uuid[] := asked;
    floor bigint := lease_epoch_floor();
begin
    if skip_locked then
        ids := array(select q.id from runs q
                     where (asked is null or q.id = any (asked))
                       and q.status = 'queued' and q.available_at <= now()
                     order by q.available_at limit free_limit
                     for update skip locked);
    end if;
    return query
    with c as (
        update runs r
        set status = 'running', lease_owner = claimer,
            lease_epoch = greatest(r.lease_epoch + 1, floor),
            lease_expires_at = now() + ttl_ms * interval '1 millisecond',
            pending_effect = null, updated_at = now()
        where r.id = any (ids) and r.status = 'queued' and r.available_at <= now()
        returning r.id, r.lease_epoch, r.lease_expires_at, r.segment, r.agent, r.acting_user,
                  r.suspension_seq, r.requeue_count,
                  case when r.segment = 'resume' and r.sent_seq = r.suspension_seq
                       then r.sent_call end as sent_call,
                  case when r.segment = 'start' then r.request end as request,
                  case when r.segment = 'resume' then r.state end as state)
    select c.id, c.lease_epoch, c.lease_expires_at, c.segment, c.agent, c.acting_user,
           c.suspension_seq, c.requeue_count, c.sent_call, c.request, c.state, s,
           d.decision_id, d.approved, d.comment,
           extract(epoch from now() - d.created_at)::float8, d.detail, d.approver
    from c
    left join agent_settings s on s.name = c.agent
    left join run_decisions d on c.segment = 'resume' and d.run_id = c.id
         and d.suspension_seq = c.suspension_seq and d.outcome = 'accepted';
end
$$;

-- The sealed columns as in 0022, with `run_decisions.detail`.
create or replace function sealed_page(sealed_column text, after_id uuid, after_seq bigint,
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
    when 'run_decisions.detail' then
        return query select d.decision_id, 0::bigint, 0::bigint, d.run_id, d.detail
                     from run_decisions d
                     where d.decision_id > after_id and d.detail is not null
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

create or replace function sealed_write(sealed_column text, ids uuid[], seqs bigint[], indexes bigint[],
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
    when 'run_decisions.detail' then
        update run_decisions d set detail = v.new from unnest(ids, olds, news) as v(id, old, new)
        where d.decision_id = v.id and d.detail = v.old;
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
