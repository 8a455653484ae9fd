-- A relay now deletes an outbox row once the broker confirmed it, instead of setting
-- `published_at`: an UPDATE of a column the unpublished index names wrote a new copy of the row,
-- its body and index entries included, for a row nobody reads again. The outbox holds what is
-- still to be sent; the audit trail (`run_events`) is the record of what happened.
--
-- The column stays: a relay of the previous version, still running while a release rolls out,
-- marks rows it sent, and the reaper deletes marked rows after `--outbox-retention-hours`.

comment on column event_outbox.published_at is
    'Set only by relays before migration 0023, which kept a row they sent; relays now delete it.';
