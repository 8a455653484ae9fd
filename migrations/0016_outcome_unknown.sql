-- A run can end `outcome_unknown`: a write it sent outside the store may have landed, and
-- neither its answer nor the resource, asked about the call's idempotency key, can say. The run
-- row's invariants are those of 0013 with that one reason more; `sent_seq` and `sent_call` stay
-- on such a run, naming the call in doubt.
create or replace function runs_lifecycle(r runs) returns boolean
    language plpgsql immutable
as $$
declare
    broken text := case
        when not (r.status in ('queued', 'running', 'waiting_for_approval', 'completed', 'failed',
                               'cancelled'))
            then 'runs_status_check'
        when not (r.segment in ('start', 'resume'))
            then 'runs_segment_check'
        when not (r.suspension_seq >= 1)
            then 'runs_suspension_seq_check'
        when not (r.turn_digest ~ '^[0-9a-f]{64}$')
            then 'runs_turn_digest_check'
        when not (r.lease_epoch >= 0)
            then 'runs_lease_epoch_check'
        when not (r.pending_effect in ('idempotent_write', 'non_idempotent_write'))
            then 'runs_pending_effect_check'
        when not (r.requeue_count >= 0)
            then 'runs_requeue_count_check'
        when not (r.termination_reason in
                      ('completed', 'max_iterations', 'approval_denied', 'approval_expired',
                       'provider_failed', 'state_unreadable', 'retries_exhausted',
                       'not_retryable', 'suspend_failed', 'cancelled', 'outcome_unknown'))
            then 'runs_termination_reason_check'
        -- A stable code (`provider_timeout`), never a message.
        when not (r.error_code ~ '^[a-z][a-z0-9_.]{0,63}$')
            then 'runs_error_code_check'
        when not (r.iterations >= 0)
            then 'runs_iterations_check'
        when not (r.prompt_tokens >= 0)
            then 'runs_prompt_tokens_check'
        when not (r.completion_tokens >= 0)
            then 'runs_completion_tokens_check'
        -- Only a running run holds a lease, and a lease is owner and expiry together.
        when not ((r.status = 'running') = (r.lease_owner is not null)
                  and (r.lease_owner is null) = (r.lease_expires_at is null))
            then 'runs_lease_iff_running'
        when not ((r.status in ('completed', 'failed', 'cancelled')) = (r.termination_reason is not null))
            then 'runs_reason_iff_terminal'
        -- A suspended run, and every resume segment, has a state to resume from.
        when not (r.status <> 'waiting_for_approval'
                  or (r.state is not null and r.suspension_seq is not null
                      and r.turn_digest is not null and r.approval_deadline is not null))
            then 'runs_waiting_has_state'
        when not (r.segment <> 'resume' or r.status in ('completed', 'failed', 'cancelled')
                  or (r.state is not null and r.suspension_seq is not null))
            then 'runs_resume_has_state'
        when not ((r.sent_seq is null) = (r.sent_call is null)
                  and (r.sent_call is null or r.sent_call >= 0))
            then 'runs_sent_call'
    end;
begin
    if broken is not null then
        raise check_violation
            using message = format('new row for relation "runs" violates check constraint "%s"', broken),
                  table = 'runs',
                  constraint = broken;
    end if;
    return true;
end
$$;
