-- Runs, their audit trail, decisions, the execution journal and agent configurations.
--
-- Every status change is one conditional UPDATE on `runs`; the CHECK constraints below make
-- the invariants of the lifecycle hold even for a statement written by hand. Nothing here
-- holds content or an error message in clear: prompts, states, tool results, event content
-- and comments are sealed envelopes (bytea), and errors are stable codes.

create table agents (
    name                      text primary key check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    active                    boolean not null default true,
    -- Provider, model and options. Names environment variables for secrets; never a secret.
    model                     jsonb not null default '{}'::jsonb check (jsonb_typeof(model) = 'object'),
    allowed_groups            text[] not null default '{}',
    allowed_tools             text[] not null default '{}',
    enabled_tools             text[] not null default '{}',
    max_iterations            integer not null default 10 check (max_iterations between 1 and 1000),
    four_eyes                 boolean not null default false,
    approval_deadline_seconds bigint not null default 604800 check (approval_deadline_seconds > 0),
    created_at                timestamptz not null default now(),
    updated_at                timestamptz not null default now()
);

create table runs (
    id                 uuid primary key,
    request_id         uuid not null unique,
    -- Plain text, no foreign key: a configuration may be deleted while its runs are kept.
    agent              text not null,
    acting_user        text not null,
    status             text not null check (status in
                           ('queued', 'running', 'waiting_for_approval', 'completed', 'failed', 'cancelled')),
    segment            text not null default 'start' check (segment in ('start', 'resume')),
    -- The current (or last) suspension and the digest of its pending calls.
    suspension_seq     integer check (suspension_seq >= 1),
    turn_digest        text check (turn_digest ~ '^[0-9a-f]{64}$'),
    -- Tool names of the pending calls, in clear so gates need not decrypt the state.
    pending_tools      text[] not null default '{}',
    state              bytea,
    request            bytea not null,
    lease_owner        text,
    lease_epoch        bigint not null default 0 check (lease_epoch >= 0),
    lease_expires_at   timestamptz,
    pending_effect     text check (pending_effect in ('idempotent_write', 'non_idempotent_write')),
    requeue_count      integer not null default 0 check (requeue_count >= 0),
    available_at       timestamptz not null default now(),
    dispatched_at      timestamptz,
    approval_deadline  timestamptz,
    termination_reason text check (termination_reason in
                           ('completed', 'max_iterations', 'approval_denied', 'approval_expired',
                            'provider_failed', 'state_unreadable', 'retries_exhausted',
                            'not_retryable', 'suspend_failed', 'cancelled')),
    -- A stable code (`provider_timeout`), never a message: messages carry content and secrets.
    error_code         text check (error_code ~ '^[a-z][a-z0-9_.]{0,63}$'),
    iterations         integer not null default 0 check (iterations >= 0),
    prompt_tokens      bigint not null default 0 check (prompt_tokens >= 0),
    completion_tokens  bigint not null default 0 check (completion_tokens >= 0),
    created_at         timestamptz not null default now(),
    updated_at         timestamptz not null default now(),

    -- Only a running run holds a lease, and a lease is owner and expiry together.
    constraint runs_lease_iff_running check (
        (status = 'running') = (lease_owner is not null)
        and (lease_owner is null) = (lease_expires_at is null)),
    constraint runs_reason_iff_terminal check (
        (status in ('completed', 'failed', 'cancelled')) = (termination_reason is not null)),
    -- A suspended run, and every resume segment, has a state to resume from.
    constraint runs_waiting_has_state check (
        status <> 'waiting_for_approval'
        or (state is not null and suspension_seq is not null and turn_digest is not null
            and approval_deadline is not null)),
    constraint runs_resume_has_state check (
        segment <> 'resume' or status in ('completed', 'failed', 'cancelled')
        or (state is not null and suspension_seq is not null))
);

-- The reaper's expired-lease scan.
create index runs_running_lease_idx on runs (lease_expires_at) where status = 'running';
-- The claim of the next available run and the reaper's lost-dispatch scan.
create index runs_queued_available_idx on runs (available_at) where status = 'queued';
-- The inbox (soonest deadline first) and the reaper's approval-deadline scan.
create index runs_waiting_deadline_idx on runs (approval_deadline) where status = 'waiting_for_approval';

create table run_events (
    run_id      uuid not null references runs (id) on delete cascade,
    -- 1, 2, … per run, without gaps: appenders serialise on the run row.
    sequence    bigint not null check (sequence >= 1),
    kind        text not null check (kind ~ '^[a-z][a-z0-9_.]{0,63}$'),
    round       integer check (round >= 0),
    duration_ms bigint check (duration_ms >= 0),
    -- Ids, codes and counts only; content goes to `sealed`.
    payload     jsonb not null default '{}'::jsonb check (jsonb_typeof(payload) = 'object'),
    sealed      bytea,
    created_at  timestamptz not null default now(),
    primary key (run_id, sequence)
);

create table run_decisions (
    decision_id    uuid primary key,
    -- No foreign key: a refused decision may name a run that does not exist.
    run_id         uuid not null,
    suspension_seq integer not null check (suspension_seq >= 1),
    turn_digest    text not null check (turn_digest ~ '^[0-9a-f]{64}$'),
    approved       boolean not null,
    approver       text not null,
    comment        bytea,
    outcome        text not null check (outcome in
                       ('accepted', 'not_awaiting_approval', 'stale_turn', 'access_denied',
                        'configuration_gone', 'self_approval_denied', 'approver_not_permitted',
                        'not_auditable')),
    created_at     timestamptz not null default now()
);

create index run_decisions_run_idx on run_decisions (run_id, created_at);
-- At most one decision releases a turn; a resume segment looks it up by this key.
create unique index run_decisions_accepted_idx on run_decisions (run_id, suspension_seq)
    where outcome = 'accepted';

-- What a resume segment already executed: a retried segment reuses these results instead of
-- executing a call twice.
create table run_journal (
    run_id         uuid not null references runs (id) on delete cascade,
    suspension_seq integer not null check (suspension_seq >= 1),
    call_index     integer not null check (call_index >= 0),
    tool           text not null,
    effect         text not null check (effect in ('read_only', 'idempotent_write', 'non_idempotent_write')),
    result         bytea not null,
    lease_epoch    bigint not null check (lease_epoch >= 0),
    created_at     timestamptz not null default now(),
    primary key (run_id, suspension_seq, call_index)
);
