-- The user directory of a deployment that keeps its users here rather than in the system its
-- tools work on (the reference content store keeps its own): who may be a run's acting user,
-- who is an administrator, and whose runs each user may approve. Managed with
-- `countersign users …`; read when the content store is off (COUNTERSIGN_CONTENT_STORE=off).

create table directory_users (
    name        text primary key check (name <> '' and name = btrim(name) and length(name) <= 200),
    -- An administrator may approve every agent's runs, and passes the tools' admin checks.
    admin       boolean not null default false,
    -- A disabled user is unknown to every gate: neither acting user nor approver.
    disabled    boolean not null default false,
    created_at  timestamptz not null default now(),
    updated_at  timestamptz not null default now()
);

-- Whose runs a user who is not an administrator may approve, whoever their acting user:
-- an agent's name, or '*' for every agent.
create table directory_approve_grants (
    name        text not null references directory_users (name) on delete cascade,
    agent       text not null check (agent = '*' or agent ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    created_at  timestamptz not null default now(),
    primary key (name, agent)
);
