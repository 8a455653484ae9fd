-- Whether an AMQP (or HTTP, `http:<user>`) producer may assert `name` in the role `kind`: a
-- grant of that kind for the name, or for every name ('*'). The one statement of the rule,
-- for every gate that reads it together with its other facts.
create function producer_may_assert(producer text, grant_kind text, asserted text)
returns boolean
language sql stable
as $$
    select exists (
        select 1 from producer_grants
        where amqp_user = producer and kind = grant_kind and (name = asserted or name = '*')
    )
$$;
