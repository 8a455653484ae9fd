-- The HTTP surfaces' credentials: API tokens, and the web inbox's sign-in sessions.
--
-- A token authenticates an HTTP caller the way the broker authenticates an AMQP user: it names
-- a producer (`http:<user_name>`), and what that producer may assert — which approver, which
-- acting user — is `producer_grants`, exactly as for a queue producer. Only a SHA-256 of each
-- secret is stored: the secret is shown once, when the token is created, and a leaked table
-- opens nothing. Tokens are revoked, not deleted, so `tokens list` keeps the record of who had
-- one.

create table api_tokens (
    id           uuid primary key,
    -- The user the token signs in as; its producer name is 'http:' || user_name.
    user_name    text not null check (user_name <> '' and user_name = btrim(user_name)
                                      and length(user_name) <= 200),
    -- An operator's note ("ci pipeline", "alice's laptop"); never a secret.
    label        text check (label is null or length(label) <= 200),
    secret_hash  bytea not null unique check (length(secret_hash) = 32),
    created_at   timestamptz not null default now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    -- Updated at most once a minute per token.
    last_used_at timestamptz
);

create index api_tokens_user on api_tokens (user_name);

-- A signed-in browser of the web inbox. The cookie carries a random secret; the row stores its
-- SHA-256. A session signed in with a token ends with it (revoked or expired); one opened for a
-- trusted proxy's user names no token.
create table web_sessions (
    secret_hash bytea primary key check (length(secret_hash) = 32),
    user_name   text not null check (user_name <> '' and user_name = btrim(user_name)),
    -- The producer the session's decisions are gated as: the token's, or the proxy's.
    producer    text not null check (producer <> '' and producer = btrim(producer)),
    token_id    uuid references api_tokens (id) on delete cascade,
    created_at  timestamptz not null default now(),
    expires_at  timestamptz not null
);

create index web_sessions_expiry on web_sessions (expires_at);
