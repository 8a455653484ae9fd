-- Idempotency that tells the truth.
--
-- A run request's `request_id` is the producer's own: two producers choosing the same id name
-- two different requests, and neither may learn the other's run through it. The run row keeps
-- the producer its request came from, and the id is unique per producer.
--
-- Runs created before this migration have no recorded producer (NULL). Their ids stay taken
-- for every producer: a request naming one is matched against the run's own request (agent,
-- acting user, prompt and inputs) and is either that run's duplicate — which only a producer
-- allowed to assert that acting user can send — or refused `idempotency_conflict`. So neither
-- a retry across the upgrade creates a second run nor a foreign id opens someone else's run.
alter table runs add column producer text;

alter table runs drop constraint runs_request_id_key;
create unique index runs_producer_request_idx on runs (producer, request_id);
-- The lookup of a request id among the runs recorded without a producer.
create index runs_legacy_request_idx on runs (request_id) where producer is null;

-- `idempotency_conflict`: a decision id already recorded for another run, card or body. Such a
-- decision is refused and never recorded (its id is the first one's), so no row holds it; it is
-- listed so that the constraint names every outcome a decision can have, as `not_auditable`
-- is.
alter table run_decisions drop constraint run_decisions_outcome_check;
alter table run_decisions add constraint run_decisions_outcome_check check (outcome in
    ('accepted', 'not_awaiting_approval', 'stale_turn', 'access_denied', 'configuration_gone',
     'self_approval_denied', 'approver_not_permitted', 'not_auditable', 'idempotency_conflict'));
