-- The call of a turn whose external effect has been sent and whose result is not journaled yet:
-- the suspension whose turn it belongs to, and its index. Set with the `pending_effect` stamp,
-- before the call is sent; cleared with the call's journal row. Unlike the stamp it survives a
-- requeue (by the reaper, or by a segment interrupted by the call's transport failure): the
-- segment that retries the turn must know that this call may already have landed, and send it
-- again under its idempotency key rather than compare a preview that could read its own write.
alter table runs
    add column sent_seq  integer,
    add column sent_call integer,
    add constraint runs_sent_call check (
        (sent_seq is null) = (sent_call is null) and (sent_call is null or sent_call >= 0));
