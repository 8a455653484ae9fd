-- Statements the store needs in several places, written once here.
--
-- `agent_settings`: an agent configuration as the store reads it, its columns in the order of
-- the one Rust type that decodes the row (a view's row type keeps that order whatever columns
-- `agents` gains). Every statement that reads a configuration, alone or joined to a run,
-- selects this row whole.
create view agent_settings as
select name, active, model, allowed_groups, allowed_tools, enabled_tools, max_iterations,
       max_tool_calls_per_turn, four_eyes, approval_deadline_seconds, created_at, updated_at
from agents;

-- `claim_runs`: `queued` → `running` for the runs asked, by one UPDATE that sets the owner,
-- `lease_epoch + 1` and `lease_expires_at = now() + ttl`, only for a run still queued and
-- available by the database clock; with each won run, what its segment starts from: the
-- sealed request (a start) or state (a resume), the call an earlier attempt sent and did not
-- journal, the agent's configuration as it is now, and the accepted decision a resume
-- continues.
--
-- `asked` names the runs (NULL: any available run, those available longest first, at most
-- `free_limit`). With `skip_locked` a row another transaction holds is skipped rather than
-- waited for, so one busy row never holds up a batch and two batches never wait on each
-- other; without it the UPDATE waits for the row and then decides, so a run claimed alone
-- is either won or truly lost.
create function claim_runs(asked uuid[], skip_locked boolean, free_limit bigint,
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
        set status = 'running', lease_owner = claimer, lease_epoch = r.lease_epoch + 1,
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
