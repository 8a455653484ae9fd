-- Proves the existing rows against `runs_lifecycle` (0013). In a transaction of its own, this
-- scan holds a lock that lets the services go on writing runs while it reads them.
alter table runs validate constraint runs_lifecycle;
