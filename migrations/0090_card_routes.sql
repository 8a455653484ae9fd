-- Who must approve one card beyond its agent's quorum, as a policy's `ask` rule routed it
-- (`@approvers("legal:2")`): one row per routing policy, read as the union (each group at its
-- largest count) over the agent's own requirements. Keyed by the card, so a new card (a
-- bounce, an edit) is routed afresh by the policies that look at it.
create table card_routes (
    run_id          uuid not null references runs (id) on delete cascade,
    suspension_seq  integer not null check (suspension_seq >= 1),
    policy          text not null,
    requirements    jsonb not null check (jsonb_typeof(requirements) = 'array'
                                          and jsonb_array_length(requirements) > 0),
    routed_at       timestamptz not null default now(),
    primary key (run_id, suspension_seq, policy)
);
