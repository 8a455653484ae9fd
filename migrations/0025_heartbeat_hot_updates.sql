-- A heartbeat renews every lease a worker holds each third of its time to live, and a renewal
-- changes only `lease_expires_at`. With that column indexed (runs_running_lease_idx) no renewal
-- could be a heap-only (HOT) update: each wrote a new index entry and left a dead one for vacuum,
-- on the hottest rows of the database. The running runs are few — the workers' slots, not the
-- history — so the reaper's expired-lease scan reads them all from an index on `id` that holds
-- only running runs, and compares their expiry there. That index changes when a run starts or
-- stops running (a status change, never HOT anyway), not at each renewal.
--
-- A HOT update also needs room on the row's page: the table keeps a fifth of each page free for
-- the renewals of the rows on it (new pages only; `VACUUM FULL` or a rewrite applies it to the
-- old ones). docs/operations.md says what autovacuum settings this table needs.

create index if not exists runs_running_idx on runs (id) where status = 'running';
drop index if exists runs_running_lease_idx;
alter table runs set (fillfactor = 80);
