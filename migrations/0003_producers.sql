-- Which broker (AMQP) users may assert which identities in the public messages.
--
-- The broker validates a message's `user_id` property against the connection's user, so that
-- user is authenticated; the identities named INSIDE the body (a decision's `approver`, a run
-- request's `acting_user`) are only claims. A producer may assert an identity only when a row
-- here grants it: `name` is a user name, or '*' for any user of that kind. Without this, any
-- producer able to publish could approve as an administrator or run agents as one.

create table producer_grants (
    amqp_user  text not null check (amqp_user <> '' and amqp_user = btrim(amqp_user)),
    kind       text not null check (kind in ('approver', 'acting_user')),
    -- A user name, or '*' for any user.
    name       text not null check (name <> '' and name = btrim(name)),
    created_at timestamptz not null default now(),
    primary key (amqp_user, kind, name)
);
