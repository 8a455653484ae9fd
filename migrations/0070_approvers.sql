-- Approvers as a team: groups of approvers in the directory, who must approve an agent's cards
-- (K distinct approvers from a group, several groups at once), the votes of a card, reminders
-- and escalation to a backup group, and delegation ("alice's cards go to bob from … until …").
--
-- Groups and delegations are kept here whichever directory answers for the users (the content
-- store's or `countersign users`): they name users by name, as grants do. Every change to them
-- is audited in `directory_audit`, with who made it.

create table approver_groups (
    name        text primary key check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    created_at  timestamptz not null default now()
);

create table approver_group_members (
    group_name  text not null references approver_groups (name) on delete cascade,
    member      text not null check (member <> '' and member = btrim(member) and length(member) <= 200),
    created_at  timestamptz not null default now(),
    primary key (group_name, member)
);
create index approver_group_members_member on approver_group_members (member);

-- "delegator's cards go to delegate from starts_at until ends_at" (database clock).
create table approver_delegations (
    id          uuid primary key,
    delegator   text not null check (delegator <> '' and length(delegator) <= 200),
    delegate    text not null check (delegate <> '' and length(delegate) <= 200),
    starts_at   timestamptz not null,
    ends_at     timestamptz not null,
    created_at  timestamptz not null default now(),
    check (delegator <> delegate),
    check (ends_at > starts_at)
);
create index approver_delegations_delegate on approver_delegations (delegate, ends_at);

-- Who changed a group or a delegation, and what: codes and names, never content.
create table directory_audit (
    id          bigint generated always as identity primary key,
    at          timestamptz not null default now(),
    actor       text not null,
    action      text not null check (action in
        ('group_created', 'group_deleted', 'member_added', 'member_removed',
         'delegation_created', 'delegation_removed', 'slack_user_mapped',
         'slack_user_unmapped')),
    subject     jsonb not null
);

-- Which directory user a Slack user is, for deciding from Slack: an explicit mapping an operator
-- keeps, never a channel's membership. A Slack user without a row decides nothing.
create table slack_users (
    team_id         text not null check (team_id ~ '^[A-Z0-9]{1,32}$'),
    slack_user_id   text not null check (slack_user_id ~ '^[A-Z0-9]{1,32}$'),
    directory_user  text not null check (directory_user <> '' and length(directory_user) <= 200),
    created_at      timestamptz not null default now(),
    primary key (team_id, slack_user_id)
);

-- Who must approve an agent's cards, and when to remind and escalate. No row: one approver's
-- decision, as before. `requirements` is a list of {"group", "count"}.
create table agent_approvers (
    agent                   text primary key references agents (name) on delete cascade,
    requirements            jsonb not null default '[]' check (jsonb_typeof(requirements) = 'array'),
    denials_to_end          integer not null default 1 check (denials_to_end >= 1),
    remind_after_seconds    bigint check (remind_after_seconds > 0),
    escalate_after_seconds  bigint check (escalate_after_seconds > 0),
    backup_group            text references approver_groups (name) on delete set null,
    updated_at              timestamptz not null default now(),
    check ((escalate_after_seconds is null) = (backup_group is null))
);

-- The votes of a card: bound to its suspension number and digest, so a new card (a bounce, an
-- edit) starts with none. `groups` are the groups the vote counts for when it was cast (the
-- voter's own and their delegators'); `on_behalf_of` names the delegators.
create table card_votes (
    run_id          uuid not null references runs (id) on delete cascade,
    suspension_seq  integer not null,
    turn_digest     text not null,
    voter           text not null,
    approved        boolean not null,
    approved_calls  integer[],
    groups          text[] not null,
    on_behalf_of    text[] not null default '{}',
    decision_id     uuid not null unique,
    created_at      timestamptz not null default now(),
    primary key (run_id, suspension_seq, voter)
);

-- Reminders and escalations a card had, once each: the reaper's pass writes them by the
-- database clock, so they survive restarts and fire once.
create table card_alerts (
    run_id          uuid not null references runs (id) on delete cascade,
    suspension_seq  integer not null,
    kind            text not null check (kind in ('reminded', 'escalated')),
    backup_group    text,
    created_at      timestamptz not null default now(),
    primary key (run_id, suspension_seq, kind)
);

-- The outcomes of votes, with every outcome a decision could have before.
alter table run_decisions drop constraint run_decisions_outcome_check;
alter table run_decisions add constraint run_decisions_outcome_check check (outcome in
    ('accepted', 'not_awaiting_approval', 'stale_turn', 'access_denied', 'configuration_gone',
     'self_approval_denied', 'approver_not_permitted', 'not_auditable', 'idempotency_conflict',
     'calls_not_of_the_card', 'edit_not_of_the_card', 'edit_changes_tool',
     'edit_invalid_arguments', 'editor_approval_denied',
     'approval_recorded', 'denial_recorded', 'already_voted', 'quorum_calls_differ',
     'not_in_approver_groups'));
