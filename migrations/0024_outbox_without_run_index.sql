-- The outbox holds only what is still to be sent (0023), a few rows at any moment, and nothing
-- on a hot path looks its rows up by run: the relay and the reaper read the unpublished index,
-- a relay deletes by id, and a run's history is its audit trail (`run_events`). The index by run
-- cost every announcement an index entry, and a vacuum its cleanup, for no reader.

drop index if exists event_outbox_run_idx;
