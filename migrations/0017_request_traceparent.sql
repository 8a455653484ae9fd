-- The W3C trace context of the span that created a run (its run request's gates), so that the
-- trace of the decision that releases the run, which usually starts elsewhere (an approver's
-- browser, another producer), can be linked to the request's. Ids and flags only: version,
-- trace id, span id, flags; never a `tracestate`, which may carry a vendor's data. NULL when
-- the creating process exported no traces.
ALTER TABLE runs ADD COLUMN request_traceparent text
    CONSTRAINT runs_request_traceparent_format
    CHECK (request_traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
