-- What each tool from outside (a remote tool server's, an MCP server's) was accepted as: its
-- identity, the digest of its facts (name, effect, argument schema, preview, server), and the
-- facts themselves for an operator to read.
--
-- Every process that lists a server compares what the server lists with the row: the first
-- listing of a tool records it (its server is in the operator's configuration: that is the
-- first acceptance); a listing that differs is withheld from every run, recorded here as the
-- pending change, and announced once (`tool.withheld`, in the outbox, in the same
-- transaction); `countersign tools accept` makes the pending change the accepted one. One row
-- per tool name, so the worker that runs a call and the coordinator that gates it agree.

create table tool_identities (
    tool              text primary key,
    -- `remote:<server>` or `mcp:<server>`.
    server            text not null,
    identity          text not null check (identity ~ '^[0-9a-f]{64}$'),
    facts             jsonb not null check (jsonb_typeof(facts) = 'object'),
    accepted_at       timestamptz not null default now(),
    -- Who accepted it with `countersign tools accept`; null: recorded at its first listing.
    accepted_by       text,
    pending_identity  text check (pending_identity ~ '^[0-9a-f]{64}$'),
    pending_server    text,
    pending_facts     jsonb check (jsonb_typeof(pending_facts) = 'object'),
    pending_since     timestamptz,
    check ((pending_identity is null) = (pending_facts is null)
           and (pending_identity is null) = (pending_since is null)
           and (pending_identity is null) = (pending_server is null)),
    check (pending_identity is distinct from identity)
);
