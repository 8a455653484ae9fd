-- Policies: what each loaded policy made of each card it saw.
--
-- One row per card (run, suspension number) and policy. A card is evaluated once: the first
-- coordinator to record its `policy_cards` row evaluates it, any other passes. An enforced
-- approval or denial names the decision it made (`decision_id`), which went through the same
-- gates, record and audit as a person's; a shadowed one, or an `ask`, names none. The facts
-- themselves are not stored (they carry content): their digest is.
--
-- `policy_cards` also keeps, sealed (purpose `event`, bound to the run), the facts a policy saw
-- or would have seen of each card, whether or not a policy was loaded: `countersign policies
-- replay` evaluates a policy file against them and the decisions people made on the same cards.
create table policy_cards (
    run_id         uuid not null references runs (id) on delete cascade,
    suspension_seq integer not null check (suspension_seq >= 1),
    facts          bytea not null,
    evaluated_at   timestamptz not null default now(),
    primary key (run_id, suspension_seq)
);

create table policy_evaluations (
    run_id         uuid not null references runs (id) on delete cascade,
    suspension_seq integer not null check (suspension_seq >= 1),
    policy_id      text not null check (policy_id ~ '^[A-Za-z0-9_-]{1,128}$'),
    policy_version integer not null check (policy_version >= 0),
    mode           text not null check (mode in ('enforce', 'shadow')),
    outcome        text not null check (outcome in ('approve', 'deny', 'ask')),
    -- Why it asked: a code, never a message.
    reason         text check (reason ~ '^[a-z][a-z0-9_]{0,63}$'),
    rule           integer check (rule >= 1),
    facts_digest   text not null check (facts_digest ~ '^[0-9a-f]{64}$'),
    turn_digest    text not null check (turn_digest ~ '^[0-9a-f]{64}$'),
    decision_id    uuid,
    evaluated_at   timestamptz not null default now(),
    primary key (run_id, suspension_seq, policy_id),
    foreign key (run_id, suspension_seq) references policy_cards (run_id, suspension_seq)
        on delete cascade
);

create index policy_evaluations_by_time on policy_evaluations (evaluated_at);

-- The cards waiting for a policy: runs waiting for approval whose current card no policy has
-- evaluated yet. Partial on the status, as the reaper's index on waiting runs.
create index runs_waiting_by_suspension on runs (id, suspension_seq)
    where status = 'waiting_for_approval';

create index policy_cards_by_time on policy_cards (evaluated_at);

-- Standing grants: "approve the same tool on the same subject by this agent for N hours",
-- given by a person from a card. Each is a generated policy (`source`, Cedar, loaded as
-- `grant-<id>` version 1) that the coordinator evaluates while it is neither expired (database
-- clock) nor revoked. Never given for a call that removes anything or whose data class is above
-- `editor_content` (checked when it is given, and again by the generated rule itself).
create table policy_grants (
    id          uuid primary key,
    run_id      uuid not null references runs (id) on delete cascade,
    agent       text not null,
    tool        text not null,
    source      text not null,
    granted_by  text not null,
    granted_at  timestamptz not null default now(),
    expires_at  timestamptz not null,
    revoked_at  timestamptz,
    revoked_by  text,
    check (expires_at > granted_at),
    check ((revoked_at is null) = (revoked_by is null))
);

create index policy_grants_active on policy_grants (agent, expires_at) where revoked_at is null;
