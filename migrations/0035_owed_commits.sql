-- The commits an approved turn owes. A turn passes its commit point when its transaction
-- commits: the store's own writes, their journal rows and audit events — and, for every change a
-- two-phase tool server holds for the turn, one row here, in the same commit. From then on the
-- turn is decided: each held change is committed at its server by its idempotency key, and the
-- row goes with the call's journal row. A segment that dies in between leaves the rows, and the
-- next attempt of the turn commits what they name before anything else, comparing nothing.
create table run_owed_commits (
    run_id         uuid not null references runs (id) on delete cascade,
    suspension_seq integer not null check (suspension_seq >= 1),
    call_index     integer not null check (call_index >= 0),
    created_at     timestamptz not null default now(),
    primary key (run_id, suspension_seq, call_index)
);
