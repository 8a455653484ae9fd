-- A lease epoch never steps back across a failover.
--
-- A standby promoted after asynchronous replication has lost the primary's last transactions,
-- claims among them: a run's `lease_epoch` there is lower than the one its lost claim sent to a
-- tool server, and a server that fences by the highest epoch it has seen would refuse the
-- run's new calls until enough claims passed it. Every promotion starts a new timeline, so a
-- claim's epoch is at least `(timelines since this migration) * 2^32`: 0 until a promotion
-- (epochs 1, 2, 3 … as before), and past every epoch of the timelines before after each one
-- (no run is claimed 2^32 times).

-- The timeline this server writes WAL on now: the first eight hex digits of the name of the WAL
-- file being written, which changes the moment a standby is promoted (the checkpoint's
-- timeline changes only at the next checkpoint).
create function wal_timeline() returns bigint
language sql volatile
as $$
    select ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

-- The least epoch a claim hands out: 2^32 for every promotion since this migration ran, whose
-- timeline is baked in as the base, so that a database installed on a server that had been
-- promoted before (a managed one, say) still starts at epoch 1.
do $$
begin
    execute format(
        'create function lease_epoch_floor() returns bigint language sql volatile as %L',
        format('select greatest(wal_timeline() - %s, 0) << 32', wal_timeline()));
end
$$;

-- `claim_runs` as in 0019, its epoch `greatest(lease_epoch + 1, lease_epoch_floor())`.
create or replace function claim_runs(asked uuid[], skip_locked boolean, free_limit bigint,
                                      claimer text, ttl_ms float8)
returns table (id uuid, lease_epoch bigint, lease_expires_at timestamptz, segment text,
               agent text, acting_user text, suspension_seq integer, requeue_count integer,
               sent_call integer, request bytea, state bytea, settings agent_settings,
               decision_id uuid, approved boolean, comment bytea,
               decided_secs_ago float8)
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
           extract(epoch from now() - d.created_at)::float8
    from c
    left join agent_settings s on s.name = c.agent
    left join run_decisions d on c.segment = 'resume' and d.run_id = c.id
         and d.suspension_seq = c.suspension_seq and d.outcome = 'accepted';
end
$$;
