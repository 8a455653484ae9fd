-- A relay claims outbox rows with a short lease instead of holding row locks in a transaction
-- while it publishes: one UPDATE claims a batch, one UPDATE marks what the broker confirmed.
-- A relay that dies leaves its claim to run out; the rows are then claimable again, so an
-- event may be published twice (consumers deduplicate by event_id) but never lost.
alter table event_outbox add column claimed_until timestamptz;
